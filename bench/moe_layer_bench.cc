// MoE layer benchmark: forward+backward time of the whole layer, of its grouped GEMMs and of its
// permutation, each against a plain operation of the same work measured in the same run, on the
// CPU or on one GPU. The options and the meaning of every field: Main and kHelpFooter (--help).
//
// Everything a configuration times is allocated and filled on the device before its first timed
// call; every time is the median of --reps calls after one warm-up call, each call bracketed by
// ctx.Synchronize() and std::chrono::steady_clock (the engine exposes no CUDA types, and a
// synchronised wall clock includes everything the op queued). A measurement that fails (say an op
// this build serves only on the CPU) becomes an "errors" entry of its configuration, and the
// others still run. Progress goes to stderr, the report to stdout.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_device.h"
#include "bench/bench_flags.h"
#include "engine/backend/device_query.h"
#include "engine/backend/exec_context.h"
#include "engine/core/rng.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/core/thread_pool.h"
#include "engine/fp8/fp8_recipe.h"
#include "engine/fp8/fp8_state.h"
#include "engine/fp8/linear.h"
#include "engine/moe/moe_layer.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/gemm/gemm.h"
#include "engine/ops/grouped_gemm/grouped_gemm.h"
#include "engine/ops/permute/permute.h"
#include "engine/ops/router/router.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

// The end of --help, after the options.
constexpr char kHelpFooter[] =
    R"(Configurations (T tokens, d hidden, F expert FFN width, E experts, k experts per token):
  name         T      d     F     E   k  routing                                        default on
  tiny         512    256   256   8   2  softmax                                        (smoke runs)
  small        4096   512   1024  8   2  softmax                                        cpu
  medium       8192   1024  2048  16  2  softmax                                        cpu
  dslike       4096   512   256   64  6  sigmoid + expert bias, 8 groups, group top-4   cpu
  dsv3         4096   7168  2048  32  8  sigmoid + expert bias, 8 groups, group top-4,  cuda
                                         scaling 2.5 (DeepSeek-V3's experts, 32 of them)
  small-gpu    16384  1024  2048  8   2  small scaled up: 4x tokens, 2x d and F        cuda
  medium-gpu   32768  2048  4096  16  2  medium scaled up likewise                     cuda
  dslike-gpu   16384  1024  512   64  6  dslike scaled up likewise                     cuda
Any configuration runs on any device when named (dsv3 on the CPU takes a very long time).

Output: {"machine": {...}, "results": [one object per configuration and dtype]}.
  machine: device, threads, devices found, dense_gemm_gflops {f32, bf16} of one n^3 GEMM on the
    device (n = dense_gemm_n: 2048 on the CPU, 8192 on a GPU).
  per result (R = T*k permuted rows; times in ms):
    fwd_bwd_ms, tokens_per_s: MoeLayer::Forward + Backward; max_mean_load_ratio of its routing.
    expert_gemm_gflops, grouped_gemm_ms, dense_gemm_ms, grouped_gemm_efficiency,
      layer_efficiency: the six expert GEMMs of forward+backward (gate_up and down; forward,
      backward data, backward weight) over the routed ragged groups, against the same six with
      all R rows in one group; efficiency = dense time / grouped (or whole layer) time.
    grouped_gemm_fwd_ms, grouped_gemm_fwd_tflops: the forward's two expert GEMMs alone
      (ops::GroupedGemmForward over the ragged offsets of a real routing of the layer's input);
      dense_gemm_fwd_ms, dense_gemm_fwd_tflops: ops::Gemm of the same M = R, N and K (cuBLAS on a
      GPU); grouped_gemm_fwd_ratio = grouped TFLOP/s / dense TFLOP/s, target 0.8 (an H200 goal,
      printed, never asserted).
    permute_* (ops::GatherRows of x into the R expert-major rows) and unpermute_*
      (ops::CombineRows of the R f32 expert outputs back into T tokens): _ms, _gb_per_s (bytes
      read + written, index and weight tensors included), _copy_gb_per_s (ops::CopyTensor
      device to device of the same bytes; on the CPU a single memcpy), _ratio = op GB/s / copy
      GB/s, target 0.7 (printed, never asserted).
    errors: {measurement: message}, only when one failed.
  FP8 results (dtype fp8-<recipe>) also have recipe, compute_dtype (bf16), and:
    emulated: true on the CPU, which quantises, dequantises and multiplies in f32: there the
      times measure the cost of the exact emulation, NOT FP8 speed. True on a GPU for mxfp8
      (Hopper has no MXFP8 GEMM: quantised, dequantised to bf16 and multiplied in bf16); false
      for the other recipes on a GPU (cuBLASLt FP8 GEMMs).
    fwd_bwd_ms includes Fp8State::EndStep (the step's amax reduction and delayed-scaling
      update; the trainer runs it once per step for all layers). The expert GEMMs go through
      engine/fp8/linear.h (quantise each operand, then the FP8 GEMM); the permutation is the
      bf16 one and is not measured again.
    bf16_fwd_bwd_ms; fwd_bwd_speedup_vs_bf16 = bf16 time / FP8 time (below 1 on the CPU);
      grouped_gemm_fwd_tflops_vs_bf16 and expert_gemm_gflops_vs_bf16: FP8 rate / bf16 rate of
      the same shapes (on a GPU, FP8 TFLOP/s against bf16).

Exit status: 0 every measurement ran; 1 one or more failed (the report is still printed, with
  "errors"); 2 bad usage; 77 --device cuda and no usable GPU ("no GPU: <reason>" on stderr).
)";

// A --dtype: the compute dtype, and an FP8 recipe for the expert GEMMs or none.
struct BenchDType {
  std::string name;
  DType compute;
  std::optional<Fp8RecipeKind> fp8;
};

std::vector<BenchDType> BenchDTypes() {
  return {{"f32", DType::kF32, std::nullopt},
          {"bf16", DType::kBF16, std::nullopt},
          {"fp8-delayed", DType::kBF16, Fp8RecipeKind::kDelayed},
          {"fp8-current", DType::kBF16, Fp8RecipeKind::kCurrent},
          {"fp8-blockwise", DType::kBF16, Fp8RecipeKind::kBlockwise},
          {"fp8-mxfp8", DType::kBF16, Fp8RecipeKind::kMxfp8}};
}

// The recipe as a job spec gets it by default (job-spec.md): blockwise with power-of-two scales.
Fp8RecipeConfig BenchRecipe(Fp8RecipeKind kind) {
  Fp8RecipeConfig config;
  config.recipe = kind;
  config.pow2_scales = kind == Fp8RecipeKind::kBlockwise;
  return config;
}

constexpr double kGroupedGemmTarget = 0.8;
constexpr double kPermutationTarget = 0.7;

struct BenchConfig {
  std::string name;
  int64_t tokens, hidden;
  MoeConfig moe;
  bool default_cpu = false, default_cuda = false;
};

MoeConfig Softmax(int64_t experts, int64_t top_k, int64_t ffn) {
  MoeConfig moe;
  moe.num_experts = experts;
  moe.top_k = top_k;
  moe.expert_ffn_dim = ffn;
  return moe;
}

MoeConfig GroupedSigmoid(int64_t experts, int64_t top_k, int64_t ffn) {
  MoeConfig moe = Softmax(experts, top_k, ffn);
  moe.score_function = ScoreFunction::kSigmoid;
  moe.expert_bias = true;
  moe.num_groups = 8;
  moe.group_top_k = 4;
  return moe;
}

std::vector<BenchConfig> Configs() {
  MoeConfig dsv3 = GroupedSigmoid(32, 8, 2048);
  dsv3.routed_scaling_factor = 2.5f;
  return {
      {"tiny", 512, 256, Softmax(8, 2, 256)},
      {"small", 4096, 512, Softmax(8, 2, 1024), true, false},
      {"medium", 8192, 1024, Softmax(16, 2, 2048), true, false},
      {"dslike", 4096, 512, GroupedSigmoid(64, 6, 256), true, false},
      {"dsv3", 4096, 7168, dsv3, false, true},
      {"small-gpu", 16384, 1024, Softmax(8, 2, 2048), false, true},
      {"medium-gpu", 32768, 2048, Softmax(16, 2, 4096), false, true},
      {"dslike-gpu", 16384, 1024, GroupedSigmoid(64, 6, 512), false, true},
  };
}

// Median seconds of `reps` calls of `fn` after one warm-up call.
absl::StatusOr<double> MedianSeconds(const ExecContext& ctx, int reps,
                                     const std::function<absl::Status()>& fn) {
  MOETRAIN_RETURN_IF_ERROR(fn());
  MOETRAIN_RETURN_IF_ERROR(ctx.Synchronize());
  std::vector<double> seconds;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    MOETRAIN_RETURN_IF_ERROR(fn());
    MOETRAIN_RETURN_IF_ERROR(ctx.Synchronize());
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return std::max(seconds[seconds.size() / 2], 1e-12);
}

absl::StatusOr<Tensor> Allocate(const ExecContext& ctx, DType dtype,
                                std::initializer_list<int64_t> shape) {
  return Tensor::Allocate(ctx.allocator(), dtype, shape);
}

// N(0, stddev²) values on ctx's device, drawn there in f32 (Philox stream `stream`) and rounded
// to `dtype` there: no multi-GB host fill and copy for the large shapes.
absl::StatusOr<Tensor> RandomTensor(const ExecContext& ctx, DType dtype,
                                    std::initializer_list<int64_t> shape, float stddev,
                                    uint32_t stream) {
  MOETRAIN_ASSIGN_OR_RETURN(Tensor f32, Allocate(ctx, DType::kF32, shape));
  MOETRAIN_RETURN_IF_ERROR(
      ops::FillNormal(ctx, f32, Rng(/*seed=*/1234, /*step=*/0, /*rank=*/0, stream), 0.0f, stddev));
  if (dtype == DType::kF32) return f32;
  MOETRAIN_ASSIGN_OR_RETURN(Tensor t, Allocate(ctx, dtype, shape));
  // The f32 block is freed while the conversion may still be queued: the allocator's
  // stream-ordered reuse makes that safe.
  MOETRAIN_RETURN_IF_ERROR(ops::ConvertTensor(ctx, f32, t));
  return t;
}

absl::StatusOr<Tensor> Zeros(const ExecContext& ctx, DType dtype,
                             std::initializer_list<int64_t> shape) {
  MOETRAIN_ASSIGN_OR_RETURN(Tensor t, Allocate(ctx, dtype, shape));
  MOETRAIN_RETURN_IF_ERROR(ops::Fill(ctx, t, 0.0f));
  return t;
}

// A copy on ctx's device of the host tensor `host`.
absl::StatusOr<Tensor> ToContext(const ExecContext& ctx, const Tensor& host) {
  MOETRAIN_ASSIGN_OR_RETURN(Tensor t,
                            Tensor::Allocate(ctx.allocator(), host.dtype(), host.view().shape()));
  MOETRAIN_RETURN_IF_ERROR(ops::CopyTensor(ctx, host, t));
  return t;
}

// What every measurement of one configuration reads, on ctx's device.
struct LayerInputs {
  Tensor router;       // (E, D) f32
  Tensor expert_bias;  // (E) f32
  Tensor w_gate_up;    // (E, 2F, D) compute dtype
  Tensor w_down;       // (E, D, F) compute dtype
  Tensor x;            // (T, D) compute dtype
  // The layer's routing of x, computed on the host as its first Forward does (logits = x·routerᵀ
  // in f32 with x widened from the compute dtype, then the router and the permutation).
  std::vector<int64_t> offsets;  // (E + 1) host: permuted rows of each expert
  Tensor row_token;              // (R) i32
  Tensor pair_row;               // (T, k) i32
  Tensor topk_weights;           // (T, k) f32
};

absl::Status MakeInputs(const ExecContext& ctx, const BenchConfig& bc, DType dtype,
                        LayerInputs* in) {
  const MoeConfig& moe = bc.moe;
  const int64_t t = bc.tokens, d = bc.hidden, e = moe.num_experts, f = moe.expert_ffn_dim;
  MOETRAIN_RETURN_IF_ERROR(moe.Validate());
  MOETRAIN_ASSIGN_OR_RETURN(in->w_gate_up, RandomTensor(ctx, dtype, {e, 2 * f, d}, 0.02f, 12));
  MOETRAIN_ASSIGN_OR_RETURN(in->w_down, RandomTensor(ctx, dtype, {e, d, f}, 0.02f, 13));

  // Router, bias and x start on the host, which routes them.
  const ExecContext cpu = ExecContext::Cpu();
  MOETRAIN_ASSIGN_OR_RETURN(Tensor router, RandomTensor(cpu, DType::kF32, {e, d}, 0.02f, 10));
  MOETRAIN_ASSIGN_OR_RETURN(Tensor bias, RandomTensor(cpu, DType::kF32, {e}, 0.01f, 11));
  MOETRAIN_ASSIGN_OR_RETURN(Tensor x, RandomTensor(cpu, dtype, {t, d}, 1.0f, 14));
  Tensor x_wide = Tensor::Empty(DType::kF32, {t, d});
  MOETRAIN_RETURN_IF_ERROR(ops::ConvertTensor(cpu, x, x_wide));
  Tensor logits = Tensor::Empty(DType::kF32, {t, e});
  MOETRAIN_RETURN_IF_ERROR(
      ops::Gemm(cpu, {.a = x_wide, .b = router, .c = logits, .trans_b = true}));
  ops::RouterOutput routing;
  MOETRAIN_RETURN_IF_ERROR(ops::RouterForward(cpu, moe, {logits, bias, 0}, &routing));
  const int64_t* counts = routing.tokens_per_expert.data<int64_t>();
  in->offsets = ops::PermutedExpertOffsets(moe, t, absl::MakeConstSpan(counts, e));
  ops::Permutation permutation;
  MOETRAIN_RETURN_IF_ERROR(ops::BuildPermutation(cpu, moe,
                                                 {.topk_experts = routing.topk_experts,
                                                  .topk_weights = routing.topk_weights,
                                                  .expert_offsets = in->offsets},
                                                 &permutation));

  MOETRAIN_ASSIGN_OR_RETURN(in->router, ToContext(ctx, router));
  MOETRAIN_ASSIGN_OR_RETURN(in->expert_bias, ToContext(ctx, bias));
  MOETRAIN_ASSIGN_OR_RETURN(in->x, ToContext(ctx, x));
  MOETRAIN_ASSIGN_OR_RETURN(in->row_token, ToContext(ctx, permutation.row_token));
  MOETRAIN_ASSIGN_OR_RETURN(in->pair_row, ToContext(ctx, permutation.pair_row));
  MOETRAIN_ASSIGN_OR_RETURN(in->topk_weights, ToContext(ctx, routing.topk_weights));
  return ctx.Synchronize();
}

// MoeLayer::Forward + Backward on ctx.
absl::Status MeasureLayer(const ExecContext& ctx, const BenchConfig& bc, const BenchDType& bench,
                          int reps, const LayerInputs& in, nlohmann::json& result) {
  const DType dtype = bench.compute;
  const MoeConfig& moe = bc.moe;
  const int64_t t = bc.tokens, d = bc.hidden, e = moe.num_experts, f = moe.expert_ffn_dim;
  MOETRAIN_ASSIGN_OR_RETURN(Tensor d_out, RandomTensor(ctx, dtype, {t, d}, 1.0f, 15));
  MOETRAIN_ASSIGN_OR_RETURN(Tensor out, Allocate(ctx, dtype, {t, d}));
  MOETRAIN_ASSIGN_OR_RETURN(Tensor d_x, Allocate(ctx, dtype, {t, d}));
  MOETRAIN_ASSIGN_OR_RETURN(Tensor g_router, Zeros(ctx, DType::kF32, {e, d}));
  MOETRAIN_ASSIGN_OR_RETURN(Tensor g_gate_up, Zeros(ctx, DType::kF32, {e, 2 * f, d}));
  MOETRAIN_ASSIGN_OR_RETURN(Tensor g_down, Zeros(ctx, DType::kF32, {e, d, f}));
  MoeGrads grads = {.router = g_router,
                    .expert_gate_up = g_gate_up,
                    .expert_down = g_down,
                    .shared_gate_up = {},
                    .shared_down = {}};
  const MoeWeights weights = {.router = in.router,
                              .expert_bias = moe.expert_bias ? in.expert_bias.view() : TensorView(),
                              .expert_gate_up = in.w_gate_up,
                              .expert_down = in.w_down,
                              .shared_gate_up = {},
                              .shared_down = {}};
  // Declared before the layer, which keeps a pointer to it.
  std::unique_ptr<Fp8State> fp8;
  if (bench.fp8.has_value()) {
    const Fp8RecipeConfig recipe = BenchRecipe(*bench.fp8);
    MOETRAIN_RETURN_IF_ERROR(recipe.Validate());
    fp8 = std::make_unique<Fp8State>(recipe, ctx);
  }
  MOETRAIN_ASSIGN_OR_RETURN(MoeLayer layer,
                            MoeLayer::Create(moe, d, dtype, {}, ctx, fp8.get(), "mlp"));
  if (fp8 != nullptr) MOETRAIN_RETURN_IF_ERROR(fp8->Allocate());
  MoeStats stats;
  // With FP8 each call is a training step's share of the layer: its EndStep included, so that
  // delayed scaling quantises with the scales of the calls before, as in training.
  MOETRAIN_ASSIGN_OR_RETURN(
      const double seconds, MedianSeconds(ctx, reps, [&]() -> absl::Status {
        MOETRAIN_RETURN_IF_ERROR(layer.Forward(weights, in.x, 0, out, &stats));
        MOETRAIN_RETURN_IF_ERROR(layer.Backward(weights, d_out, d_x, &grads));
        return fp8 != nullptr ? fp8->EndStep(nullptr) : absl::OkStatus();
      }));
  result["fwd_bwd_ms"] = seconds * 1e3;
  result["tokens_per_s"] = t / seconds;
  result["max_mean_load_ratio"] = stats.max_mean_load_ratio;
  return absl::OkStatus();
}

// The expert GEMMs of an FP8 dtype (engine/fp8/linear.h), in their own Fp8State: the grouped
// gate_up and down of E experts, and DenseForward's two plain linears.
struct Fp8ExpertLinears {
  explicit Fp8ExpertLinears(const Fp8RecipeConfig& recipe, const ExecContext& ctx, int64_t e)
      : state(recipe, ctx),
        gate_up(ctx, &state, state.Register("bench.experts.gate_up_proj", e)),
        down(ctx, &state, state.Register("bench.experts.down_proj", e)),
        dense_gate_up(ctx, &state, state.Register("bench.dense.gate_up_proj", 1)),
        dense_down(ctx, &state, state.Register("bench.dense.down_proj", 1)) {}

  Fp8State state;  // first: the linears register in it as they are built
  GroupedLinear gate_up, down;
  Linear dense_gate_up, dense_down;
};

// The expert GEMMs over random rows (their time does not depend on the values), R rows.
struct ExpertGemms {
  Tensor x, activated, d_out, d_gate_up;  // (R, D), (R, F), (R, D), (R, 2F) compute dtype
  Tensor gate_up, out, d_activated, d_x;  // (R, 2F), (R, D), (R, F), (R, D) f32
  Tensor d_w_gate_up, d_w_down;           // (E, 2F, D), (E, D, F) f32
  const Fp8ExpertLinears* fp8 = nullptr;  // FP8 GEMMs when set

  static absl::StatusOr<ExpertGemms> Create(const ExecContext& ctx, DType dtype, int64_t rows,
                                            int64_t d, int64_t f, int64_t e) {
    ExpertGemms g;
    MOETRAIN_ASSIGN_OR_RETURN(g.x, RandomTensor(ctx, dtype, {rows, d}, 1.0f, 20));
    MOETRAIN_ASSIGN_OR_RETURN(g.activated, RandomTensor(ctx, dtype, {rows, f}, 1.0f, 21));
    MOETRAIN_ASSIGN_OR_RETURN(g.d_out, RandomTensor(ctx, dtype, {rows, d}, 1.0f, 22));
    MOETRAIN_ASSIGN_OR_RETURN(g.d_gate_up, RandomTensor(ctx, dtype, {rows, 2 * f}, 1.0f, 23));
    MOETRAIN_ASSIGN_OR_RETURN(g.gate_up, Allocate(ctx, DType::kF32, {rows, 2 * f}));
    MOETRAIN_ASSIGN_OR_RETURN(g.out, Allocate(ctx, DType::kF32, {rows, d}));
    MOETRAIN_ASSIGN_OR_RETURN(g.d_activated, Allocate(ctx, DType::kF32, {rows, f}));
    MOETRAIN_ASSIGN_OR_RETURN(g.d_x, Allocate(ctx, DType::kF32, {rows, d}));
    MOETRAIN_ASSIGN_OR_RETURN(g.d_w_gate_up, Allocate(ctx, DType::kF32, {e, 2 * f, d}));
    MOETRAIN_ASSIGN_OR_RETURN(g.d_w_down, Allocate(ctx, DType::kF32, {e, d, f}));
    return g;
  }

  // Forward: gate_up = x·w_gate_upᵀ and out = activated·w_downᵀ, per group.
  absl::Status Forward(const ExecContext& ctx, TensorView w_gate_up, TensorView w_down,
                       absl::Span<const int64_t> offsets) {
    if (fp8 != nullptr) {
      MOETRAIN_RETURN_IF_ERROR(fp8->gate_up.Forward(x, w_gate_up, offsets, 0, gate_up));
      return fp8->down.Forward(activated, w_down, offsets, 0, out);
    }
    MOETRAIN_RETURN_IF_ERROR(ops::GroupedGemmForward(ctx, x, w_gate_up, offsets, gate_up));
    return ops::GroupedGemmForward(ctx, activated, w_down, offsets, out);
  }

  // The six products of forward + backward; w_* hold one matrix per group.
  absl::Status ForwardBackward(const ExecContext& ctx, TensorView w_gate_up, TensorView w_down,
                               absl::Span<const int64_t> offsets) {
    const int64_t groups = w_down.dim(0);
    MOETRAIN_RETURN_IF_ERROR(Forward(ctx, w_gate_up, w_down, offsets));
    if (fp8 != nullptr) {
      MOETRAIN_RETURN_IF_ERROR(fp8->down.BackwardData(d_out, w_down, offsets, 0, d_activated));
      MOETRAIN_RETURN_IF_ERROR(fp8->down.BackwardWeight(d_out, activated, offsets, 0,
                                                        d_w_down.view().Slice(0, groups), false));
      MOETRAIN_RETURN_IF_ERROR(fp8->gate_up.BackwardData(d_gate_up, w_gate_up, offsets, 0, d_x));
      return fp8->gate_up.BackwardWeight(d_gate_up, x, offsets, 0,
                                         d_w_gate_up.view().Slice(0, groups), false);
    }
    MOETRAIN_RETURN_IF_ERROR(
        ops::GroupedGemmBackwardData(ctx, d_out, w_down, offsets, d_activated));
    MOETRAIN_RETURN_IF_ERROR(ops::GroupedGemmBackwardWeight(
        ctx, d_out, activated, offsets, d_w_down.view().Slice(0, groups), false));
    MOETRAIN_RETURN_IF_ERROR(ops::GroupedGemmBackwardData(ctx, d_gate_up, w_gate_up, offsets, d_x));
    return ops::GroupedGemmBackwardWeight(ctx, d_gate_up, x, offsets,
                                          d_w_gate_up.view().Slice(0, groups), false);
  }

  // The forward's two products as dense GEMMs of the same M = R, N and K (expert 0's weights).
  absl::Status DenseForward(const ExecContext& ctx, TensorView w_gate_up, TensorView w_down) {
    if (fp8 != nullptr) {
      MOETRAIN_RETURN_IF_ERROR(fp8->dense_gate_up.Forward(x, w_gate_up.Select(0), gate_up));
      return fp8->dense_down.Forward(activated, w_down.Select(0), out);
    }
    MOETRAIN_RETURN_IF_ERROR(
        ops::Gemm(ctx, {.a = x, .b = w_gate_up.Select(0), .c = gate_up, .trans_b = true}));
    return ops::Gemm(ctx, {.a = activated, .b = w_down.Select(0), .c = out, .trans_b = true});
  }
};

absl::Status MeasureExpertGemms(const ExecContext& ctx, const BenchConfig& bc,
                                const BenchDType& bench, int reps, const LayerInputs& in,
                                nlohmann::json& result) {
  const int64_t d = bc.hidden, e = bc.moe.num_experts, f = bc.moe.expert_ffn_dim;
  const int64_t rows = in.offsets.back();
  MOETRAIN_ASSIGN_OR_RETURN(ExpertGemms gemms,
                            ExpertGemms::Create(ctx, bench.compute, rows, d, f, e));
  const TensorView w_gate_up = in.w_gate_up, w_down = in.w_down;
  const std::vector<int64_t> one_group = {0, rows};
  std::unique_ptr<Fp8ExpertLinears> fp8;
  if (bench.fp8.has_value()) {
    fp8 = std::make_unique<Fp8ExpertLinears>(BenchRecipe(*bench.fp8), ctx, e);
    MOETRAIN_RETURN_IF_ERROR(fp8->state.Allocate());
    gemms.fp8 = fp8.get();
    // One step first, so that delayed scaling quantises with scales that fit the values (its
    // scales start at 1); the other recipes' EndStep only resets the statistics.
    MOETRAIN_RETURN_IF_ERROR(gemms.ForwardBackward(ctx, w_gate_up, w_down, in.offsets));
    MOETRAIN_RETURN_IF_ERROR(gemms.DenseForward(ctx, w_gate_up, w_down));
    MOETRAIN_RETURN_IF_ERROR(fp8->state.EndStep(nullptr));
  }

  // The forward's products alone, grouped against cuBLAS-style dense.
  MOETRAIN_ASSIGN_OR_RETURN(const double grouped_fwd, MedianSeconds(ctx, reps, [&] {
                              return gemms.Forward(ctx, w_gate_up, w_down, in.offsets);
                            }));
  MOETRAIN_ASSIGN_OR_RETURN(const double dense_fwd, MedianSeconds(ctx, reps, [&] {
                              return gemms.DenseForward(ctx, w_gate_up, w_down);
                            }));
  const double fwd_flops = 6.0 * rows * d * f;
  result["grouped_gemm_fwd_ms"] = grouped_fwd * 1e3;
  result["grouped_gemm_fwd_tflops"] = fwd_flops / grouped_fwd / 1e12;
  result["dense_gemm_fwd_ms"] = dense_fwd * 1e3;
  result["dense_gemm_fwd_tflops"] = fwd_flops / dense_fwd / 1e12;
  result["grouped_gemm_fwd_ratio"] = dense_fwd / grouped_fwd;
  result["grouped_gemm_fwd_target"] = kGroupedGemmTarget;

  // All six products, grouped against one group of all rows.
  MOETRAIN_ASSIGN_OR_RETURN(const double grouped, MedianSeconds(ctx, reps, [&] {
                              return gemms.ForwardBackward(ctx, w_gate_up, w_down, in.offsets);
                            }));
  MOETRAIN_ASSIGN_OR_RETURN(const double dense, MedianSeconds(ctx, reps, [&] {
                              return gemms.ForwardBackward(ctx, w_gate_up.Slice(0, 1),
                                                           w_down.Slice(0, 1), one_group);
                            }));
  result["expert_gemm_gflops"] = 18.0 * rows * d * f / grouped / 1e9;
  result["grouped_gemm_ms"] = grouped * 1e3;
  result["dense_gemm_ms"] = dense * 1e3;
  result["grouped_gemm_efficiency"] = dense / grouped;
  if (result.contains("fwd_bwd_ms")) {
    result["layer_efficiency"] = dense / (result["fwd_bwd_ms"].get<double>() / 1e3);
  }
  return absl::OkStatus();
}

// Permute (gather into expert-major rows) and unpermute (weighted combine back into tokens),
// each against a device-to-device copy that reads and writes as many bytes.
absl::Status MeasurePermutation(const ExecContext& ctx, const BenchConfig& bc, DType dtype,
                                int reps, const LayerInputs& in, nlohmann::json& result) {
  const int64_t t = bc.tokens, d = bc.hidden, k = bc.moe.top_k;
  const int64_t rows = in.offsets.back();
  const double act = static_cast<double>(DTypeSize(dtype));
  // Gather: each row read and written once, plus the (R) i32 index.
  const double permute_bytes = 2.0 * rows * d * act + 4.0 * rows;
  // Combine: the (R, D) f32 rows and the (T, k) i32 rows and f32 weights read, (T, D) written.
  const double unpermute_bytes = 4.0 * rows * d + 8.0 * t * k + act * t * d;
  // The copy's f32 elements, each read and written: 8 bytes of traffic.
  const auto copy_elements = [](double bytes) {
    return std::max<int64_t>(1, std::llround(bytes / 8.0));
  };
  const int64_t copy_max = std::max(copy_elements(permute_bytes), copy_elements(unpermute_bytes));

  MOETRAIN_ASSIGN_OR_RETURN(Tensor permuted, Allocate(ctx, dtype, {rows, d}));
  MOETRAIN_ASSIGN_OR_RETURN(Tensor expert_out, RandomTensor(ctx, DType::kF32, {rows, d}, 1.0f, 30));
  MOETRAIN_ASSIGN_OR_RETURN(Tensor combined, Allocate(ctx, dtype, {t, d}));
  MOETRAIN_ASSIGN_OR_RETURN(Tensor copy_src, Zeros(ctx, DType::kF32, {copy_max}));
  MOETRAIN_ASSIGN_OR_RETURN(Tensor copy_dst, Allocate(ctx, DType::kF32, {copy_max}));

  struct Op {
    const char* name;
    double bytes;
    std::function<absl::Status()> run;
  };
  const Op op_list[] = {{"permute", permute_bytes,
                         [&] { return ops::GatherRows(ctx, in.x, in.row_token, permuted); }},
                        {"unpermute", unpermute_bytes, [&] {
                           return ops::CombineRows(ctx, expert_out, in.pair_row, in.topk_weights,
                                                   {}, combined);
                         }}};
  for (const Op& op : op_list) {
    const int64_t n = copy_elements(op.bytes);
    const TensorView src = copy_src.view().Slice(0, n), dst = copy_dst.view().Slice(0, n);
    MOETRAIN_ASSIGN_OR_RETURN(const double op_seconds, MedianSeconds(ctx, reps, op.run));
    MOETRAIN_ASSIGN_OR_RETURN(const double copy_seconds, MedianSeconds(ctx, reps, [&] {
                                return ops::CopyTensor(ctx, src, dst);
                              }));
    const double op_gbps = op.bytes / op_seconds / 1e9, copy_gbps = 8.0 * n / copy_seconds / 1e9;
    const std::string name = op.name;
    result[name + "_ms"] = op_seconds * 1e3;
    result[name + "_gb_per_s"] = op_gbps;
    result[name + "_copy_gb_per_s"] = copy_gbps;
    result[name + "_ratio"] = op_gbps / copy_gbps;
    result[name + "_target"] = kPermutationTarget;
  }
  return absl::OkStatus();
}

// Records a failed measurement in result["errors"] and on stderr; true when it ran.
bool Record(const std::string& config, const char* what, const absl::Status& status,
            nlohmann::json& result) {
  if (status.ok()) return true;
  result["errors"][what] = status.ToString();
  std::fprintf(stderr, "moe_layer_bench: %s %s failed: %s\n", config.c_str(), what,
               status.ToString().c_str());
  return false;
}

nlohmann::json RunConfig(const ExecContext& ctx, const BenchConfig& bc, const BenchDType& bench,
                         int reps) {
  const MoeConfig& moe = bc.moe;
  const DType dtype = bench.compute;
  const std::string& dtype_name = bench.name;
  std::fprintf(stderr, "moe_layer_bench: %s %s on %s (T=%ld D=%ld F=%ld E=%ld k=%ld)...\n",
               bc.name.c_str(), dtype_name.c_str(), ctx.device().DebugString().c_str(), bc.tokens,
               bc.hidden, moe.expert_ffn_dim, moe.num_experts, moe.top_k);
  nlohmann::json result = {
      {"config", bc.name},
      {"dtype", dtype_name},
      {"tokens", bc.tokens},
      {"hidden", bc.hidden},
      {"expert_ffn_dim", moe.expert_ffn_dim},
      {"experts", moe.num_experts},
      {"top_k", moe.top_k},
  };
  if (bench.fp8.has_value()) {
    result["recipe"] = std::string(Fp8RecipeName(*bench.fp8));
    result["compute_dtype"] = std::string(DTypeName(dtype));
    // Hopper multiplies MXFP8 in bf16 after dequantising (docs/fp8.md); the CPU emulates all.
    result["emulated"] = ctx.device().is_cpu() || *bench.fp8 == Fp8RecipeKind::kMxfp8;
  }
  LayerInputs inputs;
  if (Record(bc.name, "inputs", MakeInputs(ctx, bc, dtype, &inputs), result)) {
    result["rows"] = inputs.offsets.back();
    Record(bc.name, "layer", MeasureLayer(ctx, bc, bench, reps, inputs, result), result);
    Record(bc.name, "expert_gemms", MeasureExpertGemms(ctx, bc, bench, reps, inputs, result),
           result);
    if (!bench.fp8.has_value()) {
      Record(bc.name, "permutation", MeasurePermutation(ctx, bc, dtype, reps, inputs, result),
             result);
    }
  }
  std::fprintf(stderr, "  %s\n", result.dump().c_str());
  return result;
}

// The machine's baseline: one dense n³ GEMM per dtype on ctx's device.
nlohmann::json Machine(const ExecContext& ctx, int reps, bool* ok) {
  const int64_t n = ctx.device().is_cpu() ? 2048 : 8192;
  nlohmann::json machine = {{"device", ctx.device().DebugString()},
                            {"threads", DefaultThreadPool().num_threads()},
                            {"devices", DescribeDevices(QueryDevices())},
                            {"dense_gemm_n", n}};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const std::string name(DTypeName(dtype));
    absl::StatusOr<double> flops = ops::MeasureGemmFlops(ctx, dtype, n, reps);
    if (flops.ok()) {
      machine["dense_gemm_gflops"][name] = *flops / 1e9;
    } else {
      *ok = false;
      machine["errors"]["dense_gemm_" + name] = flops.status().ToString();
      std::fprintf(stderr, "moe_layer_bench: dense %s GEMM failed: %s\n", name.c_str(),
                   flops.status().ToString().c_str());
    }
  }
  return machine;
}

// Each FP8 result against the bf16 result of the same configuration (when both measured it).
void CompareWithBf16(nlohmann::json& results) {
  for (nlohmann::json& r : results) {
    if (!r.contains("recipe")) continue;
    for (const nlohmann::json& bf16 : results) {
      if (bf16["dtype"] != "bf16" || bf16["config"] != r["config"]) continue;
      const auto ratio = [&](const char* fp8_key, const char* bf16_key, const char* out,
                             bool inverse) {
        if (!r.contains(fp8_key) || !bf16.contains(bf16_key)) return;
        const double a = r[fp8_key].get<double>(), b = bf16[bf16_key].get<double>();
        if (a > 0 && b > 0) r[out] = inverse ? b / a : a / b;
      };
      if (bf16.contains("fwd_bwd_ms")) r["bf16_fwd_bwd_ms"] = bf16["fwd_bwd_ms"];
      ratio("fwd_bwd_ms", "fwd_bwd_ms", "fwd_bwd_speedup_vs_bf16", true);
      ratio("grouped_gemm_fwd_tflops", "grouped_gemm_fwd_tflops", "grouped_gemm_fwd_tflops_vs_bf16",
            false);
      ratio("expert_gemm_gflops", "expert_gemm_gflops", "expert_gemm_gflops_vs_bf16", false);
    }
  }
}

// "12.345" or "-" for a field a failed measurement left out.
std::string Field(const nlohmann::json& r, const char* key, const char* format) {
  if (!r.contains(key)) return "-";
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), format, r[key].get<double>());
  return buffer;
}

void PrintTable(const nlohmann::json& results) {
  std::printf("%-11s %-13s %10s %12s %9s %8s %8s %9s %8s %8s %8s %8s\n", "config", "dtype",
              "fwd_bwd_ms", "tokens/s", "GFLOP/s", "grouped", "layer", "fwdTFLOP", "fwd/dns",
              "perm/cp", "unp/cp", "x bf16");
  for (const auto& r : results) {
    std::printf(
        "%-11s %-13s %10s %12s %9s %8s %8s %9s %8s %8s %8s %8s%s%s\n",
        r["config"].get<std::string>().c_str(), r["dtype"].get<std::string>().c_str(),
        Field(r, "fwd_bwd_ms", "%.1f").c_str(), Field(r, "tokens_per_s", "%.0f").c_str(),
        Field(r, "expert_gemm_gflops", "%.1f").c_str(),
        Field(r, "grouped_gemm_efficiency", "%.3f").c_str(),
        Field(r, "layer_efficiency", "%.3f").c_str(),
        Field(r, "grouped_gemm_fwd_tflops", "%.3f").c_str(),
        Field(r, "grouped_gemm_fwd_ratio", "%.3f").c_str(),
        Field(r, "permute_ratio", "%.3f").c_str(), Field(r, "unpermute_ratio", "%.3f").c_str(),
        Field(r, "fwd_bwd_speedup_vs_bf16", "%.3f").c_str(),
        r.value("emulated", false) ? "  (emulated)" : "", r.contains("errors") ? "  (errors)" : "");
  }
}

int Main(int argc, char** argv) {
  bool json = false;
  std::string device_name = "cpu";
  std::vector<std::string> only_dtypes;
  std::vector<std::string> only_configs;
  int reps = 5;
  const std::vector<BenchDType> dtypes = BenchDTypes();
  const std::vector<BenchConfig> configs = Configs();
  std::vector<std::string> dtype_names, config_names;
  for (const BenchDType& bench : dtypes) dtype_names.push_back(bench.name);
  for (const BenchConfig& bc : configs) config_names.push_back(bc.name);
  CLI::App app{
      "moe_layer_bench: forward+backward of an MoE layer, its grouped GEMMs and its permutation, "
      "each against a plain operation of the same work"};
  app.add_option("--device", device_name, "where everything runs; cuda = cuda:0")
      ->capture_default_str()
      ->check(bench::BenchDeviceCheck());
  app.add_flag("--json", json, "one JSON object on stdout instead of a table");
  app.add_option("--config", only_configs,
                 "configurations to run, comma-separated (default: those of the device, below)")
      ->delimiter(',')
      ->check(CLI::IsMember(config_names));
  app.add_option("--dtype", only_dtypes,
                 "comma-separated: f32, bf16, or the expert GEMMs in FP8 by a recipe (docs/fp8.md; "
                 "bf16 compute, HYBRID formats, the recipe's defaults; blockwise with power-of-two "
                 "scales). An FP8 dtype brings the bf16 run of the same configuration along, for "
                 "its ratios (default: f32 and bf16 on the CPU, bf16 on a GPU)")
      ->delimiter(',')
      ->check(CLI::IsMember(dtype_names));
  app.add_option("--reps", reps,
                 "timed calls per measurement, after one warm-up; the median is reported")
      ->capture_default_str()
      ->check(bench::AtLeast(1));
  app.footer(kHelpFooter);
  if (const std::optional<int> exit_code = bench::ParseFlags(app, argc, argv)) return *exit_code;
  const auto dtype_listed = [&](const std::string& name) {
    return std::find(only_dtypes.begin(), only_dtypes.end(), name) != only_dtypes.end();
  };
  // An FP8 dtype brings bf16 along: its ratios are against the bf16 run of the same shapes.
  const bool any_fp8 = std::any_of(dtypes.begin(), dtypes.end(), [&](const BenchDType& bench) {
    return bench.fp8.has_value() && dtype_listed(bench.name);
  });

  ExecContext ctx = ExecContext::Cpu();
  if (const int exit_code = bench::OpenBenchDevice("moe_layer_bench", device_name, &ctx);
      exit_code != 0) {
    return exit_code;
  }
  const bool on_cpu = ctx.device().is_cpu();

  bool ok = true;
  nlohmann::json machine = Machine(ctx, reps, &ok);
  nlohmann::json results = nlohmann::json::array();
  for (const BenchConfig& bc : configs) {
    const bool chosen = only_configs.empty() ? (on_cpu ? bc.default_cpu : bc.default_cuda)
                                             : std::find(only_configs.begin(), only_configs.end(),
                                                         bc.name) != only_configs.end();
    if (!chosen) continue;
    for (const BenchDType& bench : dtypes) {
      const bool dtype_chosen =
          only_dtypes.empty() ? !bench.fp8.has_value() && (on_cpu || bench.compute == DType::kBF16)
                              : dtype_listed(bench.name) || (any_fp8 && bench.name == "bf16");
      if (!dtype_chosen) continue;
      results.push_back(RunConfig(ctx, bc, bench, reps));
      if (results.back().contains("errors")) ok = false;
    }
  }
  CompareWithBf16(results);
  const nlohmann::json report = {{"machine", machine}, {"results", results}};
  if (json) {
    std::printf("%s\n", report.dump().c_str());
  } else {
    PrintTable(results);
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace moetrain

int main(int argc, char** argv) { return moetrain::Main(argc, argv); }
