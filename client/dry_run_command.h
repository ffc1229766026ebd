// `moetrain submit --dry-run SPEC [--json]`: what the coordinator would make of the spec, without
// submitting it. Lists the coordinator's workers (ListWorkers, with submit's flags), plans the spec
// at its own dp × ep layout on a cluster of those workers (the preset of the job's device kind,
// h200-node for CUDA and cpu for the CPU, with the smallest device memory the matching workers
// advertise and the spec's devices_per_worker GPUs a node), prints the plan as `moetrain plan`
// does, and says whether the coordinator would accept the job: the spec completed as `submit`
// completes it (CompleteDeviceMemory, client/job_plan.h), judged by the rule the coordinator
// applies at submit (JudgeDeviceMemory, moetrain/v1/memory_admission.h).
#ifndef MOETRAIN_CLIENT_DRY_RUN_COMMAND_H_
#define MOETRAIN_CLIENT_DRY_RUN_COMMAND_H_

#include <string>

#include "client/job_commands.h"

namespace moetrain {

// Exit codes: 0 when the coordinator would accept the job; 2 when it would refuse it (the code a
// real submit would exit with), and for a bad spec or flag; 3 and 4 as for every client command
// (client/job_commands.h) when ListWorkers fails.
int SubmitDryRunCommand(const ClientOptions& options, const std::string& spec_path);

}  // namespace moetrain

#endif  // MOETRAIN_CLIENT_DRY_RUN_COMMAND_H_
