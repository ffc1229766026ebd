#include "moetrain/v1/trainer_support.h"

namespace moetrain::v1 {

absl::Status CheckTrainerSupports(const JobSpec& spec) {
  // Every valid spec is runnable by this version. train.precision = FP8 runs on the CPU (an exact
  // emulation) and on CUDA (the cuBLASLt path). resources.device = CUDA is a matter of where the
  // job runs, not of whether it can: the scheduler gives it only to workers that offer GPUs, and
  // the trainer checks for a usable GPU when it starts (TrainerConfigFromSpec). This stays the one
  // place to refuse what a later limitation of the trainer cannot run.
  (void)spec;
  return absl::OkStatus();
}

}  // namespace moetrain::v1
