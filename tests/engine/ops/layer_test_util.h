// What the tests of the transformer's layer ops (norm, embedding, LM-head loss) share: random
// values, tensors from floats and ints, and errors relative to a tensor's scale.
#ifndef MOETRAIN_TESTS_ENGINE_OPS_LAYER_TEST_UTIL_H_
#define MOETRAIN_TESTS_ENGINE_OPS_LAYER_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "gtest/gtest.h"
#include "tests/engine/tensor_test_util.h"
#include "tests/testing/testing.h"

namespace moetrain::ops_test::layer_test {

inline ExecContext Cpu() { return ExecContext::Cpu(); }

inline std::vector<float> Normal(std::mt19937& rng, int64_t n, float mean, float stddev) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

using test_util::MakeTensor;
using test_util::RoundToBF16;
using test_util::ToDoubles;

inline Tensor FromInts(const std::vector<int32_t>& values) {
  Tensor t = Tensor::Empty(DType::kI32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

// max |got − want| / max |want|: the error relative to the tensor's scale.
inline double RelError(const std::vector<double>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / std::max(scale, 1e-30);
}

}  // namespace moetrain::ops_test::layer_test

#endif  // MOETRAIN_TESTS_ENGINE_OPS_LAYER_TEST_UTIL_H_
