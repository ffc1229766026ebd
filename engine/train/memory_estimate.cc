#include "engine/train/memory_estimate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/model/transformer.h"
#include "engine/ops/loss/lm_head_loss.h"

namespace moetrain {
namespace {

constexpr double kKiB = 1024.0;

// The unit FormatBytes writes `bytes` in, and its size.
std::pair<const char*, double> UnitOf(double bytes) {
  static constexpr std::pair<const char*, double> kUnits[] = {{"TiB", kKiB * kKiB * kKiB * kKiB},
                                                              {"GiB", kKiB * kKiB * kKiB},
                                                              {"MiB", kKiB * kKiB},
                                                              {"KiB", kKiB}};
  for (const auto& unit : kUnits) {
    if (bytes >= unit.second) return unit;
  }
  return {"B", 1.0};
}

// Rows of routed-expert work one rank holds for `tokens` tokens: every (token, slot) pair, or at
// most each expert's capacity in capacity mode; spread evenly over the expert-parallel ranks,
// which exchange them (so the local rows equal the sent ones on average).
double RoutedRows(const MoeConfig& moe, double tokens) {
  const double pairs = tokens * static_cast<double>(moe.top_k);
  if (moe.capacity_factor <= 0.0f) return pairs;
  const double e = static_cast<double>(moe.num_experts);
  const double capacity_rows = e * std::ceil(moe.capacity_factor * pairs / e);
  return std::min(pairs, capacity_rows);
}

// MLA's widths (mla_attention.h), per token: heads, the query and key/value latent ranks, the
// shared RoPE key, the query/key width of all heads, the values', and kv_b_proj's output.
struct MlaWidths {
  double h, rq, rkv, rope, wide, dv, kv_width;
};
MlaWidths MlaWidthsOf(const ModelConfig& m) {
  const MlaConfig& a = m.mla;
  const double h = static_cast<double>(m.num_heads);
  return {.h = h,
          .rq = static_cast<double>(a.q_lora_rank),
          .rkv = static_cast<double>(a.kv_lora_rank),
          .rope = static_cast<double>(a.qk_rope_head_dim),
          .wide = h * static_cast<double>(a.qk_head_dim()),
          .dv = h * static_cast<double>(a.v_head_dim),
          .kv_width = h * static_cast<double>(a.qk_nope_head_dim + a.v_head_dim)};
}

// A model's sizes, as doubles: a hostile config's products overflow int64.
struct Sizes {
  double d, v;          // hidden size, vocabulary
  double q, kv;         // query and key/value widths (all heads)
  double f, e, fe;      // dense FFN width, routed experts, an expert's FFN width
  double shared_f;      // the shared experts' FFN width together
  double mtp;           // MTP modules
  double dense_layers;  // blocks with a dense FFN
  double layers;        // blocks, the MTP modules' included (they count as MoE blocks)
  double moe_layers;    // blocks with an MoE FFN
};
Sizes SizesOf(const ModelConfig& m) {
  const auto as_double = [](int64_t value) { return static_cast<double>(value); };
  const double dh = as_double(m.resolved_head_dim());
  const int64_t mtp = std::max<int64_t>(m.mtp_depth, 0);
  const int64_t dense_layers = std::clamp<int64_t>(m.first_dense_layers, 0, m.num_layers);
  const int64_t layers = std::max<int64_t>(m.num_layers, 0) + mtp;
  return {.d = as_double(m.hidden_size),
          .v = as_double(m.vocab_size),
          .q = as_double(m.num_heads) * dh,
          .kv = as_double(m.num_kv_heads) * dh,
          .f = as_double(m.ffn_dim),
          .e = as_double(m.moe.num_experts),
          .fe = as_double(m.moe.expert_ffn_dim),
          .shared_f = as_double(m.moe.num_shared_experts) * as_double(m.moe.expert_ffn_dim),
          .mtp = as_double(mtp),
          .dense_layers = as_double(dense_layers),
          .layers = as_double(layers),
          .moe_layers = as_double(layers - dense_layers)};
}

// Parameters AdamW does not update: the expert biases (selection only), one per expert of each
// MoE block and MTP module.
double UntrainableCount(const ModelConfig& m) {
  const Sizes s = SizesOf(m);
  return m.moe.expert_bias ? s.moe_layers * s.e : 0.0;
}

// The delayed FP8 recipe's state as its checkpoint holds it (Fp8State::SaveState): per slot the
// scale and the history, f32. 0 for the other recipes and without FP8.
double Fp8SavedStateBytes(const TrainerConfig& config) {
  if (!config.fp8.has_value() || !config.fp8->has_state()) return 0.0;
  return 4 * Fp8SlotCount(config.model) * (1 + static_cast<double>(config.fp8->amax_history_len));
}

// MemoryEstimate::fp8_state and fp8_state_host (their comment says what they count).
void EstimateFp8State(const TrainerConfig& config, MemoryEstimate* estimate) {
  if (!config.fp8.has_value()) return;
  const double slots = Fp8SlotCount(config.model);
  const double world = std::max(1, config.parallel.world_size());
  const double histories =
      config.fp8->has_state() ? 4 * slots * static_cast<double>(config.fp8->amax_history_len) : 0.0;
  // EndStep (fp8_state.cc): the host copies of the amaxes, scales and counts (4 + 4 + 8 B), and
  // over several ranks the all-gather's words (2 i64 a slot) sent and received from each rank.
  const double step_end = 16 * slots + (world > 1 ? 16 * slots * (1 + world) : 0.0);
  estimate->fp8_state_host = histories + std::max(step_end, Fp8SavedStateBytes(config));
  estimate->fp8_state = 16 * slots + estimate->fp8_state_host;
}

}  // namespace

std::string FormatBytes(double bytes) {
  const auto [name, size] = UnitOf(bytes);
  if (size == 1.0) return absl::StrCat(static_cast<int64_t>(bytes), " B");
  return absl::StrFormat("%.2f %s", bytes / size, name);
}

std::string MemoryEstimate::DebugString() const {
  const auto [name, size] = UnitOf(total());
  std::string extra = fp8_state > 0 ? absl::StrFormat(", fp8 state %.2f", fp8_state / size) : "";
  if (checkpoint_gather > 0) {
    absl::StrAppend(&extra, absl::StrFormat(", checkpoint gather %.2f", checkpoint_gather / size));
  }
  return absl::StrFormat("%s (params %.2f, grads %.2f, optimizer %.2f, activations %.2f%s %s)",
                         FormatBytes(total()), parameters / size, gradients / size,
                         optimizer / size, activations / size, extra, name);
}

double ParameterCount(const ModelConfig& m, int expert_parallel) {
  const auto [d, v, q, kv, f, e, fe, shared_f, mtp, dense_layers, layers, moe_layers] = SizesOf(m);
  const double local_experts = e / std::max(1, expert_parallel);

  const double embeddings = v * d * (m.tie_embeddings ? 1.0 : 2.0) + d;
  double attention = 2 * d + 2 * q * d + 2 * kv * d;
  if (m.is_mla()) {
    const MlaWidths w = MlaWidthsOf(m);
    const double query = w.rq == 0 ? w.wide * d : w.rq * d + w.rq + w.wide * w.rq;
    attention = 2 * d + query + (w.rkv + w.rope) * d + w.rkv + w.kv_width * w.rkv + d * w.dv;
  }
  const double dense_ffn = 3 * f * d;
  const double moe_dense = e * d + (m.moe.expert_bias ? e : 0.0) + 3 * shared_f * d;
  const double experts = local_experts * 3 * fe * d;
  return embeddings + mtp * (3 * d + 2 * d * d) + layers * attention + dense_layers * dense_ffn +
         moe_layers * (moe_dense + experts);
}

MemoryEstimate EstimateTrainingMemory(const TrainerConfig& config) {
  const ModelConfig& m = config.model;
  const MoeConfig& moe = m.moe;
  const auto as_double = [](int64_t value) { return static_cast<double>(value); };
  // MTP modules count as MoE blocks (their norms, eh_proj and loss are added below).
  const auto [d, v, q, kv, f, e, fe, shared_f, mtp, dense_layers, layers, moe_layers] = SizesOf(m);
  const double ep = std::max(1, config.parallel.expert_parallel);
  const double world = std::max(1, config.parallel.world_size());
  const double local_experts = e / ep;
  // This rank's tokens of one forward/backward.
  const int64_t micro =
      config.micro_batch_size > 0 ? config.micro_batch_size : config.data.batch_size;
  const double t = std::max(1.0, as_double(micro) / world) * as_double(config.data.seq_len);
  const double act = static_cast<double>(DTypeSize(config.compute_dtype));
  const bool f32 = config.compute_dtype == DType::kF32;
  const double act_copy = f32 ? 0.0 : act;  // a compute copy that exists only below f32

  const double n = ParameterCount(m, config.parallel.expert_parallel);
  const double untrainable = UntrainableCount(m);
  const Sharding sharding = config.parallel.sharding;
  const double dp = std::max(1, config.parallel.data_parallel);
  const double expert_params = moe_layers * local_experts * 3 * fe * d;
  // The parameters this rank's share of the sharded state covers: 1/W of the dense ones and 1/dp
  // of its experts' (grad_sync.h).
  const double share = (n - expert_params) / world + expert_params / dp;
  // The largest gradient bucket, in bytes, roughly: a bucket holds the dense or the expert part of
  // whole backward stages, at least grad_bucket_bytes, the embedding's V·D or an average block's
  // parameters.
  const double blocks = std::max(1.0, layers + mtp);
  const double bucket = std::max({static_cast<double>(config.parallel.grad_bucket_bytes), 4 * v * d,
                                  4 * (n - 2 * v * d) / blocks});
  const bool bf16_reduce = config.parallel.grad_reduce_dtype == DType::kBF16 && world > 1;
  MemoryEstimate estimate;
  estimate.parameters = n * (4 + act_copy);
  estimate.gradients = 4 * n;
  // Reduced in bf16 over several ranks: a bf16 staging copy of the grads (grad_sync.h).
  if (bf16_reduce) estimate.gradients += 2 * n;
  if (sharding == Sharding::kGradients && world > 1) {
    // With several micro-batches, the accumulator of the earlier ones' sums (grad_sync.h).
    const double accumulator = config.micro_batches() > 1 ? 4 * share : 0.0;
    // On the CPU, this rank's blocks and the buckets backward has written but not yet had summed
    // (the stage being written, the bucket filling and two stages in flight, of the dense and of
    // the expert part, the tied embedding's from the first stage on: four of the largest), each
    // with its staging copy when bf16; never more than the unsharded buffers. A device zeroes
    // what it lets go of: the whole buffer stays.
    const double held = std::min(4 * share + 4 * bucket, 4 * n) * (bf16_reduce ? 1.5 : 1.0);
    estimate.gradients = accumulator + (config.device.is_cpu() ? held : estimate.gradients);
  }
  // AdamW's two moments of each trainable parameter this rank updates: all of them, or its share
  // when sharded.
  const double moment = static_cast<double>(DTypeSize(config.optimizer.moment_dtype));
  const double updated =
      sharding == Sharding::kNone ? n - untrainable : share - untrainable / world;
  estimate.optimizer = 2 * moment * updated;
  // A checkpoint that gathers the moments (sharded, or bf16): an f32 scratch of the largest
  // gradient bucket on the rank's device, and the two whole f32 moments it fills in host memory.
  if (sharding != Sharding::kNone || config.optimizer.moment_dtype != DType::kF32) {
    estimate.checkpoint_gather_host = 2 * 4 * n;
    estimate.checkpoint_gather = std::min(4 * n, bucket) + estimate.checkpoint_gather_host;
  }

  // The transformer's own buffers: tokens, the residual stream of every layer boundary, the final
  // norm, its gradients, and the LM head's chunk of logits (about 16 MiB of f32 at a time).
  const double lm_chunk = std::min(t, static_cast<double>(ops::DefaultLmHeadChunkTokens(
                                          std::numeric_limits<int64_t>::max(), m.vocab_size)));
  double activations = 3 * 4 * t + 4 * (layers + 1) * t * d + 4 * t + act * t * d + 2 * 4 * t * d +
                       (4 + act) * lm_chunk * v + 4 * t;
  // Each part of a block in two: what its forward keeps for backward (`kept`), and its scratch:
  // what selective recompute lets go of and rebuilds, and what only forward or backward uses
  // (the Kept and Scratch buffers of block.h, mla_attention.h and moe_layer.h).
  struct Part {
    double kept = 0, scratch = 0;
  };
  // The block's own: its norms' rstd, the residual after attention and the attention's tensors,
  // then the norms' outputs and the stream's gradient (as f32, and in the compute dtype).
  Part block = {.kept = 4 * t + 4 * t * d + 4 * t,
                .scratch = 2 * act * t * d + act_copy * t * d + 4 * t * d};
  if (m.is_mla()) {
    // MLA keeps its two latents (and the query latent's rstd), the key/value latent's rstd and
    // the core's output and logsumexp. Scratch: the latents' norms (compute dtype), the query,
    // the shared key, kv_b_proj's output, q, k and v, the narrowed output, and the gradients of
    // each (f32, and their compute copies below f32).
    const MlaWidths w = MlaWidthsOf(m);
    block.kept += 4 * t * (w.rq + (w.rq > 0 ? 1 : 0) + w.rkv + 1 + w.wide + w.h);
    block.scratch += act * t * (w.rq + w.rkv) +
                     4 * t * (9 * w.wide + 2 * (w.rope + w.kv_width + w.dv + w.rkv + w.rq)) +
                     act_copy * t * (w.dv + w.kv_width + w.rkv + w.rope + w.wide + w.rq);
  } else {
    // Grouped-query attention keeps q, k, v and the core's output and logsumexp.
    block.kept += 4 * t * (2 * q + 2 * kv) + 4 * t * as_double(m.num_heads);
    block.scratch += act_copy * t * q + 4 * t * (2 * q + 2 * kv) + act_copy * t * (q + 2 * kv);
  }
  // Dense FFN blocks: the pre-activations kept; the activated rows and the gradients scratch.
  const double dense_scratch_slots[3] = {act * t * f, 4 * t * f, act * t * 2 * f};
  const Part dense = {
      .kept = 4 * t * 2 * f,
      .scratch = dense_scratch_slots[0] + dense_scratch_slots[1] + dense_scratch_slots[2]};
  // MoE blocks: the router's logits, the permuted rows, the experts' pre-activations and outputs
  // (with expert parallelism the received and combined rows instead of the rows sent), the shared
  // experts' pre-activations kept; the block's MoE output and its gradient, the router's f32 input,
  // the SwiGLU outputs and every gradient scratch. The routing (scores, top-k experts and weights,
  // the permutation's rows) is kept per layer even when the blocks share their buffers.
  const double rows = RoutedRows(moe, t);
  const double k = as_double(moe.top_k);
  const double routing = 4 * t * e + 12 * t * k + 4 * rows;
  // The experts' pre-activations, SwiGLU outputs and their gradients come first: a dense FFN's
  // share them under recompute.
  const double moe_gate_up = 4 * rows * 2 * fe;
  const double moe_scratch_slots[3] = {act * rows * fe, 4 * rows * fe, act * rows * 2 * fe};
  Part moe_part = {.kept = moe_gate_up + 4 * t * e + rows * (act * d + 4 * d),
                   .scratch = moe_scratch_slots[0] + moe_scratch_slots[1] + moe_scratch_slots[2] +
                              2 * act * t * d + (f32 ? 0.0 : 4 * t * d) + 4 * t * e + 4 * t * d +
                              4 * t * k + rows * (act * d + 4 * d)};
  if (ep > 1) {
    // The permuted rows and the experts' outputs are only sent: scratch. The received rows and
    // the combined outputs kept, their gradients scratch.
    moe_part.scratch += 2 * rows * (act * d + 4 * d);
  }
  if (shared_f > 0) {
    moe_part.kept += 4 * t * 2 * shared_f;
    moe_part.scratch +=
        act * t * shared_f + 2 * 4 * t * d + 4 * t * shared_f + act * t * 2 * shared_f;
  }
  // Without recompute every block has buffers of its own. Recomputing, all blocks share one set
  // of scratch buffers (SELECTIVE), or of all buffers (FULL: each block then keeps only its input,
  // the residual stream counted above): one attention's, and one MoE layer's whose first slots a
  // dense FFN's share (block.h), each as large as the larger user needs. (With expert
  // parallelism a shared row slot grows to the busiest layer's received rows, which the even
  // spread counted here can fall short of.)
  const double has_dense = dense_layers > 0 ? 1 : 0, has_moe = moe_layers > 0 ? 1 : 0;
  double shared_scratch = block.scratch + has_moe * moe_part.scratch;
  for (int i = 0; i < 3; ++i) {
    shared_scratch += std::max(has_dense * dense_scratch_slots[i], has_moe * moe_scratch_slots[i]) -
                      has_moe * moe_scratch_slots[i];
  }
  switch (config.recompute) {
    case Recompute::kNone:
      activations += layers * (block.kept + block.scratch) +
                     dense_layers * (dense.kept + dense.scratch) +
                     moe_layers * (moe_part.kept + moe_part.scratch);
      break;
    case Recompute::kSelective:
      activations += layers * block.kept + dense_layers * dense.kept + moe_layers * moe_part.kept +
                     shared_scratch;
      break;
    case Recompute::kFull:
      // The dense FFN's one kept slot shares the MoE layer's first (the pre-activations).
      activations += block.kept + shared_scratch + has_moe * (moe_part.kept - moe_gate_up) +
                     std::max(has_dense * dense.kept, has_moe * moe_gate_up);
      break;
  }
  activations += moe_layers * routing;
  // Each MTP module's own tensors (mtp.cc): tokens, embedding, norms, the concatenation, the
  // block's input and output and their gradients.
  activations +=
      mtp * (2 * 4 * t + 10 * 4 * t * d + 3 * act * t * d + act * t * 2 * d + 4 * t * 2 * d);
  // FP8 (a recipe on): a linear layer's GEMM quantises its two operands into fresh FP8 tensors (a
  // byte an element, plus f32 scales, at most one per 128 elements) that live until it returns
  // (fp8/linear.cc), and the caching allocator keeps the largest pair. Forward x·wᵀ, backward
  // dy·w and dyᵀ·x; the routed experts' grouped GEMMs quantise one expert at a time. No FP8 copy
  // of a weight outlives its GEMM.
  if (config.fp8.has_value()) {
    const auto pair = [](double m, double in, double out) {
      return std::max({m * in + out * in, m * out + out * in, m * out + m * in});
    };
    double fp8 = std::max(pair(t, d, 2 * std::max(f, shared_f)), pair(t, q, d));
    fp8 = std::max(fp8, pair(rows / std::max(1.0, local_experts), d, 2 * fe));
    activations += fp8 * (1.0 + 4.0 / 128);
  }
  estimate.activations = activations;
  EstimateFp8State(config, &estimate);
  return estimate;
}

double EstimateCheckpointBytes(const TrainerConfig& config) {
  const double n = ParameterCount(config.model);
  return 4 * n + 2 * 4 * (n - UntrainableCount(config.model)) + Fp8SavedStateBytes(config);
}

absl::StatusOr<int64_t> ParseByteSize(std::string_view text, std::string_view flag) {
  const std::string trimmed(
      absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size())));
  const auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(absl::string_view(flag.data(), flag.size()), " = '", trimmed, "': ", why));
  };
  size_t end = 0;
  while (end < trimmed.size() && (absl::ascii_isdigit(trimmed[end]) || trimmed[end] == '.')) ++end;
  double number = 0;
  if (end == 0 || !absl::SimpleAtod(trimmed.substr(0, end), &number)) {
    return invalid("not a size (e.g. 8GiB, 512MiB or a number of bytes)");
  }
  std::string unit = absl::AsciiStrToLower(trimmed.substr(end));
  if (unit.size() > 1 && unit.back() == 'b') unit.pop_back();   // "gib" → "gi", "gb" → "g"
  if (unit.size() == 2 && unit.back() == 'i') unit.pop_back();  // "gi" → "g"
  double multiplier = 0;
  if (unit.empty() || unit == "b") {
    multiplier = 1;
  } else if (unit == "k") {
    multiplier = kKiB;
  } else if (unit == "m") {
    multiplier = kKiB * kKiB;
  } else if (unit == "g") {
    multiplier = kKiB * kKiB * kKiB;
  } else if (unit == "t") {
    multiplier = kKiB * kKiB * kKiB * kKiB;
  } else {
    return invalid("unknown unit (use B, KiB, MiB, GiB or TiB)");
  }
  const double bytes = number * multiplier;
  if (!(bytes >= 1)) return invalid("must be at least 1 byte");
  if (bytes > 9.0e18) return invalid("too large");
  return static_cast<int64_t>(bytes);
}

absl::StatusOr<int64_t> MachineMemoryBytes() {
  int64_t limit = std::numeric_limits<int64_t>::max();
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    int64_t kib = 0;
    if (std::sscanf(line.c_str(), "MemTotal: %ld kB", &kib) == 1 && kib > 0) {
      limit = kib * 1024;
      break;
    }
  }
  // A container's limit; "max" when there is none.
  std::ifstream cgroup("/sys/fs/cgroup/memory.max");
  std::string text;
  int64_t cgroup_limit = 0;
  if (cgroup >> text && absl::SimpleAtoi(text, &cgroup_limit) && cgroup_limit > 0) {
    limit = std::min(limit, cgroup_limit);
  }
  if (limit == std::numeric_limits<int64_t>::max()) {
    return absl::UnavailableError(
        "cannot read the machine's memory from /proc/meminfo or /sys/fs/cgroup/memory.max");
  }
  return limit;
}

absl::Status CheckMemoryEstimate(const MemoryEstimate& estimate, int64_t limit_bytes,
                                 std::string_view limit_name) {
  if (estimate.total() <= static_cast<double>(limit_bytes)) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the model needs about ", estimate.DebugString(), " of memory, more than the ",
      FormatBytes(static_cast<double>(limit_bytes)), " available (",
      absl::string_view(limit_name.data(), limit_name.size()),
      "): make the model or train.micro_batch_size smaller, use more expert-parallel ranks, "
      "shard the optimizer state and gradients (parallel.sharding = OPTIMIZER or GRADIENTS), "
      "or recompute activations "
      "(train.recompute = FULL)"));
}

MemoryPlacement PlaceTrainingMemory(const TrainerConfig& config, const MemoryEstimate& estimate) {
  if (config.device.is_cpu()) return {.host = estimate.total(), .device = 0};
  // The snapshot holds the f32 masters and both moments: a copy of the optimizer state, or the
  // gathered moments.
  const double masters = 4 * ParameterCount(config.model, config.parallel.expert_parallel);
  const double moments =
      estimate.checkpoint_gather > 0 ? estimate.checkpoint_gather_host : estimate.optimizer;
  return {.host = masters + moments + estimate.fp8_state_host, .device = estimate.on_device()};
}

absl::Status CheckTrainingMemory(const TrainerConfig& config, const MemoryEstimate& estimate,
                                 int64_t host_limit_bytes, std::string_view host_limit_name) {
  if (config.device.is_cpu()) {
    return host_limit_bytes > 0 ? CheckMemoryEstimate(estimate, host_limit_bytes, host_limit_name)
                                : absl::OkStatus();
  }
  const MemoryPlacement placement = PlaceTrainingMemory(config, estimate);
  MOETRAIN_ASSIGN_OR_RETURN(const ExecContext ctx, ExecContext::ForDevice(config.device));
  const int64_t device_bytes =
      ctx.runtime() != nullptr ? ctx.runtime()->memory_stats().total_bytes : 0;
  if (device_bytes > 0 && placement.device > static_cast<double>(device_bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model needs about ", estimate.DebugString(), " of ", config.device.DebugString(),
        "'s memory, more than its ", FormatBytes(static_cast<double>(device_bytes)),
        ": make the model or train.micro_batch_size smaller, use more expert-parallel ranks, "
        "shard the optimizer state (parallel.sharding = OPTIMIZER), or recompute activations "
        "(train.recompute = FULL)"));
  }
  if (host_limit_bytes > 0 && placement.host > static_cast<double>(host_limit_bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the job needs about ", FormatBytes(placement.host),
        " of host memory (a checkpoint's copy of the f32 weights and optimizer moments from ",
        config.device.DebugString(),
        estimate.fp8_state_host > 0
            ? absl::StrCat(", and ", FormatBytes(estimate.fp8_state_host), " of FP8 state")
            : "",
        "), more than the ", FormatBytes(static_cast<double>(host_limit_bytes)), " available (",
        absl::string_view(host_limit_name.data(), host_limit_name.size()), ")"));
  }
  return absl::OkStatus();
}

}  // namespace moetrain
