// Element types. Float kernels exist for f32 (training) and f64 (gradient
// checks); bf16/f16 convert exactly (core/half.h) and the Cast op moves
// between them, the first pieces of mixed precision (docs/mixed_precision.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace loom {

enum class DType : int { kF32 = 0, kF64 = 1, kI32 = 2, kI64 = 3, kBF16 = 4, kF16 = 5, kBool = 6 };

size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);
StatusOr<DType> ParseDType(const std::string& name);
inline bool IsFloating(DType d) { return d == DType::kF32 || d == DType::kF64 || d == DType::kBF16 || d == DType::kF16; }
inline bool IsInteger(DType d) { return d == DType::kI32 || d == DType::kI64; }

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kF32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kF64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kI64; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::kBool; };

}  // namespace loom
