#include "engine/train/fp8_report.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <system_error>
#include <utility>

#include "absl/functional/function_ref.h"
#include "engine/train/trainer.h"

namespace moetrain {
namespace {

using RoleStats = std::array<Fp8OperandStats, kNumFp8Roles>;

// Folds one slot's statistics into `into`. A NaN amax stays (EndStep's max lets NaN win, so that
// a NaN anywhere shows); a scale of 0 is a block scaling's and says nothing about kTensor scales,
// and the scale of a slot that quantised nothing this step (an expert without tokens, amax 0) is
// not one the step used.
void Fold(const Fp8State::SlotStats& slot, RoleStats* into) {
  for (int role = 0; role < kNumFp8Roles; ++role) {
    Fp8OperandStats& to = (*into)[role];
    const float amax = slot.amax[role];
    if (std::isnan(amax) || (!std::isnan(to.amax) && amax > to.amax)) to.amax = amax;
    const float scale = slot.scale[role];
    if (scale > 0 && amax != 0) {
      to.scale_min = to.scale_min > 0 ? std::min(to.scale_min, scale) : scale;
      to.scale_max = std::max(to.scale_max, scale);
    }
    to.saturated += slot.saturated[role];
  }
}

}  // namespace

std::optional<int64_t> Fp8LayerOfLinear(std::string_view name) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (!name.starts_with(kPrefix)) return std::nullopt;
  const std::string_view rest = name.substr(kPrefix.size());
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  int64_t layer = 0;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + dot, layer);
  if (error != std::errc() || end != rest.data() + dot || layer < 0) return std::nullopt;
  return layer;
}

namespace {

// Both entry points: `stats_of(i)` is linear i's statistics.
void Aggregate(absl::Span<const Fp8State::LinearInfo> linears,
               absl::FunctionRef<const std::vector<Fp8State::SlotStats>&(size_t)> stats_of,
               std::vector<Fp8LayerStats>* layers, std::vector<Fp8ExpertStats>* experts) {
  std::map<int64_t, RoleStats> by_layer;
  std::map<std::pair<int64_t, int64_t>, RoleStats> by_expert;  // (layer, expert)
  for (size_t i = 0; i < linears.size(); ++i) {
    const std::optional<int64_t> layer = Fp8LayerOfLinear(linears[i].name);
    if (!layer.has_value()) continue;
    const std::vector<Fp8State::SlotStats>& stats = stats_of(i);
    // Before the first EndStep a linear has no statistics yet: it adds nothing.
    const size_t groups = std::min(stats.size(), static_cast<size_t>(linears[i].groups));
    if (groups == 0) continue;
    RoleStats& layer_stats = by_layer[*layer];
    for (size_t g = 0; g < groups; ++g) {
      Fold(stats[g], &layer_stats);
      if (linears[i].groups > 1) Fold(stats[g], &by_expert[{*layer, static_cast<int64_t>(g)}]);
    }
  }
  layers->clear();
  for (const auto& [layer, roles] : by_layer) layers->push_back({layer, roles});
  experts->clear();
  for (const auto& [key, roles] : by_expert) experts->push_back({key.first, key.second, roles});
}

}  // namespace

void AggregateFp8Stats(absl::Span<const Fp8State::LinearInfo> linears,
                       absl::Span<const std::vector<Fp8State::SlotStats>> stats,
                       std::vector<Fp8LayerStats>* layers, std::vector<Fp8ExpertStats>* experts) {
  static const std::vector<Fp8State::SlotStats> kNone;
  Aggregate(
      linears,
      [&](size_t i) -> const std::vector<Fp8State::SlotStats>& {
        return i < stats.size() ? stats[i] : kNone;
      },
      layers, experts);
}

void FillFp8Report(const Fp8State& state, StepReport* report) {
  Aggregate(
      state.linears(),
      [&](size_t i) -> const std::vector<Fp8State::SlotStats>& {
        return state.last_stats(static_cast<int>(i));
      },
      &report->fp8_layers, &report->fp8_experts);
}

}  // namespace moetrain
