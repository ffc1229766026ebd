// moetrain.v1.JobService over a Coordinator: converts messages to core calls and absl::Status to
// grpc::Status (same code, message kept). Decides nothing itself beyond authentication.
//
// When a token is configured, every call must carry `authorization: Bearer <token>` metadata;
// anything else is UNAUTHENTICATED. The comparison takes the same time wherever the values differ.
#ifndef MOETRAIN_SERVER_GRPC_JOB_SERVICE_H_
#define MOETRAIN_SERVER_GRPC_JOB_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "moetrain/v1/coordinator.grpc.pb.h"
#include "server/core/coordinator.h"

namespace moetrain::server {

struct JobServiceOptions {
  // Empty = no authentication.
  std::string bearer_token;
  // How often a blocked WatchJob notices that its client went away.
  absl::Duration watch_cancel_check_interval = absl::Milliseconds(200);
};

// absl::Status → grpc::Status with the same code and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Equal without an early exit, so the time taken does not reveal where `a` and `b` differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

class JobService final : public v1::JobService::Service {
 public:
  // `coordinator` is not owned and must outlive the service.
  JobService(Coordinator* coordinator, JobServiceOptions options);

  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override;

 private:
  grpc::Status Authenticate(const grpc::ServerContext& context) const;

  Coordinator* const coordinator_;
  const JobServiceOptions options_;
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_GRPC_JOB_SERVICE_H_
