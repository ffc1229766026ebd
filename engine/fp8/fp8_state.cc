#include "engine/fp8/fp8_state.h"

#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/elementwise/elementwise.h"

namespace moetrain {
namespace {

// The max of two amaxes where a NaN wins: a rank whose tensor held a NaN makes the step's amax
// NaN on every rank (amaxes are magnitudes, never negative).
float MaxNanWins(float a, float b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  return a > b ? a : b;
}

// The step's amaxes (max, NaN wins) and saturated counts (sum) over the ranks of `group`. One
// all-gather of both as i64 words (an amax's f32 bits zero-extended) rather than two collectives,
// combined in rank order on every rank, so that every rank gets the same bits.
absl::Status ReduceOverRanks(Communicator& group, std::vector<float>& amax,
                             std::vector<int64_t>& saturated) {
  const int64_t n = static_cast<int64_t>(amax.size());
  std::vector<int64_t> send(2 * n);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &amax[i], sizeof(bits));
    send[i] = bits;
    send[n + i] = saturated[i];
  }
  std::vector<int64_t> gathered(2 * n * group.size());
  MOETRAIN_RETURN_IF_ERROR(group.AllGather(send.data(), gathered.data(), 2 * n, DType::kI64));
  for (int64_t i = 0; i < n; ++i) {
    float reduced_amax = 0.0f;
    int64_t reduced_saturated = 0;
    for (int r = 0; r < group.size(); ++r) {
      const int64_t* words = gathered.data() + r * 2 * n;
      const uint32_t bits = static_cast<uint32_t>(words[i]);
      float value;
      std::memcpy(&value, &bits, sizeof(value));
      reduced_amax = MaxNanWins(reduced_amax, value);
      reduced_saturated += words[n + i];
    }
    amax[i] = reduced_amax;
    saturated[i] = reduced_saturated;
  }
  return absl::OkStatus();
}

}  // namespace

Fp8State::Fp8State(const Fp8RecipeConfig& config, const ExecContext& ctx)
    : config_(config), ctx_(ctx) {}

int Fp8State::Register(std::string name, int64_t groups) {
  if (allocated_ || groups < 1) return -1;
  const int id = static_cast<int>(linears_.size());
  linears_.push_back({std::move(name), groups});
  first_slot_.push_back(num_slots_);
  num_slots_ += groups * kNumFp8Roles;
  return id;
}

absl::Status Fp8State::Allocate() {
  if (allocated_) return absl::FailedPreconditionError("fp8 state: Allocate called twice");
  if (num_slots_ > 0) {
    Allocator& allocator = ctx_.allocator();
    MOETRAIN_ASSIGN_OR_RETURN(scales_, Tensor::Allocate(allocator, DType::kF32, {num_slots_}));
    MOETRAIN_ASSIGN_OR_RETURN(amaxes_, Tensor::Allocate(allocator, DType::kF32, {num_slots_}));
    MOETRAIN_ASSIGN_OR_RETURN(saturated_, Tensor::Allocate(allocator, DType::kI64, {num_slots_}));
    MOETRAIN_RETURN_IF_ERROR(ops::Fill(ctx_, scales_, 1.0f));
    MOETRAIN_RETURN_IF_ERROR(ops::Fill(ctx_, amaxes_, 0.0f));
    MOETRAIN_RETURN_IF_ERROR(ops::Fill(ctx_, saturated_, 0.0f));
  }
  if (config_.has_state()) histories_.assign(num_slots_ * config_.amax_history_len, 0.0f);
  last_stats_.clear();
  for (const LinearInfo& linear : linears_) last_stats_.emplace_back(linear.groups);
  allocated_ = true;
  return absl::OkStatus();
}

int64_t Fp8State::SlotIndex(int linear, int64_t group, Fp8Role role) const {
  return first_slot_[linear] + group * kNumFp8Roles + static_cast<int64_t>(role);
}

Fp8State::Slot Fp8State::slot(int linear, int64_t group, Fp8Role role) const {
  if (!allocated_ || linear < 0 || linear >= static_cast<int>(linears_.size()) || group < 0 ||
      group >= linears_[linear].groups) {
    return {};
  }
  const int64_t i = SlotIndex(linear, group, role);
  return {scales_.view().Slice(i, i + 1), amaxes_.view().Slice(i, i + 1),
          saturated_.view().Slice(i, i + 1)};
}

absl::Status Fp8State::EndStep(Communicator* group) {
  if (!allocated_) return absl::FailedPreconditionError("fp8 state: EndStep before Allocate");
  const int64_t n = num_slots_;
  if (n == 0) return absl::OkStatus();
  // The step's numbers on the host: the ranks exchange host buffers (as the trainer's other
  // per-step sums do), and the history update is a few flops per slot.
  std::vector<float> amax(n), scale(n);
  std::vector<int64_t> saturated(n);
  MOETRAIN_RETURN_IF_ERROR(
      ops::CopyTensor(ctx_, amaxes_, TensorView(amax.data(), DType::kF32, {n})));
  MOETRAIN_RETURN_IF_ERROR(
      ops::CopyTensor(ctx_, saturated_, TensorView(saturated.data(), DType::kI64, {n})));
  MOETRAIN_RETURN_IF_ERROR(
      ops::CopyTensor(ctx_, scales_, TensorView(scale.data(), DType::kF32, {n})));
  if (group != nullptr && group->size() > 1) {
    MOETRAIN_RETURN_IF_ERROR(ReduceOverRanks(*group, amax, saturated));
  }

  std::array<float, kNumFp8Roles> fp8_max;
  for (int r = 0; r < kNumFp8Roles; ++r) fp8_max[r] = Fp8Max(config_.format(Fp8Role(r)));
  for (size_t l = 0; l < linears_.size(); ++l) {
    for (int64_t g = 0; g < linears_[l].groups; ++g) {
      SlotStats& stats = last_stats_[l][g];
      for (int r = 0; r < kNumFp8Roles; ++r) {
        const int64_t i = SlotIndex(static_cast<int>(l), g, Fp8Role(r));
        stats.amax[r] = amax[i];
        stats.saturated[r] = saturated[i];
        if (config_.scaling(Fp8Role(r)) != ops::Fp8Scaling::kTensor) {
          stats.scale[r] = 0.0f;
        } else if (config_.recipe == Fp8RecipeKind::kDelayed) {
          stats.scale[r] = scale[i];
        } else {
          // Current scaling: every quantisation computes its own scale (each micro-batch, each
          // rank). The one reported is that of the step's amax, by the quantise op's formula:
          // the scale of the quantisation that set the amax, the same on every rank.
          stats.scale[r] = ScaleFromAmax(amax[i], fp8_max[r], config_.pow2_scales,
                                         config_.amax_epsilon, FLT_MAX);
        }
      }
    }
  }

  if (config_.recipe == Fp8RecipeKind::kDelayed) {
    // Transformer Engine's delayed-scaling update (GPU-NOTES.md §2), slot by slot.
    const int64_t len = config_.amax_history_len;
    std::array<float, kNumFp8Roles> scaled_max;
    for (int r = 0; r < kNumFp8Roles; ++r) {
      scaled_max[r] = fp8_max[r] * std::pow(2.0f, -static_cast<float>(config_.margin));
    }
    for (int64_t i = 0; i < n; ++i) {
      float* h = histories_.data() + i * len;
      h[0] = amax[i];
      // fmaxf from 0 as TE's kernel reduces: a NaN in the history drops out of the max.
      float window_max = 0.0f;
      for (int64_t j = 0; j < len; ++j) window_max = std::fmax(window_max, h[j]);
      const float chosen = config_.amax_most_recent ? h[0] : window_max;
      if (std::isfinite(chosen) && chosen > 0.0f) {
        // Slots go (linear, group, role) with the role innermost: i's role is i % kNumFp8Roles.
        const float updated = scaled_max[i % kNumFp8Roles] / chosen;
        scale[i] = std::isinf(updated) ? FLT_MAX : updated;
      }
      const float last = h[0];
      for (int64_t j = 1; j + 1 < len; ++j) h[j] = h[j + 1];
      h[len - 1] = last;
      h[0] = 0.0f;
    }
    MOETRAIN_RETURN_IF_ERROR(
        ops::CopyTensor(ctx_, TensorView(scale.data(), DType::kF32, {n}), scales_));
  }
  MOETRAIN_RETURN_IF_ERROR(ops::Fill(ctx_, amaxes_, 0.0f));
  return ops::Fill(ctx_, saturated_, 0.0f);
}

absl::StatusOr<Tensor> Fp8State::SaveState() const {
  if (!config_.has_state() || num_slots_ == 0) return Tensor();
  if (!allocated_) return absl::FailedPreconditionError("fp8 state: SaveState before Allocate");
  const int64_t n = num_slots_, len = config_.amax_history_len;
  std::vector<float> scale(n);
  MOETRAIN_RETURN_IF_ERROR(
      ops::CopyTensor(ctx_, scales_, TensorView(scale.data(), DType::kF32, {n})));
  Tensor saved = Tensor::Empty(DType::kF32, {n, 1 + len});
  float* out = saved.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    out[i * (1 + len)] = scale[i];
    std::memcpy(out + i * (1 + len) + 1, histories_.data() + i * len, len * sizeof(float));
  }
  return saved;
}

absl::Status Fp8State::LoadState(TensorView saved) {
  if (!allocated_) return absl::FailedPreconditionError("fp8 state: LoadState before Allocate");
  const bool keeps_state = config_.has_state() && num_slots_ > 0;
  const std::string expected =
      keeps_state ? absl::StrCat("(", num_slots_, ", ", 1 + config_.amax_history_len,
                                 ") f32 (slots, 1 + train.fp8.amax_history_len)")
                  : absl::StrCat("no state (recipe ", std::string(Fp8RecipeName(config_.recipe)),
                                 ", ", num_slots_, " slots)");
  const std::string got = saved.empty() ? "none" : saved.DebugString();
  const bool fits = keeps_state ? !saved.empty() && saved.device().is_cpu() &&
                                      saved.dtype() == DType::kF32 && saved.rank() == 2 &&
                                      saved.dim(0) == num_slots_ &&
                                      saved.dim(1) == 1 + config_.amax_history_len
                                : saved.empty() || saved.numel() == 0;
  if (!fits) {
    return absl::DataLossError(
        absl::StrCat("fp8 state: the checkpoint's does not fit this model and recipe: expected ",
                     expected, ", got ", got));
  }
  if (!keeps_state) return absl::OkStatus();
  const int64_t n = num_slots_, len = config_.amax_history_len;
  const float* in = saved.data<float>();
  std::vector<float> scale(n);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = in + i * saved.stride(0);
    scale[i] = row[0];
    for (int64_t j = 0; j < len; ++j) histories_[i * len + j] = row[(1 + j) * saved.stride(1)];
  }
  return ops::CopyTensor(ctx_, TensorView(scale.data(), DType::kF32, {n}), scales_);
}

}  // namespace moetrain
