#include "server/grpc/worker_service.h"

#include <optional>
#include <utility>

#include "moetrain/v1/connect.h"
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

// The value of metadata `key` the call carries; empty when none.
std::string MetadataOf(const grpc::ServerContext& context, const char* key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(key);
  return it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

// With a worker token, the users' token is the other kind of caller's.
CallerToken WorkerCaller(std::string bearer_token, std::string worker_token) {
  if (worker_token.empty()) return CallerToken{.token = std::move(bearer_token)};
  return CallerToken{.token = std::move(worker_token),
                     .other_token = std::move(bearer_token),
                     .other_refusal =
                         "this coordinator has a worker token (--worker-token-file): "
                         "WorkerService admits it, not the users' token (--token-file)"};
}

}  // namespace

grpc::Status WorkerService::AdmitWorker(const grpc::ServerContext& context,
                                        const google::protobuf::Message& request,
                                        const std::string* named_worker_id,
                                        std::string* worker_id) {
  if (grpc::Status admitted = Admit(context, caller_, request); !admitted.ok()) {
    return admitted;
  }
  const std::string claimed = MetadataOf(context, kWorkerIdMetadata);
  if (named_worker_id == nullptr) {
    // A rendezvous call: its request names no worker, the metadata must.
    if (claimed.empty()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          absl::StrCat("the call names no worker (", kWorkerIdMetadata,
                                       " metadata, with ", kWorkerSecretMetadata, ")"));
    }
    *worker_id = claimed;
  } else {
    if (!claimed.empty() && claimed != *named_worker_id) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("the request names worker ", *named_worker_id,
                                       ", its credentials are worker ", claimed, "'s"));
    }
    *worker_id = *named_worker_id;
  }
  return ToGrpcStatus(fleet_->Authenticate(*worker_id, MetadataOf(context, kWorkerSecretMetadata)));
}

WorkerService::WorkerService(Fleet* fleet, std::string bearer_token, std::string worker_token)
    : fleet_(fleet), caller_(WorkerCaller(std::move(bearer_token), std::move(worker_token))) {}

grpc::Status WorkerService::RegisterWorker(grpc::ServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) {
  if (grpc::Status admitted = Admit(*context, caller_, *request); !admitted.ok()) {
    return admitted;
  }
  return Reply(fleet_->Register(*request, PeerHost(context->peer())), response);
}

grpc::Status WorkerService::Heartbeat(grpc::ServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) {
  std::string worker_id;
  if (grpc::Status admitted = AdmitWorker(*context, *request, &request->worker_id(), &worker_id);
      !admitted.ok()) {
    return admitted;
  }
  return Reply(fleet_->Heartbeat(*request), response);
}

grpc::Status WorkerService::GetAssignment(grpc::ServerContext* context,
                                          const v1::GetAssignmentRequest* request,
                                          v1::GetAssignmentResponse* response) {
  std::string worker_id;
  if (grpc::Status admitted = AdmitWorker(*context, *request, &request->worker_id(), &worker_id);
      !admitted.ok()) {
    return admitted;
  }
  return Reply(fleet_->GetAssignment(*request, [context] { return context->IsCancelled(); }),
               response);
}

grpc::Status WorkerService::ReportStep(grpc::ServerContext* context,
                                       const v1::ReportStepRequest* request,
                                       v1::ReportStepResponse*) {
  std::string worker_id;
  if (grpc::Status admitted = AdmitWorker(*context, *request, &request->worker_id(), &worker_id);
      !admitted.ok()) {
    return admitted;
  }
  return ToGrpcStatus(fleet_->ReportStep(*request));
}

grpc::Status WorkerService::ReportLog(grpc::ServerContext* context,
                                      const v1::ReportLogRequest* request, v1::ReportLogResponse*) {
  std::string worker_id;
  if (grpc::Status admitted = AdmitWorker(*context, *request, &request->worker_id(), &worker_id);
      !admitted.ok()) {
    return admitted;
  }
  return ToGrpcStatus(fleet_->ReportLog(*request));
}

grpc::Status WorkerService::ReportCheckpoint(grpc::ServerContext* context,
                                             const v1::ReportCheckpointRequest* request,
                                             v1::ReportCheckpointResponse*) {
  std::string worker_id;
  if (grpc::Status admitted = AdmitWorker(*context, *request, &request->worker_id(), &worker_id);
      !admitted.ok()) {
    return admitted;
  }
  return ToGrpcStatus(fleet_->ReportCheckpoint(*request));
}

grpc::Status WorkerService::ReportAttemptEnd(grpc::ServerContext* context,
                                             const v1::ReportAttemptEndRequest* request,
                                             v1::ReportAttemptEndResponse*) {
  std::string worker_id;
  if (grpc::Status admitted = AdmitWorker(*context, *request, &request->worker_id(), &worker_id);
      !admitted.ok()) {
    return admitted;
  }
  return ToGrpcStatus(fleet_->ReportAttemptEnd(*request));
}

grpc::Status WorkerService::KvSet(grpc::ServerContext* context, const v1::KvSetRequest* request,
                                  v1::KvSetResponse*) {
  std::string worker_id;
  if (grpc::Status admitted = AdmitWorker(*context, *request, nullptr, &worker_id);
      !admitted.ok()) {
    return admitted;
  }
  return ToGrpcStatus(fleet_->KvSet(worker_id, request->job_id(), request->attempt(),
                                    request->key(), request->value()));
}

grpc::Status WorkerService::KvGet(grpc::ServerContext* context, const v1::KvGetRequest* request,
                                  v1::KvGetResponse* response) {
  std::string worker_id;
  if (grpc::Status admitted = AdmitWorker(*context, *request, nullptr, &worker_id);
      !admitted.ok()) {
    return admitted;
  }
  absl::StatusOr<std::optional<std::string>> value =
      fleet_->KvGet(worker_id, request->job_id(), request->attempt(), request->key());
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_found(value->has_value());
  if (value->has_value()) response->set_value(std::move(**value));
  return grpc::Status::OK;
}

grpc::Status WorkerService::KvWait(grpc::ServerContext* context, const v1::KvWaitRequest* request,
                                   v1::KvWaitResponse* response) {
  std::string worker_id;
  if (grpc::Status admitted = AdmitWorker(*context, *request, nullptr, &worker_id);
      !admitted.ok()) {
    return admitted;
  }
  absl::StatusOr<std::string> value = fleet_->KvWait(
      worker_id, request->job_id(), request->attempt(), request->key(),
      FromProtoDuration(request->timeout()), [context] { return context->IsCancelled(); });
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(std::move(*value));
  return grpc::Status::OK;
}

}  // namespace moetrain::server
