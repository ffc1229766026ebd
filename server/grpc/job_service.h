// moetrain.v1.JobService over the coordinator core: converts messages to core calls (Coordinator
// for jobs and events, Fleet for cancellation, deletion and workers) and absl::Status to
// grpc::Status (same code, message kept). Decides nothing itself beyond admission: the users'
// bearer token when one is configured (never the worker token), and no fields unknown to this
// build. SubmitJob also asks the fleet whether a registered worker can hold one rank of the job
// (Fleet::CheckDeviceMemory).
#ifndef MOETRAIN_SERVER_GRPC_JOB_SERVICE_H_
#define MOETRAIN_SERVER_GRPC_JOB_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "moetrain/v1/coordinator.grpc.pb.h"
#include "server/core/coordinator.h"
#include "server/core/fleet.h"
#include "server/grpc/grpc_util.h"

namespace moetrain::server {

struct JobServiceOptions {
  // The users' token; empty = no authentication.
  std::string bearer_token;
  // The workers' token (--worker-token-file), which admits WorkerService only: a call carrying
  // it is PERMISSION_DENIED. Empty = none.
  std::string worker_token;
  // The fleet's checkpoint root and the operator's data roots, as the workers see them: a spec
  // whose checkpoint.dir, or data.path or checkpoint.init_from, is visibly outside them is refused
  // at submit (INVALID_ARGUMENT). Empty = not checked.
  std::string checkpoint_root;
  std::vector<std::string> data_roots;
  // How often a blocked WatchJob notices that its client went away.
  absl::Duration watch_cancel_check_interval = absl::Milliseconds(200);
};

// A stored job as the wire shows it. DataLoss when its stored spec does not parse.
absl::Status ToProto(const JobRecord& record, v1::Job* job);
// A stored event as the wire shows it (store sequences start at 1, the wire's at 0).
void ToProto(const EventRecord& record, v1::JobEvent* event);

class JobService final : public v1::JobService::Service {
 public:
  // `coordinator` and `fleet` are not owned and outlive the service.
  JobService(Coordinator* coordinator, Fleet* fleet, JobServiceOptions options);

  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* context,
                               const v1::ListCheckpointsRequest* request,
                               v1::ListCheckpointsResponse* response) override;
  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;

 private:
  Coordinator* const coordinator_;
  Fleet* const fleet_;
  const JobServiceOptions options_;
  const CallerToken caller_;
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_GRPC_JOB_SERVICE_H_
