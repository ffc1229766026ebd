#include "server/grpc/worker_service.h"

#include <optional>
#include <utility>

#include "moetrain/v1/proto_time.h"
#include "server/grpc/grpc_util.h"

namespace moetrain::server {
namespace {

// The reply of a handler whose core call returns a response message.
template <typename Response>
grpc::Status Reply(absl::StatusOr<Response> result, Response* response) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

}  // namespace

WorkerService::WorkerService(Fleet* fleet, std::string bearer_token)
    : fleet_(fleet), bearer_token_(std::move(bearer_token)) {}

grpc::Status WorkerService::RegisterWorker(grpc::ServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) {
  if (grpc::Status admitted = Admit(*context, bearer_token_, *request); !admitted.ok()) {
    return admitted;
  }
  return Reply(fleet_->Register(*request), response);
}

grpc::Status WorkerService::Heartbeat(grpc::ServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) {
  if (grpc::Status admitted = Admit(*context, bearer_token_, *request); !admitted.ok()) {
    return admitted;
  }
  return Reply(fleet_->Heartbeat(*request), response);
}

grpc::Status WorkerService::GetAssignment(grpc::ServerContext* context,
                                          const v1::GetAssignmentRequest* request,
                                          v1::GetAssignmentResponse* response) {
  if (grpc::Status admitted = Admit(*context, bearer_token_, *request); !admitted.ok()) {
    return admitted;
  }
  return Reply(fleet_->GetAssignment(*request, [context] { return context->IsCancelled(); }),
               response);
}

grpc::Status WorkerService::ReportStep(grpc::ServerContext* context,
                                       const v1::ReportStepRequest* request,
                                       v1::ReportStepResponse*) {
  if (grpc::Status admitted = Admit(*context, bearer_token_, *request); !admitted.ok()) {
    return admitted;
  }
  return ToGrpcStatus(fleet_->ReportStep(*request));
}

grpc::Status WorkerService::ReportLog(grpc::ServerContext* context,
                                      const v1::ReportLogRequest* request,
                                      v1::ReportLogResponse*) {
  if (grpc::Status admitted = Admit(*context, bearer_token_, *request); !admitted.ok()) {
    return admitted;
  }
  return ToGrpcStatus(fleet_->ReportLog(*request));
}

grpc::Status WorkerService::ReportCheckpoint(grpc::ServerContext* context,
                                             const v1::ReportCheckpointRequest* request,
                                             v1::ReportCheckpointResponse*) {
  if (grpc::Status admitted = Admit(*context, bearer_token_, *request); !admitted.ok()) {
    return admitted;
  }
  return ToGrpcStatus(fleet_->ReportCheckpoint(*request));
}

grpc::Status WorkerService::ReportAttemptEnd(grpc::ServerContext* context,
                                             const v1::ReportAttemptEndRequest* request,
                                             v1::ReportAttemptEndResponse*) {
  if (grpc::Status admitted = Admit(*context, bearer_token_, *request); !admitted.ok()) {
    return admitted;
  }
  return ToGrpcStatus(fleet_->ReportAttemptEnd(*request));
}

grpc::Status WorkerService::KvSet(grpc::ServerContext* context, const v1::KvSetRequest* request,
                                  v1::KvSetResponse*) {
  if (grpc::Status admitted = Admit(*context, bearer_token_, *request); !admitted.ok()) {
    return admitted;
  }
  return ToGrpcStatus(
      fleet_->KvSet(request->job_id(), request->attempt(), request->key(), request->value()));
}

grpc::Status WorkerService::KvGet(grpc::ServerContext* context, const v1::KvGetRequest* request,
                                  v1::KvGetResponse* response) {
  if (grpc::Status admitted = Admit(*context, bearer_token_, *request); !admitted.ok()) {
    return admitted;
  }
  absl::StatusOr<std::optional<std::string>> value =
      fleet_->KvGet(request->job_id(), request->attempt(), request->key());
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_found(value->has_value());
  if (value->has_value()) response->set_value(std::move(**value));
  return grpc::Status::OK;
}

grpc::Status WorkerService::KvWait(grpc::ServerContext* context, const v1::KvWaitRequest* request,
                                   v1::KvWaitResponse* response) {
  if (grpc::Status admitted = Admit(*context, bearer_token_, *request); !admitted.ok()) {
    return admitted;
  }
  absl::StatusOr<std::string> value =
      fleet_->KvWait(request->job_id(), request->attempt(), request->key(),
                     FromProtoDuration(request->timeout()), [context] { return context->IsCancelled(); });
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(std::move(*value));
  return grpc::Status::OK;
}

}  // namespace moetrain::server
