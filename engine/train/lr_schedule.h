// The learning rate of each optimizer step: linear warmup, then cosine, linear or no decay.
#ifndef MOETRAIN_ENGINE_TRAIN_LR_SCHEDULE_H_
#define MOETRAIN_ENGINE_TRAIN_LR_SCHEDULE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace moetrain {

enum class DecayType { kCosine, kLinear, kConstant };

// Field names and defaults mirror JobSpec.train.optimizer; total_steps is train.steps.
struct LrScheduleConfig {
  float lr = 3e-4f;          // peak learning rate, reached at the last warmup step
  float min_lr = 3e-5f;      // floor of the cosine and linear decays, reached at total_steps
  int64_t warmup_steps = 0;  // W ≥ 0
  DecayType decay = DecayType::kCosine;
  int64_t total_steps = 1000;  // N ≥ max(1, W)

  // OK, or InvalidArgument naming the field and its value:
  // "train.optimizer.min_lr = 1 exceeds train.optimizer.lr = 0.0003".
  absl::Status Validate() const;
};

// The learning rate of optimizer step s (0-based; negative s counts as 0), in f64, then rounded:
//   s < W:  lr · (s + 1) / W                        (so step W − 1 has exactly lr)
//   else:   p = (s − W) / max(1, N − W), clamped to [0, 1]
//           cosine:   min_lr + (lr − min_lr) · ½ · (1 + cos(π·p))
//           linear:   min_lr + (lr − min_lr) · (1 − p)
//           constant: lr
// Step W has exactly lr and steps ≥ N exactly min_lr (constant: lr). `config` must be valid.
float LearningRate(const LrScheduleConfig& config, int64_t step);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_LR_SCHEDULE_H_
