#include "engine/core/tensor.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace moetrain {
namespace {

// A broken invariant here would read or write out of bounds later, far from the cause, and
// these calls have no Status to return: stop at once, naming the call.
void CheckOrDie(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "moetrain tensor: check failed: %s\n", what);
  std::abort();
}

// Debian's Abseil is built with its own string_view, which StrCat needs.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

void CheckShape(absl::Span<const int64_t> shape) {
  CheckOrDie(shape.size() <= static_cast<size_t>(kMaxRank), "rank <= kMaxRank");
  for (int64_t d : shape) CheckOrDie(d >= 0, "every extent >= 0");
}

// The C heap, 64-byte aligned: aligned_alloc needs a size that is a multiple of the alignment.
class HostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::Cpu(); }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
    }
    return p;
  }
  void Deallocate(void* data) override { std::free(data); }
};

}  // namespace

Allocator& CpuAllocator() {
  static HostAllocator* const allocator = new HostAllocator();
  return *allocator;
}

std::string Device::DebugString() const {
  switch (type) {
    case DeviceType::kCpu:
      return "cpu";
    case DeviceType::kCuda:
      return absl::StrCat("cuda:", index);
  }
  return absl::StrCat("device type ", static_cast<int>(type), ":", index);
}

TensorView::TensorView(void* data, DType dtype, absl::Span<const int64_t> shape, Device device)
    : data_(data), dtype_(dtype), device_(device), rank_(static_cast<int>(shape.size())) {
  CheckShape(shape);
  int64_t stride = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    shape_[i] = shape[i];
    strides_[i] = stride;
    stride *= shape[i];
  }
}

TensorView::TensorView(void* data, DType dtype, absl::Span<const int64_t> shape,
                       absl::Span<const int64_t> strides, Device device)
    : data_(data), dtype_(dtype), device_(device), rank_(static_cast<int>(shape.size())) {
  CheckShape(shape);
  CheckOrDie(strides.size() == shape.size(), "strides.size() == shape.size()");
  for (int i = 0; i < rank_; ++i) {
    shape_[i] = shape[i];
    strides_[i] = strides[i];
  }
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= shape_[i];
  return n;
}

bool TensorView::is_contiguous() const {
  // No element can be out of place (and Reshape of an empty slice must work).
  if (numel() == 0) return true;
  int64_t stride = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != stride) return false;
    stride *= shape_[i];
  }
  return true;
}

TensorView TensorView::Slice(int64_t begin, int64_t end) const {
  CheckOrDie(rank_ >= 1, "Slice needs rank >= 1");
  CheckOrDie(0 <= begin && begin <= end && end <= shape_[0], "Slice: 0 <= begin <= end <= dim(0)");
  TensorView v = *this;
  v.data_ = static_cast<char*>(data_) + begin * strides_[0] * DTypeSize(dtype_);
  v.shape_[0] = end - begin;
  return v;
}

TensorView TensorView::Select(int64_t i) const {
  CheckOrDie(rank_ >= 1, "Select needs rank >= 1");
  CheckOrDie(0 <= i && i < shape_[0], "Select: 0 <= i < dim(0)");
  TensorView v;
  v.data_ = static_cast<char*>(data_) + i * strides_[0] * DTypeSize(dtype_);
  v.dtype_ = dtype_;
  v.device_ = device_;
  v.rank_ = rank_ - 1;
  for (int d = 1; d < rank_; ++d) {
    v.shape_[d - 1] = shape_[d];
    v.strides_[d - 1] = strides_[d];
  }
  return v;
}

TensorView TensorView::Reshape(absl::Span<const int64_t> shape) const {
  CheckOrDie(is_contiguous(), "Reshape of a contiguous view");
  TensorView v(data_, dtype_, shape, device_);
  CheckOrDie(v.numel() == numel(), "Reshape keeps numel()");
  return v;
}

std::string TensorView::DebugString() const {
  return absl::StrCat("(", absl::StrJoin(shape(), ", "), ") ", ToAbsl(DTypeName(dtype_)),
                      device_.is_cpu() ? "" : " on ",
                      device_.is_cpu() ? "" : device_.DebugString());
}

void TensorView::DieNotOnHost() const {
  std::fprintf(stderr,
               "moetrain tensor: host access to a %s view of %s memory; copy it to the CPU "
               "first (ops::CopyTensor)\n",
               DebugString().c_str(), device_.DebugString().c_str());
  std::abort();
}

Tensor::Tensor(Tensor&& other) noexcept
    : storage_(std::move(other.storage_)), view_(std::exchange(other.view_, TensorView())) {}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  storage_ = std::move(other.storage_);
  view_ = std::exchange(other.view_, TensorView());
  return *this;
}

absl::StatusOr<Tensor> Tensor::Allocate(Allocator& allocator, DType dtype,
                                        absl::Span<const int64_t> shape) {
  CheckShape(shape);
  int64_t n = 1;
  for (int64_t d : shape) {
    // Sizes that overflow are as unallocatable as huge ones.
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / 8 / d) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate a (", absl::StrJoin(shape, ", "), ") tensor: its size overflows"));
    }
    n *= d;
  }
  // Never zero bytes, so that a tensor with no elements still has a non-null pointer and is not
  // `empty()`.
  const size_t bytes = std::max<size_t>(static_cast<size_t>(n) * DTypeSize(dtype), 1);
  absl::StatusOr<void*> p = allocator.Allocate(bytes);
  if (!p.ok()) return p.status();
  Tensor t;
  t.storage_ = std::unique_ptr<void, Free>(*p, Free{&allocator});
  t.view_ = TensorView(*p, dtype, shape, allocator.device());
  return t;
}

Tensor Tensor::Empty(DType dtype, absl::Span<const int64_t> shape) {
  absl::StatusOr<Tensor> t = Allocate(CpuAllocator(), dtype, shape);
  if (!t.ok()) throw std::bad_alloc();
  return *std::move(t);
}

Tensor Tensor::Zeros(DType dtype, absl::Span<const int64_t> shape) {
  Tensor t = Empty(dtype, shape);
  std::memset(t.view_.raw(), 0, static_cast<size_t>(t.numel()) * DTypeSize(dtype));
  return t;
}

absl::Status CheckTensor(const TensorView& t, std::string_view name, DType dtype,
                         std::initializer_list<int64_t> shape) {
  bool ok = !t.empty() && t.dtype() == dtype && t.rank() == static_cast<int>(shape.size());
  if (ok) {
    int i = 0;
    for (int64_t d : shape) {
      if (d != -1 && t.dim(i) != d) ok = false;
      ++i;
    }
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      ToAbsl(name), ": expected (", absl::StrJoin(shape, ", "), ") ", ToAbsl(DTypeName(dtype)),
      ", got ", t.empty() ? std::string("no tensor") : t.DebugString()));
}

absl::Status CheckDenseTensor(const TensorView& t, std::string_view name, DType dtype,
                              std::initializer_list<int64_t> shape) {
  absl::Status status = CheckTensor(t, name, dtype, shape);
  if (!status.ok() || t.is_contiguous()) return status;
  return absl::InvalidArgumentError(
      absl::StrCat(ToAbsl(name), ": must be contiguous, got a strided ", t.DebugString(), " view"));
}

}  // namespace moetrain
