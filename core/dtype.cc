#include "core/dtype.h"

namespace loom {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kBool: return 1;
  }
  LOOM_CHECK(false, "unknown dtype ", static_cast<int>(dtype));
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kBool: return "bool";
  }
  return "?";
}

StatusOr<DType> ParseDType(const std::string& name) {
  for (DType d : {DType::kF32, DType::kF64, DType::kI32, DType::kI64, DType::kBF16, DType::kF16, DType::kBool}) {
    if (name == DTypeName(d)) return d;
  }
  return InvalidArgument("unknown dtype '", name, "' (expected f32, f64, i32, i64, bf16, f16 or bool)");
}

}  // namespace loom
