// The MoE layer on a GPU against the same layer on the CPU: forward and backward of one pass,
// from the same inputs, in f32 and bf16, for the routing modes the layer has (softmax before and
// after top-k, sigmoid with expert bias and group-limited top-k, shared experts, capacity with
// drops, an expert with no tokens, k = E); and the CUDA results bit-identical from run to run.
// Skips, naming why, where there is no GPU.
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/moe/moe_layer.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/moe/moe_test_util.h"

namespace moetrain::moe_test {
namespace {

using test_util::ToDevice;
using test_util::ToHost;

// A layer's inputs and grads on one device, and what one pass gave.
struct DeviceRun {
  Tensor out, d_x;            // host copies, compute dtype
  std::vector<Tensor> grads;  // host copies, f32: router, gate_up, down[, shared gate_up, down]
  MoeStats stats;
};

absl::Status RunOn(const ExecContext& ctx, const Problem& p, DeviceRun* run) {
  const EngineInputs host = ToEngine(p);
  const EngineGrads host_grads = MakeGrads(p, nullptr);
  const bool cpu = ctx.device().is_cpu();
  auto place = [&](const Tensor& t) { return t.empty() ? Tensor() : ToDevice(ctx, t); };
  // On the CPU the inputs are used where they are; on the GPU copied there.
  Tensor x = place(host.x), router = place(host.router), bias = place(host.expert_bias),
         gate_up = place(host.expert_gate_up), down = place(host.expert_down),
         shared_gate_up = place(host.shared_gate_up), shared_down = place(host.shared_down),
         d_out = place(host.d_out);
  std::vector<Tensor> grads;
  for (const Tensor* g : {&host_grads.router, &host_grads.expert_gate_up, &host_grads.expert_down,
                          &host_grads.shared_gate_up, &host_grads.shared_down}) {
    grads.push_back(place(*g));
  }
  absl::StatusOr<Tensor> out = Tensor::Allocate(ctx.allocator(), p.dtype, {p.tokens, p.hidden});
  absl::StatusOr<Tensor> d_x = Tensor::Allocate(ctx.allocator(), p.dtype, {p.tokens, p.hidden});
  if (!out.ok()) return out.status();
  if (!d_x.ok()) return d_x.status();
  absl::StatusOr<MoeLayer> layer = MoeLayer::Create(p.config, p.hidden, p.dtype, {}, ctx);
  if (!layer.ok()) return layer.status();
  const MoeWeights weights = {.router = router,
                              .expert_bias = bias,
                              .expert_gate_up = gate_up,
                              .expert_down = down,
                              .shared_gate_up = shared_gate_up,
                              .shared_down = shared_down};
  MOETRAIN_RETURN_IF_ERROR(layer->Forward(weights, x, p.tokens_per_sequence, *out, &run->stats));
  MoeGrads g = {.router = grads[0],
                .expert_gate_up = grads[1],
                .expert_down = grads[2],
                .shared_gate_up = grads[3],
                .shared_down = grads[4]};
  MOETRAIN_RETURN_IF_ERROR(layer->Backward(weights, d_out, *d_x, &g));
  MOETRAIN_RETURN_IF_ERROR(ctx.Synchronize());
  run->out = cpu ? *std::move(out) : ToHost(ctx, *out);
  run->d_x = cpu ? *std::move(d_x) : ToHost(ctx, *d_x);
  for (Tensor& grad : grads) {
    run->grads.push_back(grad.empty() || cpu ? std::move(grad) : ToHost(ctx, grad));
  }
  return absl::OkStatus();
}

constexpr const char* kGradNames[] = {"d_router", "d_expert_gate_up", "d_expert_down",
                                      "d_shared_gate_up", "d_shared_down"};

std::vector<LayerCase> CudaCases() {
  const MoeConfig softmax = {.num_experts = 8,
                             .top_k = 2,
                             .expert_ffn_dim = 40,
                             .aux_loss = AuxLossType::kSwitch,
                             .aux_loss_coeff = 0.01f,
                             .z_loss_coeff = 0.001f};
  MoeConfig after = softmax;
  after.softmax_before_topk = false;
  after.aux_loss = AuxLossType::kSequence;
  MoeConfig sigmoid = {.num_experts = 16,
                       .top_k = 4,
                       .expert_ffn_dim = 24,
                       .num_shared_experts = 1,
                       .score_function = ScoreFunction::kSigmoid,
                       .num_groups = 4,
                       .group_top_k = 2,
                       .expert_bias = true};
  sigmoid.routed_scaling_factor = 2.5f;
  MoeConfig capacity = softmax;
  capacity.capacity_factor = 0.5f;
  MoeConfig capacity_by_position = capacity;
  capacity_by_position.drop_policy = DropPolicy::kPosition;
  MoeConfig all = {.num_experts = 4, .top_k = 4, .expert_ffn_dim = 16};
  return {
      {.name = "softmax", .config = softmax, .tokens = 133, .hidden = 72, .seed = 3},
      {.name = "softmax_after_topk",
       .config = after,
       .tokens = 64,
       .hidden = 40,
       .tokens_per_sequence = 16,
       .seed = 4},
      {.name = "sigmoid_groups_shared", .config = sigmoid, .tokens = 97, .hidden = 56, .seed = 5},
      {.name = "capacity", .config = capacity, .tokens = 80, .hidden = 32, .seed = 6},
      {.name = "capacity_by_position",
       .config = capacity_by_position,
       .tokens = 80,
       .hidden = 32,
       .seed = 8},
      {.name = "dead_and_single_expert",
       .config = softmax,
       .tokens = 37,
       .hidden = 24,
       .init = Init::kDeadAndSingleExpert},
      {.name = "k_equals_e", .config = all, .tokens = 19, .hidden = 16, .seed = 7},
  };
}

using CudaParam = std::tuple<LayerCase, DType>;

class MoeLayerCudaTest : public ::testing::TestWithParam<CudaParam> {};

// Tolerances (‖gpu − cpu‖ / ‖cpu‖): both sides accumulate in f32, in different orders (cuBLASLt
// against oneDNN); bf16 outputs differ by the rounding of those sums (a few bf16 ulps at most).
double Tolerance(DType dtype) { return dtype == DType::kBF16 ? 1e-2 : 1e-5; }

TEST_P(MoeLayerCudaTest, MatchesTheCpuLayerAndRepeatsBitForBit) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const auto& [c, dtype] = GetParam();
  const Problem p = MakeProblem(c, dtype);
  DeviceRun on_cpu, on_gpu, again;
  ASSERT_OK(RunOn(ExecContext::Cpu(), p, &on_cpu));
  ASSERT_OK(RunOn(gpu, p, &on_gpu));
  ASSERT_OK(RunOn(gpu, p, &again));

  EXPECT_EQ(on_gpu.stats.tokens_per_expert, on_cpu.stats.tokens_per_expert);
  EXPECT_EQ(on_gpu.stats.dropped_tokens, on_cpu.stats.dropped_tokens);
  EXPECT_NEAR(on_gpu.stats.aux_loss, on_cpu.stats.aux_loss, 1e-5 * std::abs(on_cpu.stats.aux_loss));
  EXPECT_NEAR(on_gpu.stats.z_loss, on_cpu.stats.z_loss, 1e-5 * std::abs(on_cpu.stats.z_loss));
  const double tolerance = Tolerance(dtype);
  EXPECT_LT(RelativeError(ToDoubles(on_gpu.out), ToDoubles(on_cpu.out)), tolerance) << "out";
  EXPECT_LT(RelativeError(ToDoubles(on_gpu.d_x), ToDoubles(on_cpu.d_x)), tolerance) << "d_x";
  for (size_t i = 0; i < on_cpu.grads.size(); ++i) {
    if (on_cpu.grads[i].empty()) continue;
    EXPECT_LT(RelativeError(ToDoubles(on_gpu.grads[i]), ToDoubles(on_cpu.grads[i])), tolerance)
        << kGradNames[i];
  }

  EXPECT_TRUE(BitIdentical(on_gpu.out, again.out)) << "out";
  EXPECT_TRUE(BitIdentical(on_gpu.d_x, again.d_x)) << "d_x";
  for (size_t i = 0; i < on_gpu.grads.size(); ++i) {
    if (on_gpu.grads[i].empty()) continue;
    EXPECT_TRUE(BitIdentical(on_gpu.grads[i], again.grads[i])) << kGradNames[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, MoeLayerCudaTest,
                         ::testing::Combine(::testing::ValuesIn(CudaCases()),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const ::testing::TestParamInfo<CudaParam>& info) {
                           return std::get<0>(info.param).name + "_" +
                                  std::string(DTypeName(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace moetrain::moe_test
