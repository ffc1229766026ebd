#include "moetrain/v1/trainer_support.h"

namespace moetrain::v1 {

absl::Status CheckTrainerSupports(const JobSpec& spec) {
  if (spec.train().precision() == TrainConfig::FP8) {
    return absl::UnimplementedError(
        "train.precision = FP8 is not available on the CPU yet (use FP32 or BF16)");
  }
  if (spec.resources().device() == ResourceConfig::CUDA) {
    return absl::UnimplementedError(
        "resources.device = CUDA: this build's trainer runs on the CPU (the CUDA backend has "
        "kernels but no training loop yet)");
  }
  return absl::OkStatus();
}

}  // namespace moetrain::v1
