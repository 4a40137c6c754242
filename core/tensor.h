// Tensor: a typed, shaped view into a reference-counted device buffer.
// Views (reshape, arena slices of the memory plan) share the buffer.
#pragma once

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/shape.h"

namespace loom {

// One allocation on one device; frees itself through its allocator.
class Buffer {
 public:
  Buffer(Allocator* allocator, size_t bytes);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return allocator_->device(); }

 private:
  Allocator* allocator_;
  void* data_;
  size_t bytes_;
};

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised storage. Fails only when the device is unknown or full.
  static StatusOr<Tensor> Empty(const Shape& shape, DType dtype, Device device = Device::Cpu());
  // The same from a given allocator (which must outlive the tensor), e.g. a
  // task-runtime device's caching one.
  static StatusOr<Tensor> Empty(const Shape& shape, DType dtype, Allocator* allocator);
  // Host convenience: aborts on allocation failure (tests, small tensors).
  static Tensor Zeros(const Shape& shape, DType dtype = DType::kF32);
  template <typename T>
  static Tensor FromVector(const Shape& shape, const std::vector<T>& values);
  // A view of `bytes_offset` into an existing buffer (used by the memory plan).
  static Tensor View(std::shared_ptr<Buffer> buffer, size_t bytes_offset, const Shape& shape, DType dtype);

  bool defined() const { return buffer_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return buffer_ ? buffer_->device() : Device::Cpu(); }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }
  size_t offset() const { return offset_; }

  void* raw_data() const { return static_cast<char*>(buffer_->data()) + offset_; }
  template <typename T>
  T* data() const {
    LOOM_CHECK(defined(), "data() of an undefined tensor");
    LOOM_CHECK(DTypeOf<T>::value == dtype_, "tensor is ", DTypeName(dtype_), ", asked for ", DTypeName(DTypeOf<T>::value));
    return static_cast<T*>(raw_data());
  }

  // Same storage, new shape with the same element count.
  StatusOr<Tensor> Reshape(const Shape& shape) const;
  // A copy on `device` (host<->device through the backend's copy function).
  StatusOr<Tensor> To(Device device) const;
  // Rows of a tensor [n, ...]: the arrays of fused replicas, a batch's
  // examples. They work on any device (copies go through CopyFrom).
  // Row i as a view [...] sharing this tensor's buffer.
  StatusOr<Tensor> Row(int64_t i) const;
  // A new tensor [rows.size(), ...] on this tensor's device: row k is row rows[k].
  StatusOr<Tensor> GatherRows(const std::vector<int64_t>& rows) const;
  // [parts.size(), ...] on `device` from tensors of one shape and dtype.
  static StatusOr<Tensor> Stack(const std::vector<Tensor>& parts, Device device = Device::Cpu());
  // Copies `src` (same shape and dtype, any device pair with a copy path) into this.
  Status CopyFrom(const Tensor& src);
  // Host copy with a new element type (f32, f64, i32, i64, bf16, f16; the
  // half types round to nearest even, core/half.h).
  StatusOr<Tensor> Cast(DType dtype) const;
  void Fill(double value);  // host only
  double ScalarAt(int64_t flat_index) const;  // host only, any numeric dtype, for tests and logs
  std::vector<double> ToDoubleVector() const;  // host only
  std::string DebugString(int max_elements = 8) const;

 private:
  std::shared_ptr<Buffer> buffer_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
};

// A backend's memcpy between its device and the host (or within the device).
using DeviceCopyFn = std::function<Status(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes)>;
void RegisterDeviceCopy(DeviceType type, DeviceCopyFn fn);

// Waits until the work queued on a device is done (a no-op on the CPU,
// whose kernels return when done): for timing asynchronous devices.
using DeviceSyncFn = std::function<Status(int index)>;
void RegisterDeviceSync(DeviceType type, DeviceSyncFn fn);
Status WaitForDevice(Device device);

template <typename T>
Tensor Tensor::FromVector(const Shape& shape, const std::vector<T>& values) {
  LOOM_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "FromVector: ", values.size(), " values for shape ",
             shape.ToString());
  Tensor t = Zeros(shape, DTypeOf<T>::value);
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  return t;
}

}  // namespace loom
