#include "core/tensor.h"

#include <map>
#include <mutex>
#include <sstream>

#include "core/half.h"

namespace loom {

Buffer::Buffer(Allocator* allocator, size_t bytes)
    : allocator_(allocator), data_(allocator->Allocate(bytes)), bytes_(bytes) {}

Buffer::~Buffer() { allocator_->Deallocate(data_, bytes_); }

StatusOr<Tensor> Tensor::Empty(const Shape& shape, DType dtype, Device device) {
  LOOM_ASSIGN_OR_RETURN(Allocator * allocator, GetAllocator(device));
  return Empty(shape, dtype, allocator);
}

StatusOr<Tensor> Tensor::Empty(const Shape& shape, DType dtype, Allocator* allocator) {
  for (int64_t d : shape.dims())
    if (d < 0) return InvalidArgument("negative extent in shape ", shape.ToString());
  size_t bytes = static_cast<size_t>(shape.numel()) * DTypeSize(dtype);
  auto buffer = std::make_shared<Buffer>(allocator, bytes);
  if (!buffer->data())
    return ResourceExhausted("out of memory on ", allocator->device().ToString(), " allocating ", bytes, " bytes for ",
                             shape.ToString(), " ", DTypeName(dtype));
  return View(std::move(buffer), 0, shape, dtype);
}

Tensor Tensor::Zeros(const Shape& shape, DType dtype) {
  StatusOr<Tensor> t = Empty(shape, dtype);
  LOOM_CHECK_OK(t.status());
  std::memset(t->raw_data(), 0, t->nbytes());
  return *t;
}

Tensor Tensor::View(std::shared_ptr<Buffer> buffer, size_t bytes_offset, const Shape& shape, DType dtype) {
  Tensor t;
  LOOM_CHECK(bytes_offset + static_cast<size_t>(shape.numel()) * DTypeSize(dtype) <= buffer->bytes(),
             "view past the end of its buffer");
  t.buffer_ = std::move(buffer);
  t.offset_ = bytes_offset;
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

StatusOr<Tensor> Tensor::Reshape(const Shape& shape) const {
  if (shape.numel() != numel())
    return InvalidArgument("cannot reshape ", shape_.ToString(), " (", numel(), " elements) to ", shape.ToString(), " (",
                           shape.numel(), " elements)");
  return View(buffer_, offset_, shape, dtype_);
}

namespace {
std::mutex& copy_mu() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::map<DeviceType, DeviceCopyFn>& copy_fns() {
  static auto* fns = new std::map<DeviceType, DeviceCopyFn>;
  return *fns;
}
}  // namespace

void RegisterDeviceCopy(DeviceType type, DeviceCopyFn fn) {
  std::lock_guard<std::mutex> lock(copy_mu());
  copy_fns()[type] = std::move(fn);
}

namespace {
std::map<DeviceType, DeviceSyncFn>& sync_fns() {
  static auto* fns = new std::map<DeviceType, DeviceSyncFn>;
  return *fns;
}
}  // namespace

void RegisterDeviceSync(DeviceType type, DeviceSyncFn fn) {
  std::lock_guard<std::mutex> lock(copy_mu());
  sync_fns()[type] = std::move(fn);
}

Status WaitForDevice(Device device) {
  if (device.is_cpu()) return Status::Ok();
  DeviceSyncFn fn;
  {
    std::lock_guard<std::mutex> lock(copy_mu());
    auto it = sync_fns().find(device.type);
    if (it == sync_fns().end()) return FailedPrecondition("no backend for ", device.ToString(), " in this build");
    fn = it->second;
  }
  return fn(device.index);
}

Status Tensor::CopyFrom(const Tensor& src) {
  if (src.shape() != shape_ || src.dtype() != dtype_)
    return InvalidArgument("copy from ", src.shape().ToString(), " ", DTypeName(src.dtype()), " into ",
                           shape_.ToString(), " ", DTypeName(dtype_));
  if (nbytes() == 0) return Status::Ok();
  if (device().is_cpu() && src.device().is_cpu()) {
    std::memmove(raw_data(), src.raw_data(), nbytes());
    return Status::Ok();
  }
  DeviceType backend = device().is_cpu() ? src.device().type : device().type;
  DeviceCopyFn fn;
  {
    std::lock_guard<std::mutex> lock(copy_mu());
    auto it = copy_fns().find(backend);
    if (it == copy_fns().end())
      return FailedPrecondition("no copy path between ", src.device().ToString(), " and ", device().ToString());
    fn = it->second;
  }
  return fn(raw_data(), device(), src.raw_data(), src.device(), nbytes());
}

StatusOr<Tensor> Tensor::Row(int64_t i) const {
  if (shape_.rank() == 0) return InvalidArgument("a scalar has no rows");
  const int64_t rows = shape_[0];
  if (i < 0 || i >= rows) return OutOfRange("row ", i, " of a tensor ", shape_.ToString(), " (", rows, " rows)");
  const Shape row(std::vector<int64_t>(shape_.dims().begin() + 1, shape_.dims().end()));
  const size_t row_bytes = static_cast<size_t>(row.numel()) * DTypeSize(dtype_);
  return View(buffer_, offset_ + static_cast<size_t>(i) * row_bytes, row, dtype_);
}

StatusOr<Tensor> Tensor::GatherRows(const std::vector<int64_t>& rows) const {
  std::vector<Tensor> parts;
  for (int64_t r : rows) {
    LOOM_ASSIGN_OR_RETURN(Tensor row, Row(r));
    parts.push_back(std::move(row));
  }
  if (parts.empty()) {
    if (shape_.rank() == 0) return InvalidArgument("a scalar has no rows");
    std::vector<int64_t> dims = shape_.dims();
    dims[0] = 0;
    return Empty(Shape(dims), dtype_, device());
  }
  return Stack(parts, device());
}

StatusOr<Tensor> Tensor::Stack(const std::vector<Tensor>& parts, Device device) {
  if (parts.empty()) return InvalidArgument("Stack needs at least one tensor");
  const Tensor& first = parts[0];
  std::vector<int64_t> dims = first.shape().dims();
  dims.insert(dims.begin(), static_cast<int64_t>(parts.size()));
  LOOM_ASSIGN_OR_RETURN(Tensor out, Empty(Shape(dims), first.dtype(), device));
  for (size_t k = 0; k < parts.size(); ++k) {
    if (parts[k].shape() != first.shape() || parts[k].dtype() != first.dtype())
      return InvalidArgument("Stack: tensor ", k, " is ", parts[k].shape().ToString(), " ", DTypeName(parts[k].dtype()),
                             ", tensor 0 is ", first.shape().ToString(), " ", DTypeName(first.dtype()));
    LOOM_ASSIGN_OR_RETURN(Tensor row, out.Row(static_cast<int64_t>(k)));
    LOOM_RETURN_IF_ERROR(row.CopyFrom(parts[k]));
  }
  return out;
}

StatusOr<Tensor> Tensor::To(Device device) const {
  LOOM_ASSIGN_OR_RETURN(Tensor out, Empty(shape_, dtype_, device));
  LOOM_RETURN_IF_ERROR(out.CopyFrom(*this));
  return out;
}

namespace {
template <typename T>
double Load(const void* p, int64_t i) { return static_cast<double>(static_cast<const T*>(p)[i]); }
template <typename T>
void Store(void* p, int64_t i, double v) { static_cast<T*>(p)[i] = static_cast<T>(v); }
}  // namespace

double Tensor::ScalarAt(int64_t i) const {
  LOOM_CHECK(device().is_cpu(), "ScalarAt on ", device().ToString());
  LOOM_CHECK(i >= 0 && i < numel(), "index ", i, " out of ", numel());
  switch (dtype_) {
    case DType::kF32: return Load<float>(raw_data(), i);
    case DType::kF64: return Load<double>(raw_data(), i);
    case DType::kI32: return Load<int32_t>(raw_data(), i);
    case DType::kI64: return Load<int64_t>(raw_data(), i);
    case DType::kBool: return Load<bool>(raw_data(), i);
    default: LOOM_CHECK(false, "ScalarAt not supported for ", DTypeName(dtype_));
  }
  return 0;
}

void Tensor::Fill(double value) {
  LOOM_CHECK(device().is_cpu(), "Fill on ", device().ToString());
  int64_t n = numel();
  void* p = raw_data();
  switch (dtype_) {
    case DType::kF32: for (int64_t i = 0; i < n; ++i) Store<float>(p, i, value); break;
    case DType::kF64: for (int64_t i = 0; i < n; ++i) Store<double>(p, i, value); break;
    case DType::kI32: for (int64_t i = 0; i < n; ++i) Store<int32_t>(p, i, value); break;
    case DType::kI64: for (int64_t i = 0; i < n; ++i) Store<int64_t>(p, i, value); break;
    case DType::kBool: for (int64_t i = 0; i < n; ++i) Store<bool>(p, i, value); break;
    default: LOOM_CHECK(false, "Fill not supported for ", DTypeName(dtype_));
  }
}

std::vector<double> Tensor::ToDoubleVector() const {
  std::vector<double> out(numel());
  for (int64_t i = 0; i < numel(); ++i) out[i] = ScalarAt(i);
  return out;
}

StatusOr<Tensor> Tensor::Cast(DType dtype) const {
  if (!device().is_cpu()) return Unimplemented("Cast runs on the host only");
  Tensor out = Zeros(shape_, dtype);
  // bf16 / f16 on either side go through core/half.h (rounding once, to nearest even).
  for (int64_t i = 0; i < numel(); ++i) {
    double v;
    if (dtype_ == DType::kBF16) v = ToFloat(data<BFloat16>()[i]);
    else if (dtype_ == DType::kF16) v = ToFloat(data<Float16>()[i]);
    else v = ScalarAt(i);
    switch (dtype) {
      case DType::kF32: Store<float>(out.raw_data(), i, v); break;
      case DType::kF64: Store<double>(out.raw_data(), i, v); break;
      case DType::kI32: Store<int32_t>(out.raw_data(), i, v); break;
      case DType::kI64: Store<int64_t>(out.raw_data(), i, v); break;
      case DType::kBF16: out.data<BFloat16>()[i] = ToBFloat16(v); break;
      case DType::kF16: out.data<Float16>()[i] = ToFloat16(v); break;
      default: Store<bool>(out.raw_data(), i, v); break;
    }
  }
  return out;
}

std::string Tensor::DebugString(int max_elements) const {
  std::ostringstream os;
  os << "Tensor(" << shape_.ToString() << ", " << DTypeName(dtype_) << ", " << device().ToString();
  if (defined() && device().is_cpu() && dtype_ != DType::kBF16 && dtype_ != DType::kF16) {
    os << ", [";
    for (int64_t i = 0; i < numel() && i < max_elements; ++i) os << (i ? ", " : "") << ScalarAt(i);
    if (numel() > max_elements) os << ", ...";
    os << "]";
  }
  os << ")";
  return os.str();
}

}  // namespace loom
