#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/core/status.h"
#include "engine/ops/common/cuda_launch.h"
#include "engine/ops/router/router_cuda.h"
#include "engine/ops/router/router_math.h"

namespace moetrain::ops::cuda {
namespace {

// Threads per block of the per-token kernels: each thread holds a token's scratch rows in global
// memory (E is not bounded at compile time), so fewer threads per SM keep more of them in L1.
constexpr int kRouterThreads = 128;
// Threads of the one-block kernels that finish a call (per-expert work, then one serial sum).
constexpr int kFinishThreads = 256;
// "No non-finite value seen" in the first-index flags (atomicMin keeps the smallest index).
constexpr unsigned long long kNoIndex = ~0ull;

bool HasAuxLoss(const MoeConfig& config) {
  return config.aux_loss != AuxLossType::kNone && config.aux_loss_coeff > 0.0f;
}
bool HasZLoss(const MoeConfig& config) { return config.z_loss_coeff > 0.0f; }

// 8-byte words that hold `count` items of `bytes` each.
constexpr int64_t Words(int64_t count, int64_t bytes) { return (count * bytes + 7) / 8; }

// One thread's scratch in RouterForwardKernel: offsets, in 8-byte words, into its slot.
struct ForwardSlot {
  int64_t z;              // (E) f32: the token's logits made contiguous (strided logits only)
  int64_t selection;      // (E) f32
  int64_t values;         // (max(k, G)) f32: BestK storage
  int64_t indices;        // (max(k, G)) i32
  int64_t group_score;    // (G) f32
  int64_t group_allowed;  // (G) u8
  int64_t words;
};

ForwardSlot ForwardSlotOf(const RoutingParams& p, bool copy_z) {
  const int64_t best = std::max(p.top_k, p.num_groups);
  ForwardSlot slot{};
  int64_t at = 0;
  slot.z = at;
  at += copy_z ? Words(p.num_experts, 4) : 0;
  slot.selection = at;
  at += Words(p.num_experts, 4);
  slot.values = at;
  at += Words(best, 4);
  slot.indices = at;
  at += Words(best, 4);
  slot.group_score = at;
  at += Words(p.num_groups, 4);
  slot.group_allowed = at;
  at += Words(p.num_groups, 1);
  slot.words = at;
  return slot;
}

// One thread's scratch in RouterBackwardKernel.
struct BackwardSlot {
  int64_t z;          // (E) f32 (strided logits only)
  int64_t d_scores;   // (E) f64
  int64_t dz;         // (E) f64
  int64_t softmax_z;  // (E) f32 (sigmoid scores with a z-loss only)
  int64_t words;
};

BackwardSlot BackwardSlotOf(int64_t experts, bool copy_z, bool softmax_z) {
  BackwardSlot slot{};
  int64_t at = 0;
  slot.z = at;
  at += copy_z ? Words(experts, 4) : 0;
  slot.d_scores = at;
  at += experts;
  slot.dz = at;
  at += experts;
  slot.softmax_z = at;
  at += softmax_z ? Words(experts, 4) : 0;
  slot.words = at;
  return slot;
}

// The grid of a per-token kernel over `tokens` (≥ 1), and the scratch of its threads.
struct TokenGrid {
  unsigned blocks;
  int64_t threads() const { return static_cast<int64_t>(blocks) * kRouterThreads; }
};

TokenGrid TokenGridOf(const CudaOp& op, int64_t tokens) {
  return {static_cast<unsigned>(
      GridStrideBlocks(tokens, op.context->multiprocessors(), kRouterThreads))};
}

// Device memory for the call's own use, freed when it goes out of scope: the allocator is
// stream-ordered, so the kernels queued before then still own it.
absl::StatusOr<Tensor> Scratch(const ExecContext& ctx, int64_t words) {
  return Tensor::Allocate(ctx.allocator(), DType::kI64, {std::max<int64_t>(words, 1)});
}

template <typename T>
T* Ptr(const TensorView& v) {
  return static_cast<T*>(v.raw());
}

// Grid-stride position of the calling thread, and the stride.
__device__ int64_t ThreadIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ int64_t ThreadCount() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// ---------------------------------------------------------------------------------------------
// Forward.
// ---------------------------------------------------------------------------------------------

struct ForwardKernelArgs {
  RoutingParams routing;
  int64_t tokens;       // T
  const float* logits;  // (T, E), strided
  int64_t logits_row_stride, logits_col_stride;
  const float* bias;  // (E), strided; null without expert bias
  int64_t bias_stride;
  bool z_loss;
  float* scores;                          // (T, E)
  int32_t* topk_experts;                  // (T, k)
  float* topk_weights;                    // (T, k)
  unsigned long long* tokens_per_expert;  // (E), zeroed
  double* lse_squared;                    // (T) (logsumexp z_t)², with a z-loss
  unsigned long long* first_bad_logit;    // t·E + e of the first non-finite logit
  uint64_t* scratch;                      // (threads, slot.words)
  ForwardSlot slot;
};

// One token per thread: router_math.h's RouteToken, then the token's counts.
__global__ void __launch_bounds__(kRouterThreads) RouterForwardKernel(const ForwardKernelArgs a) {
  const int64_t E = a.routing.num_experts, k = a.routing.top_k;
  uint64_t* const mine = a.scratch + ThreadIndex() * a.slot.words;
  float* const z_copy = reinterpret_cast<float*>(mine + a.slot.z);
  float* const selection = reinterpret_cast<float*>(mine + a.slot.selection);
  const TopKScratch topk = {reinterpret_cast<float*>(mine + a.slot.values),
                            reinterpret_cast<int32_t*>(mine + a.slot.indices),
                            reinterpret_cast<float*>(mine + a.slot.group_score),
                            reinterpret_cast<uint8_t*>(mine + a.slot.group_allowed)};
  const bool contiguous = a.logits_col_stride == 1;
  for (int64_t t = ThreadIndex(); t < a.tokens; t += ThreadCount()) {
    const float* const row = a.logits + t * a.logits_row_stride;
    int64_t bad = -1;
    for (int64_t e = 0; e < E; ++e) {
      const float v = row[e * a.logits_col_stride];
      if (!isfinite(v)) {
        bad = e;
        break;
      }
      if (!contiguous) z_copy[e] = v;
    }
    if (bad >= 0) {
      // The smallest flat index is the first bad logit of the first bad token, as the CPU names.
      atomicMin(a.first_bad_logit, static_cast<unsigned long long>(t * E + bad));
      continue;
    }
    int32_t* const chosen = a.topk_experts + t * k;
    const double lse =
        RouteToken(a.routing, contiguous ? row : z_copy, a.bias, a.bias_stride, a.z_loss, selection,
                   topk, a.scores + t * E, chosen, a.topk_weights + t * k);
    if (a.z_loss) a.lse_squared[t] = lse * lse;
    for (int64_t j = 0; j < k; ++j) atomicAdd(a.tokens_per_expert + chosen[j], 1ull);
  }
}

struct ForwardFinishArgs {
  int64_t tokens, experts;
  const float* bias;  // (E), strided; null without expert bias
  int64_t bias_stride;
  const int64_t* tokens_per_expert;  // (E)
  int64_t* aux_counts;               // (E + 1)
  const double* lse_squared;         // (T), with a z-loss
  bool z_loss;
  float z_loss_coeff;
  float* losses;                       // (2)
  unsigned long long* first_bad_bias;  // e of the first non-finite bias
};

// One block: the bias check and aux_counts per expert, then the z-loss summed serially in token
// order by one thread, as the CPU sums it.
__global__ void __launch_bounds__(kFinishThreads)
    RouterForwardFinishKernel(const ForwardFinishArgs a) {
  for (int64_t e = threadIdx.x; e < a.experts; e += blockDim.x) {
    if (a.bias != nullptr && !isfinite(a.bias[e * a.bias_stride])) {
      atomicMin(a.first_bad_bias, static_cast<unsigned long long>(e));
    }
    a.aux_counts[e] = a.tokens_per_expert[e];
  }
  if (threadIdx.x != 0) return;
  a.aux_counts[a.experts] = a.tokens;
  float z_loss = 0.0f;
  if (a.z_loss && a.tokens > 0) {
    double total = 0.0;
    for (int64_t t = 0; t < a.tokens; ++t) total += a.lse_squared[t];
    z_loss = ZLossValue(a.z_loss_coeff, total, a.tokens);
  }
  a.losses[0] = 0.0f;
  a.losses[1] = z_loss;
}

// ---------------------------------------------------------------------------------------------
// Aux loss.
// ---------------------------------------------------------------------------------------------

// n_{q,e}, (num_sequences, E), zeroed: pairs chosen for expert e within sequence q.
__global__ void CountPerSequenceKernel(const int32_t* topk_experts, int64_t pairs, int64_t top_k,
                                       int64_t experts, int64_t seq_len,
                                       unsigned long long* counts) {
  for (int64_t i = ThreadIndex(); i < pairs; i += ThreadCount()) {
    const int32_t e = topk_experts[i];
    if (e < 0 || e >= experts) continue;  // not a forward's output: see router_cuda.h
    atomicAdd(counts + (i / top_k / seq_len) * experts + e, 1ull);
  }
}

// The counts the aux loss's f_e uses: per sequence into `storage`, or aux_counts's first E.
absl::StatusOr<const int64_t*> CountsOfAuxLoss(const ExecContext& ctx, const CudaOp& op,
                                               const MoeConfig& config, const cpu::RouterExtents& x,
                                               const RouterOutput& forward, Tensor* storage) {
  if (config.aux_loss != AuxLossType::kSequence) return Ptr<const int64_t>(forward.aux_counts);
  const int64_t cells = x.num_sequences() * x.experts;
  MOETRAIN_ASSIGN_OR_RETURN(*storage, Scratch(ctx, cells));
  MOETRAIN_CUDA_RETURN_IF_ERROR(
      "router aux counts",
      cudaMemsetAsync(storage->view().raw(), 0, cells * sizeof(int64_t), op.stream));
  const int64_t pairs = x.tokens * x.top_k;
  CountPerSequenceKernel<<<static_cast<unsigned>(
                               GridStrideBlocks(pairs, op.context->multiprocessors())),
                           kThreadsPerBlock, 0, op.stream>>>(
      Ptr<const int32_t>(forward.topk_experts), pairs, x.top_k, x.experts, x.seq_len,
      Ptr<unsigned long long>(*storage));
  MOETRAIN_CUDA_CHECK_LAUNCH("router aux counts");
  return Ptr<const int64_t>(*storage);
}

// The T of f_e on the device: L for the sequence loss, else aux_counts[E]; -1 (poison) when the
// latter counts fewer tokens than this call's (InvalidArgument on the CPU).
__device__ int64_t CountTokens(bool per_sequence, int64_t seq_len, const int64_t* aux_counts,
                               int64_t experts, int64_t tokens) {
  if (per_sequence) return seq_len;
  const int64_t count_tokens = aux_counts[experts];
  return count_tokens < tokens ? -1 : count_tokens;
}

struct AuxTermArgs {
  int64_t tokens, experts, seq_len;
  bool per_sequence, sigmoid;
  const float* scores;    // (T, E)
  const int64_t* counts;  // (E), or (num_sequences, E) per sequence
  double* terms;          // (T)
};

__global__ void __launch_bounds__(kRouterThreads) AuxLossTermKernel(const AuxTermArgs a) {
  for (int64_t t = ThreadIndex(); t < a.tokens; t += ThreadCount()) {
    const int64_t* n = a.counts + (a.per_sequence ? (t / a.seq_len) * a.experts : 0);
    a.terms[t] = AuxLossTokenTerm(a.scores + t * a.experts, n, a.experts, a.sigmoid);
  }
}

struct AuxFinishArgs {
  int64_t tokens, experts, top_k, seq_len;
  bool per_sequence;
  float aux_loss_coeff;
  const double* terms;        // (T)
  const int64_t* aux_counts;  // (E + 1)
  float* losses;              // (2)
};

// One thread: the terms summed serially in token order, as the CPU sums them.
__global__ void AuxLossFinishKernel(const AuxFinishArgs a) {
  double total = 0.0;
  for (int64_t t = 0; t < a.tokens; ++t) total += a.terms[t];
  const int64_t count_tokens =
      CountTokens(a.per_sequence, a.seq_len, a.aux_counts, a.experts, a.tokens);
  a.losses[0] =
      count_tokens < 0
          ? std::numeric_limits<float>::quiet_NaN()
          : static_cast<float>(
                AuxLossCoeff(a.aux_loss_coeff, a.experts, a.tokens, count_tokens, a.top_k) * total);
}

// ---------------------------------------------------------------------------------------------
// Backward.
// ---------------------------------------------------------------------------------------------

struct BackwardKernelArgs {
  RoutingParams routing;
  int64_t tokens, seq_len;
  bool aux_loss, per_sequence, z_loss;
  float aux_loss_coeff, loss_weight;
  double z_coeff;             // 2·w·β/T
  const int64_t* counts;      // (E) or (num_sequences, E), with an aux loss
  const int64_t* aux_counts;  // (E + 1)
  const float* logits;        // (T, E), strided
  int64_t logits_row_stride, logits_col_stride;
  const float* scores;          // (T, E)
  const int32_t* topk_experts;  // (T, k)
  const float* topk_weights;    // (T, k)
  const float* d_weights;       // (T, k), strided
  int64_t d_weights_row_stride, d_weights_col_stride;
  float* d_logits;  // (T, E), strided
  int64_t d_logits_row_stride, d_logits_col_stride;
  uint64_t* scratch;  // (threads, slot.words)
  BackwardSlot slot;
};

// One token per thread: router_math.h's RouterTokenBackward.
__global__ void __launch_bounds__(kRouterThreads) RouterBackwardKernel(const BackwardKernelArgs a) {
  const int64_t E = a.routing.num_experts, k = a.routing.top_k;
  uint64_t* const mine = a.scratch + ThreadIndex() * a.slot.words;
  float* const z_copy = reinterpret_cast<float*>(mine + a.slot.z);
  const RouterGradScratch scratch = {reinterpret_cast<double*>(mine + a.slot.d_scores),
                                     reinterpret_cast<double*>(mine + a.slot.dz),
                                     reinterpret_cast<float*>(mine + a.slot.softmax_z)};
  RouterLossGrad loss = {a.aux_loss, 0.0, a.z_loss, a.z_coeff};
  if (a.aux_loss) {
    const int64_t count_tokens = CountTokens(a.per_sequence, a.seq_len, a.aux_counts, E, a.tokens);
    loss.aux_coeff = count_tokens < 0 ? std::numeric_limits<double>::quiet_NaN()
                                      : a.loss_weight * AuxLossCoeff(a.aux_loss_coeff, E, a.tokens,
                                                                     count_tokens, k);
  }
  const bool contiguous = a.logits_col_stride == 1;
  for (int64_t t = ThreadIndex(); t < a.tokens; t += ThreadCount()) {
    const int32_t* const chosen = a.topk_experts + t * k;
    float* const d_logits = a.d_logits + t * a.d_logits_row_stride;
    bool valid = true;
    for (int64_t j = 0; j < k; ++j) valid = valid && chosen[j] >= 0 && chosen[j] < E;
    if (!valid) {
      for (int64_t e = 0; e < E; ++e) {
        d_logits[e * a.d_logits_col_stride] = std::numeric_limits<float>::quiet_NaN();
      }
      continue;
    }
    const float* const row = a.logits + t * a.logits_row_stride;
    if (!contiguous) {
      for (int64_t e = 0; e < E; ++e) z_copy[e] = row[e * a.logits_col_stride];
    }
    const int64_t* n = a.aux_loss ? a.counts + (a.per_sequence ? (t / a.seq_len) * E : 0) : nullptr;
    RouterTokenBackward(a.routing, loss, contiguous ? row : z_copy, a.scores + t * E, chosen,
                        a.topk_weights + t * k, a.d_weights + t * a.d_weights_row_stride,
                        a.d_weights_col_stride, n, scratch, d_logits, a.d_logits_col_stride);
  }
}

// ---------------------------------------------------------------------------------------------
// Expert bias.
// ---------------------------------------------------------------------------------------------

// One block. status (2): the first negative count's expert and value, or -1 and 0; the bias is
// left unchanged then, as the CPU leaves it.
__global__ void __launch_bounds__(kFinishThreads)
    UpdateExpertBiasKernel(const int64_t* counts, int64_t experts, float rate, float* bias,
                           int64_t bias_stride, int64_t* status) {
  __shared__ double mean;
  __shared__ bool valid;
  if (threadIdx.x == 0) {
    // Serially in expert order, as the CPU sums.
    double total = 0.0;
    int64_t negative = -1;
    for (int64_t e = 0; e < experts; ++e) {
      if (counts[e] < 0) {
        negative = e;
        break;
      }
      total += static_cast<double>(counts[e]);
    }
    status[0] = negative;
    status[1] = negative >= 0 ? counts[negative] : 0;
    valid = negative < 0;
    mean = total / experts;
  }
  __syncthreads();
  if (!valid) return;
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
    bias[e * bias_stride] += ExpertBiasStep(mean, counts[e], rate);
  }
}

}  // namespace

absl::Status RouterForward(const ExecContext& ctx, const MoeConfig& config,
                           const cpu::RouterExtents& x, const RouterArgs& args, RouterOutput* out) {
  constexpr const char* kOp = "router";
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, kOp));
  const int64_t T = x.tokens, E = x.experts;
  const RoutingParams routing = RoutingParams::Of(config);
  const bool z_loss = HasZLoss(config);
  const float* bias = config.expert_bias ? Ptr<const float>(args.expert_bias) : nullptr;
  const int64_t bias_stride = config.expert_bias ? args.expert_bias.stride(0) : 0;

  // (2) u64: the first non-finite bias (expert) and logit (t·E + e), kNoIndex when none.
  MOETRAIN_ASSIGN_OR_RETURN(const Tensor flags, Scratch(ctx, 2));
  MOETRAIN_CUDA_RETURN_IF_ERROR(
      kOp, cudaMemsetAsync(flags.view().raw(), 0xFF, 2 * sizeof(uint64_t), op.stream));
  MOETRAIN_CUDA_RETURN_IF_ERROR(
      kOp, cudaMemsetAsync(out->tokens_per_expert.view().raw(), 0, E * sizeof(int64_t), op.stream));
  unsigned long long* first_bad = Ptr<unsigned long long>(flags);
  MOETRAIN_ASSIGN_OR_RETURN(const Tensor lse_squared, Scratch(ctx, z_loss ? T : 0));

  if (T > 0) {
    const TokenGrid grid = TokenGridOf(op, T);
    const ForwardSlot slot = ForwardSlotOf(routing, args.logits.stride(1) != 1);
    MOETRAIN_ASSIGN_OR_RETURN(const Tensor scratch, Scratch(ctx, grid.threads() * slot.words));
    const ForwardKernelArgs kernel_args = {routing,
                                           T,
                                           Ptr<const float>(args.logits),
                                           args.logits.stride(0),
                                           args.logits.stride(1),
                                           bias,
                                           bias_stride,
                                           z_loss,
                                           Ptr<float>(out->scores),
                                           Ptr<int32_t>(out->topk_experts),
                                           Ptr<float>(out->topk_weights),
                                           Ptr<unsigned long long>(out->tokens_per_expert),
                                           Ptr<double>(lse_squared),
                                           first_bad + 1,
                                           Ptr<uint64_t>(scratch),
                                           slot};
    RouterForwardKernel<<<grid.blocks, kRouterThreads, 0, op.stream>>>(kernel_args);
    MOETRAIN_CUDA_CHECK_LAUNCH(kOp);
  }
  const ForwardFinishArgs finish_args = {T,
                                         E,
                                         bias,
                                         bias_stride,
                                         Ptr<const int64_t>(out->tokens_per_expert),
                                         Ptr<int64_t>(out->aux_counts),
                                         Ptr<const double>(lse_squared),
                                         z_loss,
                                         config.z_loss_coeff,
                                         Ptr<float>(out->losses),
                                         first_bad};
  RouterForwardFinishKernel<<<1, kFinishThreads, 0, op.stream>>>(finish_args);
  MOETRAIN_CUDA_CHECK_LAUNCH(kOp);

  // The one wait of the call: whether any input was not finite, and which first.
  uint64_t first[2];
  MOETRAIN_RETURN_IF_ERROR(ReadToHost(op, kOp, flags.view().raw(), sizeof(first), first));
  if (first[0] != kNoIndex) {
    const int64_t e = static_cast<int64_t>(first[0]);
    float b;
    MOETRAIN_RETURN_IF_ERROR(ReadToHost(op, kOp, bias + e * bias_stride, sizeof(b), &b));
    return absl::InvalidArgumentError(absl::StrCat("expert_bias[", e, "] = ", b, " is not finite"));
  }
  if (first[1] != kNoIndex) {
    const int64_t t = static_cast<int64_t>(first[1]) / E, e = static_cast<int64_t>(first[1]) % E;
    float z;
    MOETRAIN_RETURN_IF_ERROR(ReadToHost(
        op, kOp,
        Ptr<const float>(args.logits) + t * args.logits.stride(0) + e * args.logits.stride(1),
        sizeof(z), &z));
    return NonFiniteError(absl::StrCat("logits[", t, ", ", e, "] = ", z, " is not finite"));
  }
  return absl::OkStatus();
}

absl::Status RouterAuxLoss(const ExecContext& ctx, const MoeConfig& config,
                           const cpu::RouterExtents& x, RouterOutput* out) {
  constexpr const char* kOp = "router aux loss";
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, kOp));
  const int64_t T = x.tokens;
  float* losses = Ptr<float>(out->losses);
  if (!HasAuxLoss(config) || T == 0) {
    MOETRAIN_CUDA_RETURN_IF_ERROR(kOp, cudaMemsetAsync(losses, 0, sizeof(float), op.stream));
    return absl::OkStatus();
  }
  const bool per_sequence = config.aux_loss == AuxLossType::kSequence;
  Tensor counts_storage;
  MOETRAIN_ASSIGN_OR_RETURN(const int64_t* counts,
                            CountsOfAuxLoss(ctx, op, config, x, *out, &counts_storage));
  MOETRAIN_ASSIGN_OR_RETURN(const Tensor terms, Scratch(ctx, T));
  const AuxTermArgs term_args = {T,
                                 x.experts,
                                 x.seq_len,
                                 per_sequence,
                                 config.score_function == ScoreFunction::kSigmoid,
                                 Ptr<const float>(out->scores),
                                 counts,
                                 Ptr<double>(terms)};
  AuxLossTermKernel<<<TokenGridOf(op, T).blocks, kRouterThreads, 0, op.stream>>>(term_args);
  MOETRAIN_CUDA_CHECK_LAUNCH(kOp);
  const AuxFinishArgs finish_args = {T,
                                     x.experts,
                                     x.top_k,
                                     x.seq_len,
                                     per_sequence,
                                     config.aux_loss_coeff,
                                     Ptr<const double>(terms),
                                     Ptr<const int64_t>(out->aux_counts),
                                     losses};
  AuxLossFinishKernel<<<1, 1, 0, op.stream>>>(finish_args);
  MOETRAIN_CUDA_CHECK_LAUNCH(kOp);
  return absl::OkStatus();
}

absl::Status RouterBackward(const ExecContext& ctx, const MoeConfig& config,
                            const cpu::RouterExtents& x, const RouterArgs& args,
                            const RouterOutput& forward, TensorView d_topk_weights,
                            TensorView d_logits, float loss_weight) {
  constexpr const char* kOp = "router backward";
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, kOp));
  const int64_t T = x.tokens;
  if (T == 0) return absl::OkStatus();
  const RoutingParams routing = RoutingParams::Of(config);
  const bool aux_loss = HasAuxLoss(config), z_loss = HasZLoss(config);
  Tensor counts_storage;
  const int64_t* counts = nullptr;
  if (aux_loss) {
    MOETRAIN_ASSIGN_OR_RETURN(counts,
                              CountsOfAuxLoss(ctx, op, config, x, forward, &counts_storage));
  }
  const TokenGrid grid = TokenGridOf(op, T);
  const BackwardSlot slot =
      BackwardSlotOf(x.experts, args.logits.stride(1) != 1, routing.sigmoid && z_loss);
  MOETRAIN_ASSIGN_OR_RETURN(const Tensor scratch, Scratch(ctx, grid.threads() * slot.words));
  const BackwardKernelArgs kernel_args = {
      routing,
      T,
      x.seq_len,
      aux_loss,
      config.aux_loss == AuxLossType::kSequence,
      z_loss,
      config.aux_loss_coeff,
      loss_weight,
      2.0 * loss_weight * config.z_loss_coeff / T,  // the CPU's z_coeff, T > 0
      counts,
      Ptr<const int64_t>(forward.aux_counts),
      Ptr<const float>(args.logits),
      args.logits.stride(0),
      args.logits.stride(1),
      Ptr<const float>(forward.scores),
      Ptr<const int32_t>(forward.topk_experts),
      Ptr<const float>(forward.topk_weights),
      Ptr<const float>(d_topk_weights),
      d_topk_weights.stride(0),
      d_topk_weights.stride(1),
      Ptr<float>(d_logits),
      d_logits.stride(0),
      d_logits.stride(1),
      Ptr<uint64_t>(scratch),
      slot};
  RouterBackwardKernel<<<grid.blocks, kRouterThreads, 0, op.stream>>>(kernel_args);
  MOETRAIN_CUDA_CHECK_LAUNCH(kOp);
  return absl::OkStatus();
}

absl::Status UpdateExpertBias(const ExecContext& ctx, TensorView tokens_per_expert, float rate,
                              TensorView bias) {
  constexpr const char* kOp = "expert bias update";
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, kOp));
  const int64_t E = tokens_per_expert.dim(0);
  MOETRAIN_ASSIGN_OR_RETURN(const Tensor status, Scratch(ctx, 2));
  UpdateExpertBiasKernel<<<1, kFinishThreads, 0, op.stream>>>(Ptr<const int64_t>(tokens_per_expert),
                                                              E, rate, Ptr<float>(bias),
                                                              bias.stride(0), Ptr<int64_t>(status));
  MOETRAIN_CUDA_CHECK_LAUNCH(kOp);
  // Once per optimizer step, so the wait costs little, and the error is the CPU's.
  int64_t negative[2];
  MOETRAIN_RETURN_IF_ERROR(ReadToHost(op, kOp, status.view().raw(), sizeof(negative), negative));
  if (negative[0] >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens_per_expert[", negative[0], "] = ", negative[1], " is negative"));
  }
  return absl::OkStatus();
}

}  // namespace moetrain::ops::cuda
