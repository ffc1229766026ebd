// AdamW over fp32 master weights, and the gradient utilities a step needs around it: the global
// gradient norm, clipping by it, a NaN/Inf check and zeroing. The work is done by the optimizer
// ops (engine/ops/optim) on the execution context given.
//
// Everything here is deterministic and independent of the thread count: updates are elementwise,
// and the norm is summed over fixed blocks in a fixed order.
#ifndef MOETRAIN_ENGINE_TRAIN_OPTIMIZER_H_
#define MOETRAIN_ENGINE_TRAIN_OPTIMIZER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"

namespace moetrain {

// One trainable tensor. The optimizer and the functions below hold the views, not the memory.
struct Parameter {
  std::string name;          // the checkpoint key, e.g. "model.layers.0.self_attn.q_proj.weight"
  TensorView value;          // (any shape) f32 master weights, contiguous; AdamW::Step writes it
  TensorView grad;           // (same shape) f32, contiguous
  bool weight_decay = true;  // false for norm weights and biases
};

// OK when every parameter keeps the contract above: a unique non-empty name, value and grad
// contiguous f32 of one shape, and no two of all the values and grads sharing memory (a tied
// weight listed twice would be updated twice). Else InvalidArgument naming the parameter.
absl::Status CheckParameters(absl::Span<const Parameter> params);

// The part of a parameter a rank updates when the optimizer state is sharded over the replicas
// (parallel.sharding = OPTIMIZER or GRADIENTS): elements [offset, offset + part.value.numel()) of
// the parameter, row-major, as 1-D views of its value and grad.
struct ParameterPiece {
  Parameter part;              // named "<parameter>[<offset>:<end>]"
  std::string parameter;       // the whole parameter's name
  std::vector<int64_t> shape;  // the whole parameter's shape
  int64_t offset = 0;
};

// The pieces of `params` that lie inside `ranges`, element ranges [begin, end) of two flat (1-D)
// f32 buffers that hold every value (from `values`) and every grad (from `grads`) at the same
// offsets; in the order of `params`, then of `ranges`. InvalidArgument naming the parameter when
// its value or grad is not inside its buffer at one offset.
absl::StatusOr<std::vector<ParameterPiece>> SliceParameters(
    absl::Span<const Parameter> params, TensorView values, TensorView grads,
    absl::Span<const std::pair<int64_t, int64_t>> ranges);

// Field names and defaults mirror JobSpec.train.optimizer.
struct AdamWConfig {
  float beta1 = 0.9f;         // β1 ∈ [0, 1): decay of the first moment
  float beta2 = 0.95f;        // β2 ∈ [0, 1): decay of the second moment
  float eps = 1e-8f;          // > 0, added to √v̂
  float weight_decay = 0.1f;  // ≥ 0, decoupled: p -= lr·weight_decay·p
  // How m and v are kept: f32, or bf16 (half the bytes, as DeepSeek-V3 trains; the update still
  // computes in f32 and only the stored moments round: adamw_math.h).
  DType moment_dtype = DType::kF32;

  // OK, or InvalidArgument naming the field: "train.optimizer.beta1 = 1.5 must be in [0, 1)".
  absl::Status Validate() const;
};

// Checkpoint keys of the moments of parameter `name`: name + suffix.
inline constexpr char kExpAvgSuffix[] = ".exp_avg";
inline constexpr char kExpAvgSqSuffix[] = ".exp_avg_sq";

// Decoupled-weight-decay Adam (Loshchilov & Hutter), as torch.optim.AdamW. Step t (1-based):
//   p ← p − lr·wd·p                   (parameters with weight_decay only)
//   m ← β1·m + (1 − β1)·g,  v ← β2·v + (1 − β2)·g²
//   p ← p − lr·m̂ / (√v̂ + eps),  m̂ = m / (1 − β1^t),  v̂ = v / (1 − β2^t)
// computed in f32 with the bias corrections folded into two per-step scalars (computed in f64),
// bit-identical on every CPU (ops/optim/adamw_math.h).
class AdamW {
 public:
  // Validates the config and the parameters (on ctx's device); the moments start at zero there
  // and the step count at 0.
  static absl::StatusOr<AdamW> Create(const ExecContext& ctx, const AdamWConfig& config,
                                      std::vector<Parameter> params);

  AdamW(AdamW&&) = default;
  AdamW& operator=(AdamW&&) = default;

  // One update of every parameter from its grad, at learning rate `lr` (finite, ≥ 0; else
  // InvalidArgument and nothing changes). Grads are not checked: skip the step when !AllFinite.
  absl::Status Step(float lr);

  // Steps taken so far: t of the last Step, 0 before the first.
  int64_t step() const { return step_; }
  const AdamWConfig& config() const { return config_; }
  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }
  // The bytes of every m and v this optimizer holds.
  int64_t state_bytes() const;
  const Parameter& param(int64_t i) const { return params_[i]; }

  // m and v of parameter i: (its shape) of config().moment_dtype, contiguous. Writable, so that a
  // checkpoint can load straight into them (then SetStep); SetState copies and validates instead.
  TensorView exp_avg(int64_t i) const { return exp_avg_[i].view(); }
  TensorView exp_avg_sq(int64_t i) const { return exp_avg_sq_[i].view(); }

  // Restores a saved state: the step count and one m and one v per parameter, in parameter
  // order, each of that parameter's shape and f32 (rounded to bf16 when the moments are), on the
  // host (any strides) or the optimizer's device (dense). v must be ≥ 0 and m finite.
  // On error (InvalidArgument, naming the parameter) nothing changes. Continuing from a restored
  // state is bit-identical to never having stopped.
  absl::Status SetState(int64_t step, absl::Span<const TensorView> exp_avg,
                        absl::Span<const TensorView> exp_avg_sq);
  // The step count alone (≥ 0), for moments loaded in place through exp_avg / exp_avg_sq.
  absl::Status SetStep(int64_t step);

 private:
  AdamW(const ExecContext& ctx, const AdamWConfig& config, std::vector<Parameter> params)
      : ctx_(ctx), config_(config), params_(std::move(params)) {}

  ExecContext ctx_;
  AdamWConfig config_;
  std::vector<Parameter> params_;
  std::vector<Tensor> exp_avg_;     // P × (shape of the parameter) moment_dtype: m
  std::vector<Tensor> exp_avg_sq_;  // P × (shape of the parameter) moment_dtype: v
  int64_t step_ = 0;
};

// ‖g‖₂ over the grads of all parameters, as if concatenated: squares summed in f64 in a fixed
// order (so the same on every run, thread count and CPU). NaN or Inf when a grad holds one.
// InvalidArgument when the parameters break the contract (CheckParameters).
absl::StatusOr<double> GlobalGradNorm(const ExecContext& ctx, absl::Span<const Parameter> params);

// ‖g‖₂² as GlobalGradNorm sums it (before the square root): for a norm whose parts live on
// several ranks.
absl::StatusOr<double> GradSquaredSum(const ExecContext& ctx, absl::Span<const Parameter> params);

// Writes the global grad norm to *norm_before (when not null); if max_norm > 0 and the norm
// exceeds it, scales every grad by max_norm / (norm + 1e-6). max_norm ≤ 0 (or +Inf) never clips.
// A NaN or Inf norm leaves the grads as they are: the caller should skip that step. NaN max_norm
// or parameters that break the contract: InvalidArgument, and nothing changes.
absl::Status ClipGradNorm(const ExecContext& ctx, absl::Span<const Parameter> params,
                          double max_norm, double* norm_before);
// The same with the norm given (computed over more grads than `params`, e.g. over all ranks).
absl::Status ClipGradsToNorm(const ExecContext& ctx, absl::Span<const Parameter> params,
                             double max_norm, double norm);

// True when no grad holds a NaN or ±Inf. A grad that is not contiguous f32 (or is not on ctx's
// device) is never reported finite (it would not have been checked).
bool AllFinite(const ExecContext& ctx, absl::Span<const Parameter> params);

// Sets every grad to zero (f32, bf16, i32 or i64; any strides on the host).
absl::Status ZeroGrads(const ExecContext& ctx, absl::Span<const Parameter> params);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_OPTIMIZER_H_
