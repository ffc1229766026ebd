// Helpers every engine test may use: host tensors from floats, their contents as doubles, bf16
// rounding of a reference's inputs, and the check of an InvalidArgument that names something.
#ifndef MOETRAIN_TESTS_ENGINE_TENSOR_TEST_UTIL_H_
#define MOETRAIN_TESTS_ENGINE_TENSOR_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace moetrain::test_util {

inline float RoundToBF16(float v) { return BF16ToFloat(FloatToBF16(v)); }

// A host tensor of `shape` in `dtype` (f32, or bf16 rounded to nearest even) holding `values`.
inline Tensor MakeTensor(DType dtype, std::vector<int64_t> shape,
                         const std::vector<float>& values) {
  Tensor t = Tensor::Empty(dtype, shape);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kBF16) {
      t.data<BF16>()[i] = FloatToBF16(values[i]);
    } else {
      t.data<float>()[i] = values[i];
    }
  }
  return t;
}

// The elements of an f32 or bf16 host view, as doubles.
inline std::vector<double> ToDoubles(const TensorView& t) {
  std::vector<double> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    v[i] = t.dtype() == DType::kBF16 ? BF16ToFloat(t.data<BF16>()[i]) : t.data<float>()[i];
  }
  return v;
}

// InvalidArgument whose message contains `needle`.
inline ::testing::AssertionResult IsInvalidArgument(const absl::Status& status,
                                                    std::string_view needle) {
  if (status.code() != absl::StatusCode::kInvalidArgument) {
    return ::testing::AssertionFailure() << "expected InvalidArgument, got " << status;
  }
  if (std::string(status.message()).find(needle) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "message does not mention '" << needle << "': " << status;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace moetrain::test_util

#endif  // MOETRAIN_TESTS_ENGINE_TENSOR_TEST_UTIL_H_
