// Tensor (owning, contiguous, 64-byte aligned) and TensorView (non-owning, strided), each on a
// Device. Memory of another device than the CPU is never read by the host through a view:
// data<T>() refuses it, and copies between devices are explicit (ops::CopyTensor).
//
// Views do not carry constness: a function documents which views it writes.
#ifndef MOETRAIN_ENGINE_CORE_TENSOR_H_
#define MOETRAIN_ENGINE_CORE_TENSOR_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/core/allocator.h"
#include "engine/core/device.h"
#include "engine/core/dtype.h"

namespace moetrain {

inline constexpr int kMaxRank = 4;

class TensorView {
 public:
  TensorView() = default;
  // A contiguous (row-major) view of memory on `device`.
  TensorView(void* data, DType dtype, absl::Span<const int64_t> shape,
             Device device = Device::Cpu());
  // A strided view; strides are in elements.
  TensorView(void* data, DType dtype, absl::Span<const int64_t> shape,
             absl::Span<const int64_t> strides, Device device = Device::Cpu());

  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int rank() const { return rank_; }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t stride(int i) const { return strides_[i]; }
  absl::Span<const int64_t> shape() const { return {shape_, static_cast<size_t>(rank_)}; }
  int64_t numel() const;
  // A view with no data (the default): optional tensors that are absent.
  bool empty() const { return data_ == nullptr; }
  bool is_contiguous() const;

  // The address, on whatever device the view is: for kernels, copies and communication.
  void* raw() const { return data_; }
  // The elements, for code that runs on the host. A view of another device's memory stops the
  // process here, naming the device: a host read of it would be garbage or a crash far away.
  template <typename T>
  T* data() const {
    if (!device_.is_cpu()) [[unlikely]]
      DieNotOnHost();
    return static_cast<T*>(data_);
  }

  // Rows [begin, end) of dimension 0.
  TensorView Slice(int64_t begin, int64_t end) const;
  // Element i of dimension 0, with that dimension dropped.
  TensorView Select(int64_t i) const;
  // The same contiguous data with another shape of equal element count.
  TensorView Reshape(absl::Span<const int64_t> shape) const;

  // "(4, 8) bf16", and " on cuda:0" for a view of device memory.
  std::string DebugString() const;

 private:
  [[noreturn]] void DieNotOnHost() const;

  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_;
  int rank_ = 0;
  int64_t shape_[kMaxRank] = {};
  int64_t strides_[kMaxRank] = {};
};

class Tensor {
 public:
  Tensor() = default;
  // Host memory; uninitialised contents. std::bad_alloc when the host has no room.
  static Tensor Empty(DType dtype, absl::Span<const int64_t> shape);
  static Tensor Zeros(DType dtype, absl::Span<const int64_t> shape);
  // Memory from `allocator`, on its device; uninitialised contents. ResourceExhausted (naming the
  // bytes) when it has no room.
  static absl::StatusOr<Tensor> Allocate(Allocator& allocator, DType dtype,
                                         absl::Span<const int64_t> shape);

  // A moved-from tensor is empty() (a defaulted move would leave it a view of freed memory).
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  const TensorView& view() const { return view_; }
  operator TensorView() const { return view_; }  // NOLINT: a tensor is usable wherever a view is.

  DType dtype() const { return view_.dtype(); }
  Device device() const { return view_.device(); }
  int rank() const { return view_.rank(); }
  int64_t dim(int i) const { return view_.dim(i); }
  int64_t numel() const { return view_.numel(); }
  bool empty() const { return view_.empty(); }
  template <typename T>
  T* data() const {
    return view_.data<T>();
  }

 private:
  struct Free {
    Allocator* allocator;  // the one that gave the memory
    void operator()(void* p) const { allocator->Deallocate(p); }
  };
  std::unique_ptr<void, Free> storage_;
  TensorView view_;
};

// OK when `t` has `dtype` and `shape` (-1 matches any extent), else InvalidArgument naming `name`:
// "x: expected (-1, 512) f32, got (4, 256) f32".
absl::Status CheckTensor(const TensorView& t, std::string_view name, DType dtype,
                         std::initializer_list<int64_t> shape);

// CheckTensor, and the view must be dense (row-major contiguous): for kernels that address rows
// as data + row · columns. "x: must be contiguous, got a strided (4, 8) f32 view".
absl::Status CheckDenseTensor(const TensorView& t, std::string_view name, DType dtype,
                              std::initializer_list<int64_t> shape);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_TENSOR_H_
