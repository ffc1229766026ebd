// The CUDA router (router_cuda.cu) against the CPU router on fresh random problems, for every
// variant: softmax before and after top-k, sigmoid with and without expert bias, group-limited
// top-k, normalisation and scaling, switch and sequence aux losses, z-loss; edges (one token,
// k = E, one expert, token counts that are no multiple of a warp or block, more tokens than
// threads, an expert no token chooses, an expert every token chooses, strided views, zero
// tokens); the errors; group-summed counts; the expert-bias update; and run-to-run bit-identity.
// Every test skips without a GPU.
//
// Tolerances (all f32 outputs). The GPU runs the CPU's per-token code (router_math.h), but its
// expf and log differ from glibc's by an ulp or two and nvcc contracts multiply-adds into FMAs:
//   scores, topk_weights: per element, |gpu − cpu| ≤ 4e-6·|cpu| (a few ulps);
//   aux loss, z-loss: |gpu − cpu| ≤ 4e-6·|cpu| (sums in f64 of such terms);
//   d_logits: per element, |gpu − cpu| ≤ 2e-5·max|cpu| (f64 arithmetic on f32 inputs that differ by
//     ulps; cancellation makes small entries' relative error meaningless);
//   topk_experts, tokens_per_expert, aux_counts, the expert-bias update: identical.
// A selection may differ only at a token whose selection scores (or group scores) come within
// kTieMargin of each other on the CPU; a draw with such a difference is redrawn.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/ops/router/router.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/ops/router/router_test_util.h"

namespace moetrain::router_test {
namespace {

constexpr double kValueTol = 4e-6;
constexpr double kLossTol = 4e-6;
constexpr double kGradTol = 2e-5;
constexpr double kTieMargin = 1e-5;
// The backward's loss weight: not 1, so that its every use is exercised.
constexpr float kLossWeight = 0.75f;
// What d_logits's padding columns hold before and after a backward with strided views.
constexpr float kPadding = -123.0f;

uint32_t FreshSeed() { return std::random_device{}(); }

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// ---------------------------------------------------------------------------------------------
// One backend's run of a problem.
// ---------------------------------------------------------------------------------------------

// A problem's inputs on ctx's device, dense or as strided views: logits stored transposed (each
// token's logits T apart), rows of d_topk_weights and d_logits padded.
struct Staged {
  Tensor logits, bias, d_weights, d_logits;
  RouterArgs args;
  TensorView d_weights_view, d_logits_view;
  int64_t d_logits_row = 0;  // d_logits's row stride
};

Tensor Upload(const ExecContext& ctx, const std::vector<float>& v) {
  return test_util::ToDevice(
      ctx, TensorView(const_cast<float*>(v.data()), DType::kF32, {static_cast<int64_t>(v.size())}));
}

Staged Stage(const ExecContext& ctx, const Problem& p, bool strided) {
  const int64_t T = p.tokens, E = p.config.num_experts, k = p.config.top_k;
  Staged s;
  std::vector<float> logits = p.logits, d_weights = p.d_weights;
  int64_t logits_strides[2] = {E, 1}, d_weights_row = k;
  s.d_logits_row = E;
  if (strided) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t e = 0; e < E; ++e) logits[e * T + t] = p.logits[t * E + e];
    }
    logits_strides[0] = 1;
    logits_strides[1] = T;
    d_weights_row = k + 1;
    d_weights.assign(T * d_weights_row, 0.0f);
    for (int64_t i = 0; i < T * k; ++i) d_weights[(i / k) * d_weights_row + i % k] = p.d_weights[i];
    s.d_logits_row = E + 2;
  }
  s.logits = Upload(ctx, logits);
  s.bias = Upload(ctx, p.bias);
  s.d_weights = Upload(ctx, d_weights);
  s.d_logits = Upload(ctx, std::vector<float>(T * s.d_logits_row, kPadding));
  s.args = RouterArgs{
      TensorView(s.logits.view().raw(), DType::kF32, {T, E}, logits_strides, ctx.device()),
      s.bias.view(), p.tokens_per_sequence};
  s.d_weights_view =
      TensorView(s.d_weights.view().raw(), DType::kF32, {T, k}, {d_weights_row, 1}, ctx.device());
  s.d_logits_view =
      TensorView(s.d_logits.view().raw(), DType::kF32, {T, E}, {s.d_logits_row, 1}, ctx.device());
  return s;
}

template <typename T>
std::vector<T> Read(const ExecContext& ctx, const TensorView& v) {
  const Tensor host = test_util::ToHost(ctx, v);
  return std::vector<T>(host.data<T>(), host.data<T>() + host.numel());
}

struct Result {
  std::vector<float> scores;               // (T, E)
  std::vector<int32_t> experts;            // (T, k)
  std::vector<float> weights;              // (T, k)
  std::vector<int64_t> tokens_per_expert;  // (E)
  std::vector<int64_t> aux_counts;         // (E + 1)
  std::vector<float> losses;               // (2)
  std::vector<float> d_logits;             // (T, E), without the padding
  bool padding_intact = true;              // d_logits's padding columns unwritten
};

Result ReadResult(const ExecContext& ctx, const Problem& p, const RouterOutput& out,
                  const Staged& s) {
  const int64_t T = p.tokens, E = p.config.num_experts;
  Result r;
  r.scores = Read<float>(ctx, out.scores);
  r.experts = Read<int32_t>(ctx, out.topk_experts);
  r.weights = Read<float>(ctx, out.topk_weights);
  r.tokens_per_expert = Read<int64_t>(ctx, out.tokens_per_expert);
  r.aux_counts = Read<int64_t>(ctx, out.aux_counts);
  r.losses = Read<float>(ctx, out.losses);
  const std::vector<float> padded = Read<float>(ctx, s.d_logits);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < s.d_logits_row; ++e) {
      const float v = padded[t * s.d_logits_row + e];
      if (e < E) {
        r.d_logits.push_back(v);
      } else if (v != kPadding) {
        r.padding_intact = false;
      }
    }
  }
  return r;
}

// Forward, aux loss and backward of `p` on ctx, into `out` (reused when it has the shapes).
absl::Status RunRouter(const ExecContext& ctx, const Problem& p, bool strided, RouterOutput* out,
                       Result* result) {
  const Staged s = Stage(ctx, p, strided);
  MOETRAIN_RETURN_IF_ERROR(ops::RouterForward(ctx, p.config, s.args, out));
  MOETRAIN_RETURN_IF_ERROR(ops::RouterAuxLoss(ctx, p.config, s.args, out));
  MOETRAIN_RETURN_IF_ERROR(ops::RouterBackward(ctx, p.config, s.args, *out, s.d_weights_view,
                                               s.d_logits_view, kLossWeight));
  *result = ReadResult(ctx, p, *out, s);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Comparison.
// ---------------------------------------------------------------------------------------------

// The smallest gap, among token t's selection scores as the CPU computed them, that decides its
// choice: between neighbours of the best k + 1 (which experts, and in which order), taken over
// the experts of its chosen groups when group-limited, and then also between neighbours of the
// best group_top_k + 1 group scores. Below kTieMargin an ulp may reorder them; gaps elsewhere
// (among experts no one chooses) decide nothing, so a wrong choice is never excused by them.
double SelectionMargin(const Problem& p, const Result& cpu, int64_t t) {
  const MoeConfig& c = p.config;
  const int64_t E = c.num_experts, k = c.top_k;
  const bool after = c.score_function == ScoreFunction::kSoftmax && !c.softmax_before_topk;
  std::vector<float> selection(E);
  for (int64_t e = 0; e < E; ++e) {
    const float base = after ? p.logits[t * E + e] : cpu.scores[t * E + e];
    selection[e] = c.expert_bias ? base + p.bias[e] : base;
  }
  auto top_gap = [](std::vector<float> v, size_t n) {
    std::sort(v.begin(), v.end(), std::greater<float>());
    double gap = std::numeric_limits<double>::infinity();
    for (size_t i = 1; i < std::min(n, v.size()); ++i) {
      gap = std::min(gap, static_cast<double>(v[i - 1]) - v[i]);
    }
    return gap;
  };
  if (c.num_groups <= 1) return top_gap(selection, static_cast<size_t>(k + 1));
  const int64_t size = c.experts_per_group();
  std::vector<float> groups;
  for (int64_t g = 0; g < c.num_groups; ++g) {
    std::vector<float> members(selection.begin() + g * size, selection.begin() + (g + 1) * size);
    std::sort(members.begin(), members.end(), std::greater<float>());
    float sum = 0.0f;
    for (int64_t i = 0; i < c.group_score_members(); ++i) sum += members[i];
    groups.push_back(sum);
  }
  std::vector<char> chosen_group(c.num_groups, 0);
  for (int64_t j = 0; j < k; ++j) chosen_group[cpu.experts[t * k + j] / size] = 1;
  std::vector<float> candidates;
  for (int64_t e = 0; e < E; ++e) {
    if (chosen_group[e / size]) candidates.push_back(selection[e]);
  }
  return std::min(top_gap(groups, static_cast<size_t>(c.group_top_k + 1)),
                  top_gap(candidates, static_cast<size_t>(k + 1)));
}

// Per element |a − b| ≤ rel·|b| + abs.
void ExpectNear(const std::vector<float>& gpu, const std::vector<float>& cpu, double rel,
                double abs, const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(gpu[i]) - cpu[i]);
    if (!(diff <= rel * std::fabs(cpu[i]) + abs) && ++bad <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: cuda " << gpu[i] << ", cpu " << cpu[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": elements out of tolerance";
}

double MaxAbs(const std::vector<float>& v) {
  double max = 0.0;
  for (float x : v) max = std::max(max, static_cast<double>(std::fabs(x)));
  return max;
}

// Fails for any difference beyond the tolerances; returns false, failing nothing, when the
// selections differ only at near ties (the caller draws new logits).
bool ExpectMatchesCpu(const Problem& p, const Result& gpu, const Result& cpu) {
  const int64_t T = p.tokens, k = p.config.top_k;
  bool near_tie = false;
  int bad = 0;
  EXPECT_EQ(gpu.experts.size(), cpu.experts.size());
  if (gpu.experts.size() != cpu.experts.size()) return true;
  for (int64_t t = 0; t < T; ++t) {
    if (std::equal(gpu.experts.begin() + t * k, gpu.experts.begin() + (t + 1) * k,
                   cpu.experts.begin() + t * k)) {
      continue;
    }
    const double margin = SelectionMargin(p, cpu, t);
    if (margin < kTieMargin) {
      near_tie = true;
    } else if (++bad <= 5) {
      ADD_FAILURE() << "token " << t << ": cuda chose experts different from the cpu's, with a "
                    << "selection margin of " << margin;
    }
  }
  if (bad > 0) return true;
  if (near_tie) return false;
  EXPECT_EQ(gpu.tokens_per_expert, cpu.tokens_per_expert);
  EXPECT_EQ(gpu.aux_counts, cpu.aux_counts);
  ExpectNear(gpu.scores, cpu.scores, kValueTol, 0.0, "scores");
  ExpectNear(gpu.weights, cpu.weights, kValueTol, 0.0, "topk_weights");
  ExpectNear(gpu.losses, cpu.losses, kLossTol, 0.0, "losses");
  ExpectNear(gpu.d_logits, cpu.d_logits, 0.0, kGradTol * MaxAbs(cpu.d_logits), "d_logits");
  EXPECT_TRUE(gpu.padding_intact) << "cuda wrote d_logits's padding";
  EXPECT_TRUE(cpu.padding_intact) << "cpu wrote d_logits's padding";
  return true;
}

void ExpectSameBits(const Result& a, const Result& b) {
  EXPECT_TRUE(SameBits(a.scores, b.scores)) << "scores";
  EXPECT_TRUE(SameBits(a.experts, b.experts)) << "topk_experts";
  EXPECT_TRUE(SameBits(a.weights, b.weights)) << "topk_weights";
  EXPECT_TRUE(SameBits(a.tokens_per_expert, b.tokens_per_expert)) << "tokens_per_expert";
  EXPECT_TRUE(SameBits(a.aux_counts, b.aux_counts)) << "aux_counts";
  EXPECT_TRUE(SameBits(a.losses, b.losses)) << "losses";
  EXPECT_TRUE(SameBits(a.d_logits, b.d_logits)) << "d_logits";
}

// ---------------------------------------------------------------------------------------------
// Every variant and edge against the CPU.
// ---------------------------------------------------------------------------------------------

struct Case {
  std::string name;
  MoeConfig config;
  int64_t tokens;
  int64_t tokens_per_sequence = 0;
  bool strided = false;
  std::function<void(Problem&)> edit = nullptr;  // applied to each fresh draw
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Each token's logits replaced by their ranks, 0.5 apart, plus a per-token offset, and no bias:
// over 10⁵ tokens some near tie is likely, and the GPU's expf would then pick the other expert
// in one of them and change the counts. The draw stays fresh: ranks and offsets follow it.
void SeparateLogits(Problem& p) {
  const int64_t E = p.config.num_experts;
  for (int64_t t = 0; t < p.tokens; ++t) {
    float* z = p.logits.data() + t * E;
    const float offset = 0.25f * z[0];
    std::vector<float> sorted(z, z + E);
    std::sort(sorted.begin(), sorted.end());
    for (int64_t e = 0; e < E; ++e) {
      const int64_t rank = std::lower_bound(sorted.begin(), sorted.end(), z[e]) - sorted.begin();
      z[e] = offset + 0.5f * static_cast<float>(rank) - 0.25f * static_cast<float>(E);
    }
  }
  std::fill(p.bias.begin(), p.bias.end(), 0.0f);
}

std::vector<Case> Cases() {
  auto all = [&](MoeConfig c) { return With(With(With(c, SwitchAux), ZLossTerm), Rho(1.5f)); };
  return {
      {"SoftmaxPreNorm", Softmax(8, 2), 300},
      {"SoftmaxPreNoNormRho", With(With(Softmax(16, 4), NoNorm), Rho(2.5f)), 257},
      {"SoftmaxPreNormRho", With(Softmax(8, 3), Rho(1.7f)), 130},
      {"SoftmaxPreBias", With(Softmax(12, 3), Bias), 200},
      {"SoftmaxPost", With(Softmax(16, 4), Post), 200},
      {"SoftmaxPostBiasRho", With(With(With(Softmax(16, 2), Post), Bias), Rho(2.0f)), 150},
      {"SigmoidBiasNorm", With(Sigmoid(64, 6), Rho(2.5f)), 150},
      {"SigmoidBiasNoNorm", With(With(Sigmoid(32, 4), NoNorm), Rho(0.5f)), 140},
      {"SigmoidNoBias", With(Sigmoid(16, 3), [](MoeConfig& c) { c.expert_bias = false; }), 100},
      {"GroupSoftmax", With(Softmax(16, 4), Groups(4, 2)), 130},
      {"GroupSoftmaxPost", With(With(Softmax(16, 4), Post), Groups(8, 3)), 100},
      {"GroupSigmoid", all(With(Sigmoid(16, 4), Groups(4, 2))), 97},
      {"GroupSigmoidOneMember", With(Sigmoid(24, 5), Groups(6, 3)), 120},
      {"DeepSeekV3", DeepSeekV3(), 96},
      {"DeepSeekV3SeqAuxZLoss", With(With(DeepSeekV3(), SeqAux), ZLossTerm), 96, 32},
      {"DeepSeekV3AllLosses", all(DeepSeekV3()), 70},
      {"SwitchSoftmax", With(Softmax(8, 2), SwitchAux), 256},
      {"SwitchSoftmaxPost", With(With(Softmax(8, 2), Post), SwitchAux), 100},
      {"SwitchSigmoid", With(Sigmoid(16, 4), SwitchAux), 200},
      {"SequenceSoftmax", With(Softmax(8, 2), SeqAux), 96, 24},
      {"SequenceSoftmaxPost", With(With(Softmax(8, 3), Post), SeqAux), 60, 5},
      {"SequenceSigmoid", With(Sigmoid(16, 4), SeqAux), 120, 8},
      {"SequenceOneTokenEach", With(Softmax(8, 2), SeqAux), 20, 1},
      {"SequenceZeroMeansAll", With(Softmax(8, 2), SeqAux), 50, 0},
      {"ZLossSoftmax", With(Softmax(8, 2), ZLossTerm), 100},
      {"ZLossSoftmaxPost", With(With(Softmax(8, 2), Post), ZLossTerm), 100},
      {"ZLossSigmoid", With(Sigmoid(16, 2), ZLossTerm), 100},
      {"OneToken", With(Sigmoid(64, 6), ZLossTerm), 1},
      {"OneTokenSoftmax", all(Softmax(8, 2)), 1},
      {"OneTokenGroups", all(DeepSeekV3()), 1},
      {"KEqualsE", all(Softmax(6, 6)), 50},
      {"KEqualsENoNorm", With(Softmax(6, 6), NoNorm), 50},
      {"KEqualsESigmoid", all(Sigmoid(5, 5)), 40},
      {"KEqualsEPost", all(With(Softmax(4, 4), Post)), 40},
      {"OneExpert", all(Softmax(1, 1)), 20},
      {"OneExpertSigmoid", all(With(Sigmoid(1, 1), NoNorm)), 20},
      {"RaggedSixtyFive", With(Sigmoid(16, 2), SwitchAux), 65},
      {"ManyExperts", all(With(Sigmoid(512, 8), Groups(16, 4))), 333},
      // More tokens than an H100/H200 grid-stride grid has threads: threads take several.
      {"MoreTokensThanThreads", all(Softmax(8, 2)), 150001, 0, false, SeparateLogits},
      {"MoreTokensThanThreadsSeq", With(With(Sigmoid(8, 3), SeqAux), ZLossTerm), 150000, 48, false,
       SeparateLogits},
      {"StridedSoftmax", all(Softmax(16, 4)), 131, 0, true},
      {"StridedDeepSeekV3Seq", With(With(DeepSeekV3(), SeqAux), ZLossTerm), 64, 16, true},
      {"StridedSoftmaxPost", all(With(Softmax(8, 3), Post)), 77, 0, true},
      {"ExpertThatNoTokenChooses", all(Softmax(8, 2)), 100, 0, false,
       [](Problem& p) {
         for (int64_t t = 0; t < p.tokens; ++t) p.logits[t * 8 + 5] = -8.0f;
       }},
      {"ExpertThatEveryTokenChooses", all(Sigmoid(8, 2)), 100, 0, false,
       [](Problem& p) {
         p.bias.assign(8, 0.0f);
         p.bias[6] = 10.0f;
       }},
  };
}

class RouterCudaTest : public testing::TestWithParam<Case> {};

TEST_P(RouterCudaTest, MatchesCpuAndRepeatsBitIdentically) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const Case& c = GetParam();
  for (int draw = 0; draw < 3; ++draw) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    Problem p = MakeProblem(c.config, c.tokens, c.tokens_per_sequence, seed);
    if (c.edit) c.edit(p);
    RouterOutput cpu_out, gpu_out;
    Result cpu, cuda;
    ASSERT_TRUE(RunRouter(Cpu(), p, c.strided, &cpu_out, &cpu).ok());
    const absl::Status status = RunRouter(gpu, p, c.strided, &gpu_out, &cuda);
    ASSERT_TRUE(status.ok()) << status;
    if (!ExpectMatchesCpu(p, cuda, cpu)) continue;  // a near tie: draw again
    if (HasFailure()) return;
    // Again, into the same outputs (the counts must be zeroed anew), and into fresh ones.
    Result again, fresh;
    ASSERT_TRUE(RunRouter(gpu, p, c.strided, &gpu_out, &again).ok());
    RouterOutput fresh_out;
    ASSERT_TRUE(RunRouter(gpu, p, c.strided, &fresh_out, &fresh).ok());
    ExpectSameBits(cuda, again);
    ExpectSameBits(cuda, fresh);
    return;
  }
  FAIL() << "three draws in a row had a selection that differed at a near tie";
}

INSTANTIATE_TEST_SUITE_P(Variants, RouterCudaTest, testing::ValuesIn(Cases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Errors, group counts, zero tokens.
// ---------------------------------------------------------------------------------------------

TEST(RouterCudaEdgeTest, NonFiniteLogitIsNamedAsOnTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  Problem p = MakeProblem(Softmax(8, 2), 300, 0, FreshSeed());
  p.logits[250 * 8 + 3] = std::numeric_limits<float>::infinity();
  p.logits[201 * 8 + 7] = -std::numeric_limits<float>::infinity();
  p.logits[201 * 8 + 6] = std::nanf("");
  RouterOutput cpu_out, gpu_out;
  const absl::Status cpu = ops::RouterForward(Cpu(), p.config, ArgsOf(p), &cpu_out);
  const Staged s = Stage(gpu, p, false);
  const absl::Status cuda = ops::RouterForward(gpu, p.config, s.args, &gpu_out);
  EXPECT_TRUE(IsNonFiniteError(cuda)) << cuda;
  EXPECT_EQ(cuda.code(), cpu.code()) << cuda;
  EXPECT_EQ(cuda.message(), cpu.message());
  EXPECT_NE(std::string(cuda.message()).find("logits[201, 6] = nan is not finite"),
            std::string::npos)
      << cuda;
  // The same through strided logits (the kernel's copying path).
  const Staged strided = Stage(gpu, p, true);
  const absl::Status cuda_strided = ops::RouterForward(gpu, p.config, strided.args, &gpu_out);
  EXPECT_EQ(cuda_strided.message(), cpu.message());

  // An Inf in the first token and the last expert.
  p.logits[201 * 8 + 6] = 0.0f;
  p.logits[0 * 8 + 7] = std::numeric_limits<float>::infinity();
  const absl::Status cpu_inf = ops::RouterForward(Cpu(), p.config, ArgsOf(p), &cpu_out);
  const Staged s_inf = Stage(gpu, p, false);
  const absl::Status cuda_inf = ops::RouterForward(gpu, p.config, s_inf.args, &gpu_out);
  EXPECT_TRUE(IsNonFiniteError(cuda_inf)) << cuda_inf;
  EXPECT_EQ(cuda_inf.message(), cpu_inf.message());
  EXPECT_EQ(std::string(cuda_inf.message()), "logits[0, 7] = inf is not finite");
}

TEST(RouterCudaEdgeTest, NonFiniteBiasIsRefusedAsOnTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  Problem p = MakeProblem(Sigmoid(8, 2), 40, 0, FreshSeed());
  p.bias[5] = std::nanf("");
  p.bias[3] = -std::numeric_limits<float>::infinity();
  RouterOutput cpu_out, gpu_out;
  const absl::Status cpu = ops::RouterForward(Cpu(), p.config, ArgsOf(p), &cpu_out);
  const Staged s = Stage(gpu, p, false);
  const absl::Status cuda = ops::RouterForward(gpu, p.config, s.args, &gpu_out);
  EXPECT_EQ(cuda.code(), absl::StatusCode::kInvalidArgument) << cuda;
  EXPECT_EQ(cuda.code(), cpu.code());
  EXPECT_EQ(cuda.message(), cpu.message());
}

// The caller sums aux_counts over a group of ranks between RouterForward and RouterAuxLoss.
TEST(RouterCudaEdgeTest, GroupSummedCountsAsOnTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const MoeConfig config = With(Softmax(16, 4), [](MoeConfig& c) {
    c.aux_loss = AuxLossType::kSwitch;
    c.aux_loss_coeff = 0.05f;
    c.z_loss_coeff = 1e-3f;
  });
  const int64_t T = 200, E = 16;
  for (int draw = 0; draw < 3; ++draw) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    Problem p = MakeProblem(config, T, 0, seed);
    const Staged cpu_in = Stage(Cpu(), p, false), gpu_in = Stage(gpu, p, false);
    RouterOutput cpu_out, gpu_out;
    ASSERT_TRUE(ops::RouterForward(Cpu(), config, cpu_in.args, &cpu_out).ok());
    ASSERT_TRUE(ops::RouterForward(gpu, config, gpu_in.args, &gpu_out).ok());
    if (Read<int32_t>(gpu, gpu_out.topk_experts) != Read<int32_t>(Cpu(), cpu_out.topk_experts)) {
      continue;  // a near tie (the variant tests check selection): draw again
    }
    // Three ranks' worth of counts.
    std::vector<int64_t> group = Read<int64_t>(Cpu(), cpu_out.aux_counts);
    for (int64_t e = 0; e < E; ++e) group[e] = 3 * group[e] + e;
    group[E] = 3 * T;
    const TensorView group_view(group.data(), DType::kI64, {E + 1});
    cpu_out.aux_counts = test_util::ToDevice(Cpu(), group_view);
    gpu_out.aux_counts = test_util::ToDevice(gpu, group_view);
    ASSERT_TRUE(ops::RouterAuxLoss(Cpu(), config, cpu_in.args, &cpu_out).ok());
    ASSERT_TRUE(ops::RouterAuxLoss(gpu, config, gpu_in.args, &gpu_out).ok());
    ASSERT_TRUE(ops::RouterBackward(Cpu(), config, cpu_in.args, cpu_out, cpu_in.d_weights_view,
                                    cpu_in.d_logits_view, kLossWeight)
                    .ok());
    ASSERT_TRUE(ops::RouterBackward(gpu, config, gpu_in.args, gpu_out, gpu_in.d_weights_view,
                                    gpu_in.d_logits_view, kLossWeight)
                    .ok());
    const Result cpu = ReadResult(Cpu(), p, cpu_out, cpu_in);
    const Result cuda = ReadResult(gpu, p, gpu_out, gpu_in);
    EXPECT_NE(cpu.losses[0], 0.0f);
    ExpectNear(cuda.losses, cpu.losses, kLossTol, 0.0, "losses");
    ExpectNear(cuda.d_logits, cpu.d_logits, 0.0, kGradTol * MaxAbs(cpu.d_logits), "d_logits");

    // Counts of fewer tokens than T: InvalidArgument on the CPU; on the GPU, which does not
    // wait for the counts, a NaN aux loss and NaN gradients (router_cuda.h).
    group[E] = T - 1;
    gpu_out.aux_counts = test_util::ToDevice(gpu, group_view);
    cpu_out.aux_counts = test_util::ToDevice(Cpu(), group_view);
    ExpectError(ops::RouterAuxLoss(Cpu(), config, cpu_in.args, &cpu_out),
                "aux_counts: 199 tokens, fewer than this call's T = 200");
    ASSERT_TRUE(ops::RouterAuxLoss(gpu, config, gpu_in.args, &gpu_out).ok());
    ASSERT_TRUE(ops::RouterBackward(gpu, config, gpu_in.args, gpu_out, gpu_in.d_weights_view,
                                    gpu_in.d_logits_view, kLossWeight)
                    .ok());
    const Result poisoned = ReadResult(gpu, p, gpu_out, gpu_in);
    EXPECT_TRUE(std::isnan(poisoned.losses[0]));
    EXPECT_EQ(poisoned.losses[1], cuda.losses[1]);  // the z-loss is untouched
    EXPECT_TRUE(std::isnan(poisoned.d_logits[0]));
    return;
  }
  FAIL() << "three draws in a row had a selection that differed at a near tie";
}

TEST(RouterCudaEdgeTest, ZeroTokens) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const MoeConfig config = With(Sigmoid(8, 2), [](MoeConfig& c) {
    c.aux_loss = AuxLossType::kSequence;
    c.aux_loss_coeff = 0.1f;
    c.z_loss_coeff = 0.1f;
  });
  // Zero-row tensors still own memory (Tensor::Allocate never asks for 0 bytes).
  absl::StatusOr<Tensor> logits = Tensor::Allocate(gpu.allocator(), DType::kF32, {0, 8});
  absl::StatusOr<Tensor> d_weights = Tensor::Allocate(gpu.allocator(), DType::kF32, {0, 2});
  absl::StatusOr<Tensor> d_logits = Tensor::Allocate(gpu.allocator(), DType::kF32, {0, 8});
  ASSERT_TRUE(logits.ok() && d_weights.ok() && d_logits.ok());
  const Tensor bias = Upload(gpu, std::vector<float>(8, 0.25f));
  const RouterArgs args{logits->view(), bias.view(), 0};
  RouterOutput out;
  ASSERT_TRUE(ops::RouterForward(gpu, config, args, &out).ok());
  ASSERT_TRUE(ops::RouterAuxLoss(gpu, config, args, &out).ok());
  EXPECT_EQ(out.scores.dim(0), 0);
  EXPECT_EQ(Read<int64_t>(gpu, out.tokens_per_expert), std::vector<int64_t>(8, 0));
  EXPECT_EQ(Read<int64_t>(gpu, out.aux_counts), std::vector<int64_t>(9, 0));
  EXPECT_EQ(Read<float>(gpu, out.losses), (std::vector<float>{0.0f, 0.0f}));
  EXPECT_TRUE(ops::RouterBackward(gpu, config, args, out, *d_weights, *d_logits).ok());
}

// ---------------------------------------------------------------------------------------------
// The expert-bias update.
// ---------------------------------------------------------------------------------------------

TEST(UpdateExpertBiasCudaTest, BitIdenticalToTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  for (const int64_t E : {1, 5, 256, 1000}) {
    SCOPED_TRACE(testing::Message() << "E = " << E);
    std::mt19937 rng(FreshSeed());
    std::uniform_int_distribution<int64_t> count(0, 40);
    std::vector<int64_t> counts(E);
    for (int64_t& n : counts) n = count(rng);
    counts[0] = 20;  // some at the mean of a balanced pair
    if (E > 1) counts[E - 1] = 20;
    std::vector<float> bias;
    Fill(rng, &bias, E, 0.1f);
    std::vector<float> cpu_bias = bias;
    ASSERT_TRUE(
        UpdateExpertBias(counts, 1e-3f, TensorView(cpu_bias.data(), DType::kF32, {E})).ok());
    const Tensor gpu_counts = test_util::ToDevice(gpu, TensorView(counts.data(), DType::kI64, {E}));
    const Tensor gpu_bias = Upload(gpu, bias);
    ASSERT_TRUE(ops::UpdateExpertBias(gpu, gpu_counts, 1e-3f, gpu_bias).ok());
    EXPECT_TRUE(SameBits(Read<float>(gpu, gpu_bias), cpu_bias));
  }
}

TEST(UpdateExpertBiasCudaTest, NegativeCountIsRefusedAsOnTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const std::vector<int64_t> counts = {4, 2, 7, -3, 5, -1};
  const std::vector<float> bias = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
  std::vector<float> cpu_bias = bias;
  const absl::Status cpu =
      UpdateExpertBias(counts, 0.5f, TensorView(cpu_bias.data(), DType::kF32, {6}));
  const Tensor gpu_counts =
      test_util::ToDevice(gpu, TensorView(const_cast<int64_t*>(counts.data()), DType::kI64, {6}));
  const Tensor gpu_bias = Upload(gpu, bias);
  const absl::Status cuda = ops::UpdateExpertBias(gpu, gpu_counts, 0.5f, gpu_bias);
  EXPECT_EQ(cuda.code(), absl::StatusCode::kInvalidArgument) << cuda;
  EXPECT_EQ(cuda.message(), cpu.message());
  EXPECT_EQ(Read<float>(gpu, gpu_bias), bias);  // unchanged
}

}  // namespace
}  // namespace moetrain::router_test
