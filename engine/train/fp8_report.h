// The FP8 statistics of one training step, as the step report carries them (train.precision
// FP8): from Fp8State's last-step statistics (one entry per linear layer, group and operand role),
// aggregated per transformer layer and, for the MoE layers' routed experts, per expert.
//
// A linear belongs to transformer layer i when its registered name starts "model.layers.<i>."
// (engine/model/block.h registers every projection so); other linears are left out. Per layer,
// over every linear of it and every group of those (the routed experts included):
//   amax       the largest amax of each operand role (NaN when any is NaN, as EndStep's max);
//   scale_min, scale_max  the smallest and largest per-tensor (kTensor) scale of each role; 0 when
//              the role has block scalings (blockwise, mxfp8), whose scales are not kept;
//   saturated  the values clamped to ±fp8_max, summed.
// Per expert, the same over the groups g = expert of the linears with groups > 1 (the routed
// experts' gate_up_proj and down_proj), expert being the global expert index. The per-expert
// rows are many (layers × experts): the coordinator exports them only behind its
// --metrics-per-expert flag (docs/service.md).
#ifndef MOETRAIN_ENGINE_TRAIN_FP8_REPORT_H_
#define MOETRAIN_ENGINE_TRAIN_FP8_REPORT_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "engine/fp8/fp8_recipe.h"
#include "engine/fp8/fp8_state.h"

namespace moetrain {

struct StepReport;

// One operand role over a set of tensors.
struct Fp8OperandStats {
  float amax = 0;
  float scale_min = 0;  // 0: no kTensor scale (block scalings)
  float scale_max = 0;
  int64_t saturated = 0;
};

struct Fp8LayerStats {
  int64_t layer = 0;                                // model.layers.<layer>
  std::array<Fp8OperandStats, kNumFp8Roles> roles;  // indexed by Fp8Role
};

struct Fp8ExpertStats {
  int64_t layer = 0;
  int64_t expert = 0;  // the global routed expert
  std::array<Fp8OperandStats, kNumFp8Roles> roles;
};

// The transformer layer of a registered linear's name ("model.layers.<i>.…" → i), or nullopt.
std::optional<int64_t> Fp8LayerOfLinear(std::string_view name);

// Sets report->fp8_layers and report->fp8_experts (layers ascending, then experts ascending) from
// the last EndStep's statistics. Called by the trainer after Fp8State::EndStep.
void FillFp8Report(const Fp8State& state, StepReport* report);

// FillFp8Report's aggregation, over linears and their stats (stats[i]: linears[i].groups
// entries, as Fp8State::last_stats(i)).
void AggregateFp8Stats(absl::Span<const Fp8State::LinearInfo> linears,
                       absl::Span<const std::vector<Fp8State::SlotStats>> stats,
                       std::vector<Fp8LayerStats>* layers, std::vector<Fp8ExpertStats>* experts);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_FP8_REPORT_H_
