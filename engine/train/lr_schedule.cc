#include "engine/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace moetrain {
namespace {

// `field` is the job spec's: the schedule is train.optimizer's, and it ends at train.steps.
absl::Status Invalid(absl::string_view field, auto value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, " ", why));
}

}  // namespace

absl::Status LrScheduleConfig::Validate() const {
  // Negated comparisons, so that NaN fails them.
  if (!(lr > 0.0f) || !std::isfinite(lr)) {
    return Invalid("train.optimizer.lr", lr, "must be positive and finite");
  }
  if (!(min_lr >= 0.0f) || !std::isfinite(min_lr)) {
    return Invalid("train.optimizer.min_lr", min_lr, "must be non-negative and finite");
  }
  if (min_lr > lr) {
    return Invalid("train.optimizer.min_lr", min_lr,
                   absl::StrCat("exceeds train.optimizer.lr = ", lr));
  }
  if (warmup_steps < 0) {
    return Invalid("train.optimizer.warmup_steps", warmup_steps, "must not be negative");
  }
  if (total_steps < 1) return Invalid("train.steps", total_steps, "must be at least 1");
  if (warmup_steps > total_steps) {
    return Invalid("train.optimizer.warmup_steps", warmup_steps,
                   absl::StrCat("exceeds train.steps = ", total_steps));
  }
  // An enum read from a wider integer may hold no enumerator.
  if (decay != DecayType::kCosine && decay != DecayType::kLinear && decay != DecayType::kConstant) {
    return Invalid("train.optimizer.decay", static_cast<int>(decay), "is not a decay type");
  }
  return absl::OkStatus();
}

float LearningRate(const LrScheduleConfig& config, int64_t step) {
  const double lr = config.lr;
  const double min_lr = config.min_lr;
  const int64_t s = std::max<int64_t>(step, 0);
  const int64_t warmup = config.warmup_steps;
  if (s < warmup) return static_cast<float>(lr * static_cast<double>(s + 1) / warmup);
  if (config.decay == DecayType::kConstant) return config.lr;
  const int64_t decay_steps = std::max<int64_t>(1, config.total_steps - warmup);
  const double progress = std::clamp(static_cast<double>(s - warmup) / decay_steps, 0.0, 1.0);
  // At p = 1 both forms give min_lr exactly, and at p = 0 (lr − min_lr is exact in f64) lr.
  const double remaining = config.decay == DecayType::kCosine
                               ? 0.5 * (1.0 + std::cos(std::numbers::pi * progress))
                               : 1.0 - progress;
  return static_cast<float>(min_lr + (lr - min_lr) * remaining);
}

}  // namespace moetrain
