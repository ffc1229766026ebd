#include "engine/ops/elementwise/elementwise_cpu.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/core/fast_math.h"

namespace moetrain::cpu {
namespace {

MOETRAIN_CLONES void AddRow(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// Calls fn(element pointer) for every element of `t`, in row-major order, whatever its strides.
template <typename Fn>
void ForEachElement(const TensorView& t, Fn fn) {
  if (t.numel() == 0) return;
  if (t.rank() == 0) {
    fn(static_cast<char*>(t.raw()));
    return;
  }
  if (t.rank() == 1) {
    const int64_t step = t.stride(0) * static_cast<int64_t>(DTypeSize(t.dtype()));
    char* base = static_cast<char*>(t.raw());
    for (int64_t i = 0; i < t.dim(0); ++i) fn(base + i * step);
    return;
  }
  for (int64_t i = 0; i < t.dim(0); ++i) ForEachElement(t.Select(i), fn);
}

template <typename T>
void FillWith(const ExecContext& ctx, TensorView t, T value) {
  if (!t.is_contiguous()) {
    ForEachElement(t, [&](char* element) { std::memcpy(element, &value, sizeof(T)); });
    return;
  }
  T* data = t.data<T>();
  ctx.thread_pool().ParallelFor(t.numel(), 1 << 18, [&](int64_t begin, int64_t end) {
    std::fill(data + begin, data + end, value);
  });
}

}  // namespace

void CopyToDense(TensorView src, TensorView dst) {
  const size_t size = DTypeSize(src.dtype());
  if (src.is_contiguous()) {
    if (src.raw() != dst.raw()) std::memcpy(dst.raw(), src.raw(), src.numel() * size);
    return;
  }
  char* out = static_cast<char*>(dst.raw());
  ForEachElement(src, [&](char* element) {
    std::memcpy(out, element, size);
    out += size;
  });
}

void ConvertTensor(const ExecContext& ctx, TensorView src, TensorView dst) {
  const int64_t n = src.numel();
  ctx.thread_pool().ParallelFor(n, 1 << 16, [&](int64_t begin, int64_t end) {
    if (src.dtype() == dst.dtype()) {
      const size_t size = DTypeSize(src.dtype());
      std::memcpy(static_cast<char*>(dst.raw()) + begin * size,
                  static_cast<const char*>(src.raw()) + begin * size, (end - begin) * size);
    } else if (src.dtype() == DType::kF32) {
      ConvertF32ToBF16(src.data<float>() + begin, dst.data<BF16>() + begin, end - begin);
    } else {
      ConvertBF16ToF32(src.data<BF16>() + begin, dst.data<float>() + begin, end - begin);
    }
  });
}

// One memcpy a row.
void CopyColumns(const ExecContext& ctx, TensorView src, int64_t src_col, TensorView dst,
                 int64_t dst_col, int64_t cols) {
  const int64_t rows = src.dim(0), bytes = DTypeSize(src.dtype());
  const auto* from = static_cast<const char*>(src.raw()) + src_col * bytes;
  auto* to = static_cast<char*>(dst.raw()) + dst_col * bytes;
  const int64_t from_pitch = src.dim(1) * bytes, to_pitch = dst.dim(1) * bytes;
  ctx.thread_pool().ParallelFor(
      rows, std::max<int64_t>(1, 65536 / std::max<int64_t>(cols * bytes, 1)),
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          std::memcpy(to + r * to_pitch, from + r * from_pitch, cols * bytes);
        }
      });
}

// out = a + b, row by row; a bf16 row of b is widened first.
void Add(const ExecContext& ctx, TensorView a, TensorView b, TensorView out) {
  const int64_t t = a.dim(0), d = a.dim(1);
  ctx.thread_pool().ParallelFor(
      t, std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)), [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> widened;
        if (static_cast<int64_t>(widened.size()) < d) widened.resize(d);
        for (int64_t r = begin; r < end; ++r) {
          const float* row = widened.data();
          if (b.dtype() == DType::kBF16) {
            ConvertBF16ToF32(b.data<BF16>() + r * d, widened.data(), d);
          } else {
            row = b.data<float>() + r * d;
          }
          AddRow(a.data<float>() + r * d, row, d, out.data<float>() + r * d);
        }
      });
}

void Fill(const ExecContext& ctx, TensorView t, float value) {
  switch (t.dtype()) {
    case DType::kF32:
      return FillWith(ctx, t, value);
    case DType::kBF16:
      return FillWith(ctx, t, FloatToBF16(value));
    case DType::kI32:
      return FillWith(ctx, t, static_cast<int32_t>(value));
    case DType::kI64:
      return FillWith(ctx, t, static_cast<int64_t>(value));
    default:
      return;  // refused by ops::Fill
  }
}

void FillNormal(const ExecContext& ctx, TensorView t, const Rng& rng, float mean, float stddev) {
  float* data = t.data<float>();
  ctx.thread_pool().ParallelFor(t.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    rng.FillNormal(data + begin, end - begin, mean, stddev, begin);
  });
}

}  // namespace moetrain::cpu
