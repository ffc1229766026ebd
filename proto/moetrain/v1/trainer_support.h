// What this version's trainer can run, beyond what a valid spec may say: checked where a spec is
// run (the worker, TrainerConfigFromSpec) and where it is accepted (the coordinator's SubmitJob),
// so that a job no worker of this version could ever train is refused at submit instead of failing
// on every worker it is given to.
#ifndef MOETRAIN_PROTO_MOETRAIN_V1_TRAINER_SUPPORT_H_
#define MOETRAIN_PROTO_MOETRAIN_V1_TRAINER_SUPPORT_H_

#include "absl/status/status.h"
#include "moetrain/v1/job.pb.h"

namespace moetrain::v1 {

// OK, or Unimplemented naming the field and value the trainer cannot run. This version runs every
// valid spec, train.precision = FP8 included (on the CPU and on CUDA), so it is always OK today;
// it stays so that a limitation added later is refused at submit. A function of the spec alone:
// resources.device = CUDA is accepted whether or not this process was built with CUDA or has a
// GPU, because the coordinator that calls it at submit needs neither (it places a CUDA job only on
// workers that offer GPUs); where the trainer starts, TrainerConfigFromSpec (worker/job_config.h)
// refuses a CUDA job on a machine without a usable GPU.
absl::Status CheckTrainerSupports(const JobSpec& spec);

}  // namespace moetrain::v1

#endif  // MOETRAIN_PROTO_MOETRAIN_V1_TRAINER_SUPPORT_H_
