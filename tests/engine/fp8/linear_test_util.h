// What the Linear tests (linear_test.cc on the CPU, linear_cuda_test.cc against it) share: host
// tensors of random normal values and of one value.
#ifndef MOETRAIN_TESTS_ENGINE_FP8_LINEAR_TEST_UTIL_H_
#define MOETRAIN_TESTS_ENGINE_FP8_LINEAR_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/tensor.h"

namespace moetrain::fp8_test {

// A host tensor in `dtype` (f32, or bf16 rounded to nearest even) of normal values × `stddev`.
inline Tensor Random(DType dtype, std::vector<int64_t> shape, std::mt19937& rng,
                     float stddev = 1.0f) {
  Tensor t = Tensor::Empty(dtype, shape);
  std::normal_distribution<float> normal(0.0f, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = normal(rng);
    if (dtype == DType::kBF16) {
      t.data<BF16>()[i] = FloatToBF16(v);
    } else {
      t.data<float>()[i] = v;
    }
  }
  return t;
}

// A host f32 tensor with every element `value`.
inline Tensor Filled(std::vector<int64_t> shape, float value) {
  Tensor t = Tensor::Empty(DType::kF32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = value;
  return t;
}

}  // namespace moetrain::fp8_test

#endif  // MOETRAIN_TESTS_ENGINE_FP8_LINEAR_TEST_UTIL_H_
