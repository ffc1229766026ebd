// What this build's trainer can run, beyond what a valid spec may say: checked where a spec is
// run (the worker, TrainerConfigFromSpec) and where it is accepted (the coordinator's SubmitJob),
// so that a job no worker of this version could ever train is refused at submit instead of failing
// on every worker it is given to.
#ifndef MOETRAIN_PROTO_MOETRAIN_V1_TRAINER_SUPPORT_H_
#define MOETRAIN_PROTO_MOETRAIN_V1_TRAINER_SUPPORT_H_

#include "absl/status/status.h"
#include "moetrain/v1/job.pb.h"

namespace moetrain::v1 {

// OK, or Unimplemented naming the field and value the trainer cannot run: train.precision = FP8
// (no FP8 training loop yet) and resources.device = CUDA (the training loop runs on the CPU; the
// CUDA backend has kernels but no training loop yet). Whether this process was built with CUDA
// does not matter: no build's trainer trains on a GPU yet.
absl::Status CheckTrainerSupports(const JobSpec& spec);

}  // namespace moetrain::v1

#endif  // MOETRAIN_PROTO_MOETRAIN_V1_TRAINER_SUPPORT_H_
