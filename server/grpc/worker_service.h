// moetrain.v1.WorkerService over the Fleet: converts messages and statuses, admits calls (the
// worker token, or without one the bearer token, when one is configured; no unknown fields; and
// the worker's secret on every call but RegisterWorker), and passes the rest on. The fleet
// decides everything else: fencing, validation, what each report means.
#ifndef MOETRAIN_SERVER_GRPC_WORKER_SERVICE_H_
#define MOETRAIN_SERVER_GRPC_WORKER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "moetrain/v1/worker.grpc.pb.h"
#include "server/core/fleet.h"
#include "server/grpc/grpc_util.h"

namespace moetrain::server {

class WorkerService final : public v1::WorkerService::Service {
 public:
  // `fleet` is not owned and outlives the service. The calls need `worker_token` when it is not
  // empty (and a call carrying the users' `bearer_token` is PERMISSION_DENIED), else
  // `bearer_token`; both empty = no authentication.
  WorkerService(Fleet* fleet, std::string bearer_token, std::string worker_token = "");

  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status GetAssignment(grpc::ServerContext* context, const v1::GetAssignmentRequest* request,
                             v1::GetAssignmentResponse* response) override;
  grpc::Status ReportStep(grpc::ServerContext* context, const v1::ReportStepRequest* request,
                          v1::ReportStepResponse* response) override;
  grpc::Status ReportLog(grpc::ServerContext* context, const v1::ReportLogRequest* request,
                         v1::ReportLogResponse* response) override;
  grpc::Status ReportCheckpoint(grpc::ServerContext* context,
                                const v1::ReportCheckpointRequest* request,
                                v1::ReportCheckpointResponse* response) override;
  grpc::Status ReportAttemptEnd(grpc::ServerContext* context,
                                const v1::ReportAttemptEndRequest* request,
                                v1::ReportAttemptEndResponse* response) override;
  grpc::Status KvSet(grpc::ServerContext* context, const v1::KvSetRequest* request,
                     v1::KvSetResponse* response) override;
  grpc::Status KvGet(grpc::ServerContext* context, const v1::KvGetRequest* request,
                     v1::KvGetResponse* response) override;
  grpc::Status KvWait(grpc::ServerContext* context, const v1::KvWaitRequest* request,
                      v1::KvWaitResponse* response) override;

 private:
  // Admit (token, unknown fields), then the worker's credentials: `named_worker_id` is the
  // request's worker_id, null for a request that names none (the rendezvous), whose worker the
  // metadata names. Sets `worker_id` to the caller's, once proved.
  grpc::Status AdmitWorker(const grpc::ServerContext& context,
                           const google::protobuf::Message& request,
                           const std::string* named_worker_id, std::string* worker_id);

  Fleet* const fleet_;
  const CallerToken caller_;
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_GRPC_WORKER_SERVICE_H_
