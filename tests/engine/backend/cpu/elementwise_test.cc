#include "engine/backend/cpu/elementwise.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "gtest/gtest.h"

namespace moetrain::cpu {
namespace {

// ---------------------------------------------------------------------------------------------
// Helpers and float64 references written from the contracts in elementwise.h.
// ---------------------------------------------------------------------------------------------

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Relative error bound for a result computed in f32 and stored in `dtype` (bf16 storage rounds
// to 8 significant bits: ~2^-9 relative).
double Tolerance(DType dtype) { return dtype == DType::kBF16 ? 1e-2 : 1e-5; }

const char* Name(DType dtype) { return dtype == DType::kBF16 ? "BF16" : "F32"; }

struct Size {
  int64_t rows, cols;
};
void PrintTo(const Size& s, std::ostream* os) { *os << s.rows << "x" << s.cols; }

// 37 × 23 is no multiple of any vector width; 3000 × 300 spreads over the thread pool.
const Size kSmall = {37, 23};
const Size kLarge = {3000, 300};

// A tensor in `dtype` (f32 or bf16) holding `values`, which are rounded in place to what the
// tensor stores so that a reference computes from exactly the engine's inputs.
Tensor MakeAct(DType dtype, std::vector<int64_t> shape, std::vector<float>& values) {
  Tensor t = Tensor::Empty(dtype, shape);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kBF16) {
      t.data<BF16>()[i] = FloatToBF16(values[i]);
      values[i] = BF16ToFloat(t.data<BF16>()[i]);
    } else {
      t.data<float>()[i] = values[i];
    }
  }
  return t;
}

// An act tensor with every element NaN (f32) or a bf16 NaN: elements a kernel must overwrite.
Tensor NaNAct(DType dtype, std::vector<int64_t> shape) {
  Tensor t = Tensor::Empty(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kBF16) {
      t.data<BF16>()[i] = FloatToBF16(kNaN);
    } else {
      t.data<float>()[i] = kNaN;
    }
  }
  return t;
}

Tensor MakeI32(std::vector<int64_t> shape, const std::vector<int32_t>& values) {
  Tensor t = Tensor::Empty(DType::kI32, shape);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

std::vector<float> Uniform(int64_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Element i of an f32 or bf16 tensor as double.
double At(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kBF16 ? BF16ToFloat(t.data<BF16>()[i]) : t.data<float>()[i];
}

// ‖got − want‖ / ‖want‖ (absolute when want is zero); a NaN left in got fails any bound.
double RelError(const Tensor& got, const std::vector<double>& want) {
  EXPECT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double d = At(got, i) - want[i];
    diff += d * d;
    norm += want[i] * want[i];
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.view().raw(), b.view().raw(), a.numel() * DTypeSize(a.dtype())) == 0;
}

::testing::AssertionResult IsInvalidArgument(const absl::Status& status, std::string_view needle) {
  if (status.code() != absl::StatusCode::kInvalidArgument) {
    return ::testing::AssertionFailure() << "expected InvalidArgument, got " << status;
  }
  if (std::string(status.message()).find(needle) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "message does not mention '" << needle << "': " << status;
  }
  return ::testing::AssertionSuccess();
}

double RefSigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double RefSwiglu(double gate, double up) { return gate * RefSigmoid(gate) * up; }
// ∂/∂gate and ∂/∂up of RefSwiglu.
double RefSwigluDGate(double gate, double up) {
  const double s = RefSigmoid(gate);
  return up * (s + gate * s * (1.0 - s));
}
double RefSwigluDUp(double gate) { return gate * RefSigmoid(gate); }

// gate_up (R, 2F) values in [-6, 6]; saturated gates have a test of their own, so that their
// large outputs do not dominate the norms here.
std::vector<float> GateUpValues(int64_t rows, int64_t f, std::mt19937& rng) {
  return Uniform(rows * 2 * f, -6.0f, 6.0f, rng);
}

// ---------------------------------------------------------------------------------------------
// SwiGLU.
// ---------------------------------------------------------------------------------------------

using ActSizeParam = std::tuple<DType, Size>;

std::string ActSizeName(const ::testing::TestParamInfo<ActSizeParam>& info) {
  const Size s = std::get<1>(info.param);
  return std::string(Name(std::get<0>(info.param))) + "_" + std::to_string(s.rows) + "x" +
         std::to_string(s.cols);
}

class SwigluTest : public ::testing::TestWithParam<ActSizeParam> {};

TEST_P(SwigluTest, ForwardMatchesReference) {
  const auto [dtype, size] = GetParam();
  const int64_t rows = size.rows, f = size.cols;
  std::mt19937 rng(static_cast<uint32_t>(rows * 31 + f));
  std::vector<float> gate_up_values = GateUpValues(rows, f, rng);
  Tensor gate_up = MakeAct(DType::kF32, {rows, 2 * f}, gate_up_values);
  Tensor out = NaNAct(dtype, {rows, f});
  const absl::Status status = SwigluForward(gate_up, out);
  ASSERT_TRUE(status.ok()) << status;

  std::vector<double> want(rows * f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < f; ++i) {
      want[r * f + i] = RefSwiglu(gate_up_values[r * 2 * f + i], gate_up_values[r * 2 * f + f + i]);
    }
  }
  EXPECT_LT(RelError(out, want), Tolerance(dtype));
}

TEST_P(SwigluTest, BackwardMatchesReference) {
  const auto [dtype, size] = GetParam();
  const int64_t rows = size.rows, f = size.cols;
  std::mt19937 rng(static_cast<uint32_t>(rows * 37 + f));
  std::vector<float> gate_up_values = GateUpValues(rows, f, rng);
  std::vector<float> d_out_values = Uniform(rows * f, -1.0f, 1.0f, rng);
  Tensor gate_up = MakeAct(DType::kF32, {rows, 2 * f}, gate_up_values);
  Tensor d_out = MakeAct(DType::kF32, {rows, f}, d_out_values);
  Tensor d_gate_up = NaNAct(dtype, {rows, 2 * f});
  const absl::Status status = SwigluBackward(gate_up, d_out, d_gate_up);
  ASSERT_TRUE(status.ok()) << status;

  std::vector<double> want(rows * 2 * f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < f; ++i) {
      const double gate = gate_up_values[r * 2 * f + i], up = gate_up_values[r * 2 * f + f + i];
      const double d = d_out_values[r * f + i];
      want[r * 2 * f + i] = d * RefSwigluDGate(gate, up);
      want[r * 2 * f + f + i] = d * RefSwigluDUp(gate);
    }
  }
  EXPECT_LT(RelError(d_gate_up, want), Tolerance(dtype));
}

INSTANTIATE_TEST_SUITE_P(Sizes, SwigluTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(Size{1, 1}, kSmall, kLarge)),
                         ActSizeName);

// The derivative formulas of the reference itself, against central differences in double.
TEST(SwigluReferenceTest, DerivativesMatchFiniteDifferences) {
  const double h = 1e-5;
  for (double gate : {-8.0, -2.5, -0.7, -1e-3, 0.0, 0.3, 1.9, 7.5}) {
    for (double up : {-1.7, 0.4, 2.2}) {
      const double fd_gate = (RefSwiglu(gate + h, up) - RefSwiglu(gate - h, up)) / (2 * h);
      const double fd_up = (RefSwiglu(gate, up + h) - RefSwiglu(gate, up - h)) / (2 * h);
      EXPECT_NEAR(RefSwigluDGate(gate, up), fd_gate, 1e-8) << gate << ", " << up;
      EXPECT_NEAR(RefSwigluDUp(gate), fd_up, 1e-8) << gate << ", " << up;
    }
  }
}

// The engine's backward against central differences of the engine's own f32 forward. Each
// output depends on its own gate and up only, so shifting all gates (or all ups) at once gives
// every partial derivative from two forward calls.
TEST(SwigluEdgeTest, BackwardMatchesFiniteDifferencesOfForward) {
  const int64_t rows = 5, f = 7;
  const float h = 1e-2f;
  std::mt19937 rng(3);
  std::vector<float> gate_up_values = Uniform(rows * 2 * f, -3.0f, 3.0f, rng);
  std::vector<float> d_out_values = Uniform(rows * f, -1.0f, 1.0f, rng);
  Tensor gate_up = MakeAct(DType::kF32, {rows, 2 * f}, gate_up_values);
  Tensor d_out = MakeAct(DType::kF32, {rows, f}, d_out_values);
  Tensor d_gate_up = NaNAct(DType::kF32, {rows, 2 * f});
  ASSERT_TRUE(SwigluBackward(gate_up, d_out, d_gate_up).ok());

  // Forward with column block `half` (0 = gate, 1 = up) shifted by `delta`.
  auto forward = [&](int half, float delta) {
    std::vector<float> shifted = gate_up_values;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < f; ++i) shifted[r * 2 * f + half * f + i] += delta;
    }
    Tensor in = MakeAct(DType::kF32, {rows, 2 * f}, shifted);
    Tensor out = NaNAct(DType::kF32, {rows, f});
    EXPECT_TRUE(SwigluForward(in, out).ok());
    return out;
  };
  for (int half : {0, 1}) {
    const Tensor plus = forward(half, h), minus = forward(half, -h);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < f; ++i) {
        // Differences of f32 values: the shifted input is rounded, so use the actual step.
        const float x = gate_up_values[r * 2 * f + half * f + i];
        const double step = static_cast<double>(x + h) - static_cast<double>(x - h);
        const double fd =
            d_out_values[r * f + i] * (At(plus, r * f + i) - At(minus, r * f + i)) / step;
        EXPECT_NEAR(d_gate_up.data<float>()[r * 2 * f + half * f + i], fd,
                    1e-3 * std::max(1.0, std::abs(fd)))
            << (half == 0 ? "d_gate" : "d_up") << " at (" << r << ", " << i << ")";
      }
    }
  }
}

// Gates far out on both sides, around where e^-x leaves float range: silu(g) → 0 for g → −∞ and
// → g for g → +∞, with no inf or NaN on the way. Checked element by element.
TEST(SwigluEdgeTest, SaturatedGates) {
  const std::vector<float> gates = {-1e4f,  -1000.0f, -100.0f,  -89.0f,  -88.5f, -87.5f,
                                    -30.0f, -20.0f,   -1.2785f, 20.0f,   30.0f,  87.5f,
                                    88.5f,  89.0f,    100.0f,   1000.0f, 1e4f};
  const int64_t f = static_cast<int64_t>(gates.size());
  const float up = 1.5f, d = -0.75f;
  std::vector<float> gate_up_values(gates);
  gate_up_values.insert(gate_up_values.end(), f, up);
  std::vector<float> d_out_values(f, d);
  Tensor gate_up = MakeAct(DType::kF32, {1, 2 * f}, gate_up_values);
  Tensor d_out = MakeAct(DType::kF32, {1, f}, d_out_values);
  Tensor out = NaNAct(DType::kF32, {1, f});
  Tensor d_gate_up = NaNAct(DType::kF32, {1, 2 * f});
  ASSERT_TRUE(SwigluForward(gate_up, out).ok());
  ASSERT_TRUE(SwigluBackward(gate_up, d_out, d_gate_up).ok());
  for (int64_t i = 0; i < f; ++i) {
    const double g = gates[i];
    const double want_out = RefSwiglu(g, up), want_d_gate = d * RefSwigluDGate(g, up);
    const double want_d_up = d * RefSwigluDUp(g);
    EXPECT_NEAR(At(out, i), want_out, 1e-5 * std::abs(want_out) + 1e-30) << "out, gate " << g;
    EXPECT_NEAR(At(d_gate_up, i), want_d_gate, 1e-5 * std::abs(want_d_gate) + 1e-6)
        << "d_gate, gate " << g;
    EXPECT_NEAR(At(d_gate_up, f + i), want_d_up, 1e-5 * std::abs(want_d_up) + 1e-30)
        << "d_up, gate " << g;
  }
}

TEST(SwigluEdgeTest, EmptyBatch) {
  Tensor gate_up = Tensor::Empty(DType::kF32, {0, 8});
  Tensor out = Tensor::Empty(DType::kBF16, {0, 4});
  Tensor d_out = Tensor::Empty(DType::kF32, {0, 4});
  Tensor d_gate_up = Tensor::Empty(DType::kF32, {0, 8});
  EXPECT_TRUE(SwigluForward(gate_up, out).ok());
  EXPECT_TRUE(SwigluBackward(gate_up, d_out, d_gate_up).ok());
}

TEST(SwigluEdgeTest, RejectsBadArguments) {
  Tensor gate_up = Tensor::Zeros(DType::kF32, {4, 6});
  Tensor odd = Tensor::Zeros(DType::kF32, {4, 7});
  Tensor gate_up_bf16 = Tensor::Zeros(DType::kBF16, {4, 6});
  Tensor out = Tensor::Zeros(DType::kF32, {4, 3});
  Tensor out_wrong = Tensor::Zeros(DType::kF32, {4, 4});
  Tensor out_i32 = Tensor::Zeros(DType::kI32, {4, 3});
  Tensor d_out_bf16 = Tensor::Zeros(DType::kBF16, {4, 3});
  Tensor d_gate_up_wrong = Tensor::Zeros(DType::kF32, {4, 3});

  EXPECT_TRUE(IsInvalidArgument(SwigluForward(odd, Tensor::Zeros(DType::kF32, {4, 3})), "even"));
  EXPECT_TRUE(IsInvalidArgument(SwigluForward(gate_up_bf16, out), "swiglu gate_up"));
  EXPECT_TRUE(IsInvalidArgument(SwigluForward(gate_up, out_wrong), "swiglu out"));
  EXPECT_TRUE(IsInvalidArgument(SwigluForward(gate_up, out_i32), "swiglu out"));
  EXPECT_TRUE(IsInvalidArgument(SwigluForward(gate_up, TensorView()), "swiglu out"));
  EXPECT_TRUE(IsInvalidArgument(SwigluBackward(gate_up, d_out_bf16, gate_up), "swiglu d_out"));
  EXPECT_TRUE(IsInvalidArgument(SwigluBackward(gate_up, out, d_gate_up_wrong), "swiglu d_gate_up"));
}

// ---------------------------------------------------------------------------------------------
// GatherRows.
// ---------------------------------------------------------------------------------------------

class GatherRowsTest : public ::testing::TestWithParam<ActSizeParam> {};

TEST_P(GatherRowsTest, CopiesIndexedRowsIncludingRepeats) {
  const auto [dtype, size] = GetParam();
  const int64_t tokens = size.rows, cols = size.cols, rows = 2 * tokens + 3;
  std::mt19937 rng(static_cast<uint32_t>(tokens + cols));
  std::vector<float> src_values = Uniform(tokens * cols, -1.0f, 1.0f, rng);
  Tensor src = MakeAct(dtype, {tokens, cols}, src_values);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(tokens) - 1);
  std::vector<int32_t> index(rows);
  for (int32_t& i : index) i = pick(rng);
  // The first and last token, and one token three times in a row.
  index[0] = 0;
  index[rows - 1] = static_cast<int32_t>(tokens) - 1;
  index[1] = index[2] = index[3] = static_cast<int32_t>(tokens / 2);
  Tensor dst = NaNAct(dtype, {rows, cols});
  const absl::Status status = GatherRows(src, MakeI32({rows}, index), dst);
  ASSERT_TRUE(status.ok()) << status;

  const size_t row_bytes = cols * DTypeSize(dtype);
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_EQ(
        std::memcmp(static_cast<const char*>(dst.view().raw()) + r * row_bytes,
                    static_cast<const char*>(src.view().raw()) + index[r] * row_bytes, row_bytes),
        0)
        << "row " << r << " should be token " << index[r];
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, GatherRowsTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(Size{1, 1}, kSmall, kLarge)),
                         ActSizeName);

TEST(GatherRowsErrorTest, RejectsBadIndexAndShapes) {
  std::mt19937 rng(9);
  std::vector<float> values = Uniform(5 * 3, -1.0f, 1.0f, rng);
  Tensor src = MakeAct(DType::kF32, {5, 3}, values);
  Tensor dst = NaNAct(DType::kF32, {4, 3});
  const Tensor dst_before = NaNAct(DType::kF32, {4, 3});
  for (int32_t bad : {-1, 5, 1 << 30}) {
    SCOPED_TRACE(bad);
    // The bad entry is last: nothing may be copied before it is found.
    EXPECT_TRUE(IsInvalidArgument(GatherRows(src, MakeI32({4}, {0, 1, 2, bad}), dst), "index"));
    EXPECT_TRUE(SameBytes(dst, dst_before)) << "dst was written despite the error";
  }
  Tensor index = MakeI32({4}, {0, 1, 2, 3});
  Tensor index_i64 = Tensor::Zeros(DType::kI64, {4});
  Tensor dst_bf16 = Tensor::Zeros(DType::kBF16, {4, 3});
  Tensor dst_wrong = Tensor::Zeros(DType::kF32, {3, 3});
  EXPECT_TRUE(IsInvalidArgument(GatherRows(src, index_i64, dst), "gather index"));
  EXPECT_TRUE(IsInvalidArgument(GatherRows(src, index, dst_bf16), "gather dst"));
  EXPECT_TRUE(IsInvalidArgument(GatherRows(src, index, dst_wrong), "gather dst"));
  EXPECT_TRUE(IsInvalidArgument(GatherRows(TensorView(), index, dst), "gather src"));
}

// ---------------------------------------------------------------------------------------------
// CombineRows, its backward and SumPairRows, over the layout the MoE layer produces: pair
// (t, j) owns one row of `rows`, or none (-1) when the token was dropped by that expert.
// ---------------------------------------------------------------------------------------------

struct Routing {
  int64_t tokens = 0, k = 0, rows = 0, d = 0;
  std::vector<int32_t> pair_row;  // (T, k): a permutation of [0, R) with -1 for dropped pairs
  std::vector<float> weights;     // (T, k), nonzero also for dropped pairs
};

Routing MakeRouting(int64_t tokens, int64_t k, int64_t d, std::mt19937& rng) {
  Routing routing{tokens, k, 0, d, std::vector<int32_t>(tokens * k), {}};
  std::bernoulli_distribution drop(0.2);
  std::vector<bool> dropped(tokens * k);
  for (int64_t i = 0; i < tokens * k; ++i) dropped[i] = drop(rng);
  // Token 0 loses every pair; token 1 keeps every pair.
  for (int64_t j = 0; j < k; ++j) {
    dropped[j] = true;
    if (tokens > 1) dropped[k + j] = false;
  }
  const int64_t kept = std::count(dropped.begin(), dropped.end(), false);
  std::vector<int32_t> perm(kept);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int64_t next = 0;
  for (int64_t i = 0; i < tokens * k; ++i) routing.pair_row[i] = dropped[i] ? -1 : perm[next++];
  routing.rows = kept;
  routing.weights = Uniform(tokens * k, 0.05f, 1.0f, rng);
  return routing;
}

// out_t = [extra_t +] Σ_j w[t, j] · rows[pair_row[t, j]].
std::vector<double> RefCombine(const Routing& r, const std::vector<float>& rows,
                               const std::vector<float>* extra) {
  std::vector<double> out(r.tokens * r.d, 0.0);
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int64_t i = 0; i < r.d; ++i) {
      double sum = extra != nullptr ? (*extra)[t * r.d + i] : 0.0;
      for (int64_t j = 0; j < r.k; ++j) {
        const int32_t row = r.pair_row[t * r.k + j];
        if (row >= 0) sum += static_cast<double>(r.weights[t * r.k + j]) * rows[row * r.d + i];
      }
      out[t * r.d + i] = sum;
    }
  }
  return out;
}

using CombineParam = std::tuple<DType, bool, Size>;  // out dtype, with extra, (tokens, d)

std::string CombineName(const ::testing::TestParamInfo<CombineParam>& info) {
  const auto& [dtype, with_extra, size] = info.param;
  return std::string(Name(dtype)) + (with_extra ? "_Extra_" : "_") + std::to_string(size.rows) +
         "x" + std::to_string(size.cols);
}

class CombineRowsTest : public ::testing::TestWithParam<CombineParam> {};

TEST_P(CombineRowsTest, MatchesReference) {
  const auto [dtype, with_extra, size] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(size.rows * 3 + size.cols + with_extra));
  const Routing r = MakeRouting(size.rows, /*k=*/3, size.cols, rng);
  std::vector<float> rows_values = Uniform(r.rows * r.d, -1.0f, 1.0f, rng);
  std::vector<float> extra_values = Uniform(r.tokens * r.d, -1.0f, 1.0f, rng);
  Tensor rows = MakeAct(DType::kF32, {r.rows, r.d}, rows_values);
  Tensor extra = MakeAct(DType::kF32, {r.tokens, r.d}, extra_values);
  std::vector<float> weights_values = r.weights;
  Tensor weights = MakeAct(DType::kF32, {r.tokens, r.k}, weights_values);
  Tensor out = NaNAct(dtype, {r.tokens, r.d});
  const absl::Status status = CombineRows(rows, MakeI32({r.tokens, r.k}, r.pair_row), weights,
                                          with_extra ? extra.view() : TensorView(), out);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_LT(RelError(out, RefCombine(r, rows_values, with_extra ? &extra_values : nullptr)),
            Tolerance(dtype));
  // Token 0 lost all its pairs: it is exactly extra_0 (rounded to out) or zero.
  for (int64_t i = 0; i < r.d; ++i) {
    const float want = with_extra ? extra_values[i] : 0.0f;
    EXPECT_EQ(At(out, i), dtype == DType::kBF16 ? BF16ToFloat(FloatToBF16(want)) : want) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, CombineRowsTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Bool(), ::testing::Values(kSmall, kLarge)),
                         CombineName);

using CombineBackwardParam = std::tuple<DType, DType, Size>;  // d_out, d_rows dtypes

std::string CombineBackwardName(const ::testing::TestParamInfo<CombineBackwardParam>& info) {
  const auto& [d_out_dtype, d_rows_dtype, size] = info.param;
  return std::string("DOut") + Name(d_out_dtype) + "_DRows" + Name(d_rows_dtype) + "_" +
         std::to_string(size.rows) + "x" + std::to_string(size.cols);
}

class CombineRowsBackwardTest : public ::testing::TestWithParam<CombineBackwardParam> {};

TEST_P(CombineRowsBackwardTest, MatchesReference) {
  const auto [d_out_dtype, d_rows_dtype, size] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(size.rows * 5 + size.cols));
  const Routing r = MakeRouting(size.rows, /*k=*/2, size.cols, rng);
  std::vector<float> d_out_values = Uniform(r.tokens * r.d, -1.0f, 1.0f, rng);
  std::vector<float> rows_values = Uniform(r.rows * r.d, -1.0f, 1.0f, rng);
  std::vector<float> weights_values = r.weights;
  Tensor d_out = MakeAct(d_out_dtype, {r.tokens, r.d}, d_out_values);
  Tensor rows = MakeAct(DType::kF32, {r.rows, r.d}, rows_values);
  Tensor weights = MakeAct(DType::kF32, {r.tokens, r.k}, weights_values);
  Tensor d_rows = NaNAct(d_rows_dtype, {r.rows, r.d});
  Tensor d_weights = NaNAct(DType::kF32, {r.tokens, r.k});
  const absl::Status status = CombineRowsBackward(d_out, rows, MakeI32({r.tokens, r.k}, r.pair_row),
                                                  weights, d_rows, d_weights);
  ASSERT_TRUE(status.ok()) << status;

  std::vector<double> want_d_rows(r.rows * r.d, 0.0), want_d_weights(r.tokens * r.k, 0.0);
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int64_t j = 0; j < r.k; ++j) {
      const int32_t row = r.pair_row[t * r.k + j];
      if (row < 0) continue;
      double dot = 0.0;
      for (int64_t i = 0; i < r.d; ++i) {
        want_d_rows[row * r.d + i] =
            static_cast<double>(r.weights[t * r.k + j]) * d_out_values[t * r.d + i];
        dot += static_cast<double>(d_out_values[t * r.d + i]) * rows_values[row * r.d + i];
      }
      want_d_weights[t * r.k + j] = dot;
    }
  }
  EXPECT_LT(RelError(d_rows, want_d_rows), Tolerance(d_rows_dtype));
  // Dot products of exact inputs accumulated in f32, whatever d_out is stored in.
  EXPECT_LT(RelError(d_weights, want_d_weights), 1e-5);
  for (int64_t i = 0; i < r.tokens * r.k; ++i) {
    if (r.pair_row[i] < 0) {
      ASSERT_EQ(d_weights.data<float>()[i], 0.0f) << "dropped pair " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, CombineRowsBackwardTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(kSmall, kLarge)),
                         CombineBackwardName);

using SumParam = std::tuple<DType, int, Size>;  // out dtype, number of addends

std::string SumName(const ::testing::TestParamInfo<SumParam>& info) {
  const auto& [dtype, addends, size] = info.param;
  return std::string(Name(dtype)) + "_" + std::to_string(addends) + "Addends_" +
         std::to_string(size.rows) + "x" + std::to_string(size.cols);
}

class SumPairRowsTest : public ::testing::TestWithParam<SumParam> {};

TEST_P(SumPairRowsTest, MatchesReference) {
  const auto [dtype, num_addends, size] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(size.rows * 7 + size.cols + num_addends));
  const Routing r = MakeRouting(size.rows, /*k=*/4, size.cols, rng);
  std::vector<float> rows_values = Uniform(r.rows * r.d, -1.0f, 1.0f, rng);
  Tensor rows = MakeAct(DType::kF32, {r.rows, r.d}, rows_values);
  std::vector<std::vector<float>> addend_values;
  std::vector<Tensor> addends;
  std::vector<TensorView> addend_views;
  for (int a = 0; a < num_addends; ++a) {
    addend_values.push_back(Uniform(r.tokens * r.d, -1.0f, 1.0f, rng));
    addends.push_back(MakeAct(DType::kF32, {r.tokens, r.d}, addend_values.back()));
    addend_views.push_back(addends.back());
  }
  Tensor out = NaNAct(dtype, {r.tokens, r.d});
  const absl::Status status =
      SumPairRows(rows, MakeI32({r.tokens, r.k}, r.pair_row), addend_views, out);
  ASSERT_TRUE(status.ok()) << status;

  std::vector<double> want(r.tokens * r.d, 0.0);
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int64_t i = 0; i < r.d; ++i) {
      double sum = 0.0;
      for (int64_t j = 0; j < r.k; ++j) {
        const int32_t row = r.pair_row[t * r.k + j];
        if (row >= 0) sum += rows_values[row * r.d + i];
      }
      for (const std::vector<float>& a : addend_values) sum += a[t * r.d + i];
      want[t * r.d + i] = sum;
    }
  }
  EXPECT_LT(RelError(out, want), Tolerance(dtype));
}

INSTANTIATE_TEST_SUITE_P(Sizes, SumPairRowsTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(0, 1, 2),
                                            ::testing::Values(kSmall, kLarge)),
                         SumName);

TEST(CombineErrorTest, RejectsBadPairRowsAndShapes) {
  const int64_t tokens = 4, k = 2, rows = 6, d = 3;
  Tensor rows_t = Tensor::Zeros(DType::kF32, {rows, d});
  Tensor weights = Tensor::Zeros(DType::kF32, {tokens, k});
  Tensor out = Tensor::Zeros(DType::kF32, {tokens, d});
  Tensor d_rows = Tensor::Zeros(DType::kF32, {rows, d});
  Tensor d_weights = Tensor::Zeros(DType::kF32, {tokens, k});
  Tensor good = MakeI32({tokens, k}, {0, 1, 2, -1, 3, 4, -1, 5});
  for (int32_t bad : {-2, 6, 1000}) {
    SCOPED_TRACE(bad);
    Tensor pair_row = MakeI32({tokens, k}, {0, 1, 2, -1, 3, 4, -1, bad});
    EXPECT_TRUE(
        IsInvalidArgument(CombineRows(rows_t, pair_row, weights, TensorView(), out), "pair_row"));
    EXPECT_TRUE(IsInvalidArgument(
        CombineRowsBackward(out, rows_t, pair_row, weights, d_rows, d_weights), "pair_row"));
    EXPECT_TRUE(IsInvalidArgument(SumPairRows(rows_t, pair_row, {}, out), "pair_row"));
  }
  Tensor weights_wrong = Tensor::Zeros(DType::kF32, {tokens, k + 1});
  Tensor extra_wrong = Tensor::Zeros(DType::kF32, {tokens, d + 1});
  Tensor out_wrong = Tensor::Zeros(DType::kF32, {tokens + 1, d});
  Tensor out_i32 = Tensor::Zeros(DType::kI32, {tokens, d});
  Tensor d_rows_wrong = Tensor::Zeros(DType::kF32, {rows - 1, d});
  Tensor d_weights_bf16 = Tensor::Zeros(DType::kBF16, {tokens, k});
  Tensor pair_row_i64 = Tensor::Zeros(DType::kI64, {tokens, k});
  EXPECT_TRUE(IsInvalidArgument(CombineRows(rows_t, good, weights_wrong, TensorView(), out),
                                "combine weights"));
  EXPECT_TRUE(
      IsInvalidArgument(CombineRows(rows_t, good, weights, extra_wrong, out), "combine extra"));
  EXPECT_TRUE(IsInvalidArgument(CombineRows(rows_t, good, weights, TensorView(), out_wrong),
                                "combine out"));
  EXPECT_TRUE(
      IsInvalidArgument(CombineRows(rows_t, good, weights, TensorView(), out_i32), "combine out"));
  EXPECT_TRUE(
      IsInvalidArgument(CombineRows(rows_t, pair_row_i64, weights, TensorView(), out), "pair_row"));
  EXPECT_TRUE(IsInvalidArgument(
      CombineRowsBackward(out_wrong, rows_t, good, weights, d_rows, d_weights), "combine d_out"));
  EXPECT_TRUE(IsInvalidArgument(
      CombineRowsBackward(out, rows_t, good, weights, d_rows_wrong, d_weights), "combine d_rows"));
  EXPECT_TRUE(
      IsInvalidArgument(CombineRowsBackward(out, rows_t, good, weights, d_rows, d_weights_bf16),
                        "combine d_weights"));
  Tensor addend_wrong = Tensor::Zeros(DType::kF32, {tokens, d + 1});
  const std::vector<TensorView> addends = {out, addend_wrong};
  EXPECT_TRUE(IsInvalidArgument(SumPairRows(rows_t, good, addends, out), "sum addend"));
  EXPECT_TRUE(IsInvalidArgument(SumPairRows(rows_t, good, {}, out_i32), "sum out"));
}

// ---------------------------------------------------------------------------------------------
// ConvertTensor.
// ---------------------------------------------------------------------------------------------

// Random values with the specials a conversion must get right at fixed places.
std::vector<float> ConvertValues(int64_t n, std::mt19937& rng) {
  std::vector<float> v = Uniform(n, -1000.0f, 1000.0f, rng);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            kNaN,
                            std::numeric_limits<float>::max(),  // rounds up to infinity
                            std::numeric_limits<float>::denorm_min(),
                            1.00390625f,  // exactly halfway between two bf16 values: to even
                            1.01171875f};
  for (size_t i = 0; i < std::size(specials) && i < v.size(); ++i)
    v[i * 3 % v.size()] = specials[i];
  return v;
}

class ConvertTensorTest : public ::testing::TestWithParam<Size> {};

TEST_P(ConvertTensorTest, F32ToBF16RoundsLikeFloatToBF16) {
  const Size size = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(size.rows + size.cols));
  std::vector<float> values = ConvertValues(size.rows * size.cols, rng);
  Tensor src = MakeAct(DType::kF32, {size.rows, size.cols}, values);
  Tensor dst = NaNAct(DType::kBF16, {size.rows, size.cols});
  ASSERT_TRUE(ConvertTensor(src, dst).ok());
  for (int64_t i = 0; i < src.numel(); ++i) {
    ASSERT_EQ(dst.data<BF16>()[i].bits, FloatToBF16(values[i]).bits) << i << ": " << values[i];
  }
}

TEST_P(ConvertTensorTest, BF16ToF32IsExact) {
  const Size size = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(size.rows * 2 + size.cols));
  std::vector<float> values = ConvertValues(size.rows * size.cols, rng);
  Tensor src = MakeAct(DType::kBF16, {size.rows, size.cols}, values);
  Tensor dst = NaNAct(DType::kF32, {size.rows, size.cols});
  ASSERT_TRUE(ConvertTensor(src, dst).ok());
  for (int64_t i = 0; i < src.numel(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(dst.data<float>()[i]),
              static_cast<uint32_t>(src.data<BF16>()[i].bits) << 16)
        << i;
  }
}

TEST_P(ConvertTensorTest, SameDTypeCopies) {
  const Size size = GetParam();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    std::mt19937 rng(static_cast<uint32_t>(size.rows * 3 + size.cols));
    std::vector<float> values = ConvertValues(size.rows * size.cols, rng);
    Tensor src = MakeAct(dtype, {size.rows, size.cols}, values);
    Tensor dst = NaNAct(dtype, {size.rows, size.cols});
    ASSERT_TRUE(ConvertTensor(src, dst).ok());
    EXPECT_TRUE(SameBytes(src, dst)) << Name(dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ConvertTensorTest, ::testing::Values(Size{1, 1}, kSmall, kLarge),
                         [](const ::testing::TestParamInfo<Size>& info) {
                           return std::to_string(info.param.rows) + "x" +
                                  std::to_string(info.param.cols);
                         });

TEST(ConvertTensorErrorTest, RejectsMismatches) {
  Tensor f32 = Tensor::Zeros(DType::kF32, {4, 6});
  Tensor bf16_short = Tensor::Zeros(DType::kBF16, {4, 5});
  Tensor f32_long = Tensor::Zeros(DType::kF32, {5, 6});
  Tensor i32 = Tensor::Zeros(DType::kI32, {4, 6});
  EXPECT_TRUE(IsInvalidArgument(ConvertTensor(f32, bf16_short), "convert"));
  EXPECT_TRUE(IsInvalidArgument(ConvertTensor(f32, f32_long), "convert"));
  EXPECT_TRUE(IsInvalidArgument(ConvertTensor(f32, i32), "convert"));
  EXPECT_TRUE(IsInvalidArgument(ConvertTensor(i32, f32), "convert"));
  EXPECT_TRUE(IsInvalidArgument(ConvertTensor(TensorView(), f32), "convert"));
}

// ---------------------------------------------------------------------------------------------
// Strided views. The kernels index their tensors as dense row-major arrays, so a view with
// other strides must be refused (CheckAct does so for act tensors) instead of being read or
// written in the wrong places.
// ---------------------------------------------------------------------------------------------

// Every other row of `buffer` (2 × rows, cols) as a (rows, cols) view.
TensorView EveryOtherRow(const Tensor& buffer) {
  return TensorView(buffer.view().raw(), buffer.dtype(), {buffer.dim(0) / 2, buffer.dim(1)},
                    {2 * buffer.dim(1), 1});
}

TEST(StridedViewTest, NonContiguousTensorsAreRejected) {
  const int64_t tokens = 4, k = 2, rows = 6, d = 3;
  Tensor gate_up_buffer = Tensor::Zeros(DType::kF32, {2 * tokens, 2 * d});
  Tensor d_out_buffer = Tensor::Zeros(DType::kF32, {2 * tokens, d});
  Tensor out = Tensor::Zeros(DType::kF32, {tokens, d});
  Tensor gate_up = Tensor::Zeros(DType::kF32, {tokens, 2 * d});
  EXPECT_TRUE(IsInvalidArgument(SwigluForward(EveryOtherRow(gate_up_buffer), out), "gate_up"));
  EXPECT_TRUE(
      IsInvalidArgument(SwigluBackward(gate_up, EveryOtherRow(d_out_buffer), gate_up), "d_out"));

  Tensor src = Tensor::Zeros(DType::kF32, {rows, d});
  Tensor index = MakeI32({tokens}, {0, 1, 2, 3});
  Tensor dst_buffer = Tensor::Zeros(DType::kF32, {2 * tokens, d});
  EXPECT_TRUE(IsInvalidArgument(GatherRows(src, index, EveryOtherRow(dst_buffer)), "gather dst"));

  Tensor pair_row = MakeI32({tokens, k}, {0, 1, 2, -1, 3, 4, -1, 5});
  Tensor weights = Tensor::Zeros(DType::kF32, {tokens, k});
  Tensor rows_buffer = Tensor::Zeros(DType::kF32, {2 * rows, d});
  Tensor weights_buffer = Tensor::Zeros(DType::kF32, {2 * tokens, k});
  Tensor d_rows = Tensor::Zeros(DType::kF32, {rows, d});
  Tensor rows_t = Tensor::Zeros(DType::kF32, {rows, d});
  EXPECT_TRUE(IsInvalidArgument(
      CombineRows(EveryOtherRow(rows_buffer), pair_row, weights, TensorView(), out), "rows"));
  EXPECT_TRUE(IsInvalidArgument(
      CombineRows(rows_t, pair_row, weights, EveryOtherRow(d_out_buffer), out), "extra"));
  EXPECT_TRUE(IsInvalidArgument(
      CombineRowsBackward(out, rows_t, pair_row, weights, d_rows, EveryOtherRow(weights_buffer)),
      "d_weights"));
  const std::vector<TensorView> addends = {EveryOtherRow(d_out_buffer)};
  EXPECT_TRUE(IsInvalidArgument(SumPairRows(rows_t, pair_row, addends, out), "addend"));
}

}  // namespace
}  // namespace moetrain::cpu
