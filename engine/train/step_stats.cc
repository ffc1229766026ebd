#include "engine/train/step_stats.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/types/span.h"
#include "engine/core/status.h"
#include "engine/train/parallel.h"
#include "engine/train/trainer.h"

namespace moetrain {

StepStats::StepStats(int64_t moe_layers, int64_t num_experts, bool mtp)
    : moe_layers_(moe_layers),
      num_experts_(num_experts),
      mtp_(mtp),
      counts_(2 + moe_layers * num_experts, 0) {}

void StepStats::Add(const StepResult& result) {
  losses_[0] += result.loss;
  losses_[1] += result.aux_loss;
  losses_[2] += result.z_loss;
  losses_[3] += result.mtp_loss;
  counts_[0] += result.tokens;
  for (int64_t l = 0; l < static_cast<int64_t>(result.moe_layers.size()); ++l) {
    const MoeStats& stats = result.moe_layers[l];
    counts_[1] += stats.dropped_tokens;
    for (int64_t e = 0; e < num_experts_; ++e) {
      counts_[2 + l * num_experts_ + e] += stats.tokens_per_expert[e];
    }
  }
}

void StepStats::AddNonFinite(std::string detail) {
  non_finite_detail_ = std::move(detail);
  losses_[0] = std::nan("");
}

absl::Status StepStats::SumOverRanks(Communicator* world) {
  MOETRAIN_RETURN_IF_ERROR(moetrain::SumOverRanks(world, absl::MakeSpan(losses_)));
  return moetrain::SumOverRanks(world, absl::MakeSpan(counts_));
}

bool StepStats::finite_losses() const {
  return std::isfinite(losses_[0]) && std::isfinite(losses_[1]) && std::isfinite(losses_[2]) &&
         std::isfinite(losses_[3]);
}

std::vector<int64_t> StepStats::tokens_per_expert(int64_t layer) const {
  const int64_t* first = counts_.data() + 2 + layer * num_experts_;
  return std::vector<int64_t>(first, first + num_experts_);
}

void StepStats::Report(int64_t shares, StepReport* report) const {
  report->loss = loss(shares);
  report->aux_loss = aux_loss(shares);
  if (mtp_) report->mtp_loss = mtp_loss(shares);
  report->z_loss = z_loss(shares);
  report->dropped_tokens = counts_[1];
  report->expert_tokens.assign(counts_.begin() + 2, counts_.end());
  report->expert_load_per_layer.clear();
  report->expert_load_max_over_mean = 0;
  for (int64_t l = 0; l < moe_layers_; ++l) {
    int64_t total = 0, max = 0;
    for (int64_t c : tokens_per_expert(l)) {
      total += c;
      max = std::max(max, c);
    }
    const double load =
        total > 0 ? static_cast<double>(max) * num_experts_ / static_cast<double>(total) : 0.0;
    report->expert_load_per_layer.push_back(load);
    report->expert_load_max_over_mean = std::max(report->expert_load_max_over_mean, load);
  }
}

}  // namespace moetrain
