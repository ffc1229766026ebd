// JobSpec (the wire schema) → the engine's TrainerConfig. The engine never sees proto types:
// this is the one place that maps one onto the other.
#ifndef MOETRAIN_WORKER_JOB_CONFIG_H_
#define MOETRAIN_WORKER_JOB_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "engine/train/trainer.h"
#include "moetrain/v1/job.pb.h"

namespace moetrain {

// Resolves the spec's defaults (ResolveJobSpec), checks what this engine cannot do yet (FP8 and
// CUDA training), and fills a TrainerConfig (its micro-batch counted over all ranks).
// `checkpoint_dir` replaces spec.checkpoint.dir when not empty. Errors name the spec field.
absl::StatusOr<TrainerConfig> TrainerConfigFromSpec(const v1::JobSpec& spec,
                                                    const std::string& checkpoint_dir = "");

}  // namespace moetrain

#endif  // MOETRAIN_WORKER_JOB_CONFIG_H_
