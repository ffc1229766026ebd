#include "moetrain/v1/trainer_support.h"

namespace moetrain::v1 {

absl::Status CheckTrainerSupports(const JobSpec& spec) {
  if (spec.train().precision() == TrainConfig::FP8) {
    return absl::UnimplementedError(
        "train.precision = FP8: the trainer has no FP8 training loop yet, on any device (use "
        "FP32 or BF16)");
  }
  // resources.device = CUDA is a matter of where the job runs, not of whether it can: the
  // scheduler gives it only to workers that offer GPUs, and the trainer checks for a usable GPU
  // when it starts (TrainerConfigFromSpec).
  return absl::OkStatus();
}

}  // namespace moetrain::v1
