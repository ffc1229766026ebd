#include "server/grpc/grpc_util.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/unknown_field_set.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/core/limits.h"

namespace moetrain::server {
namespace {

absl::Status CheckFields(const google::protobuf::Message& message, const std::string& path) {
  const google::protobuf::Reflection* reflection = message.GetReflection();
  const google::protobuf::UnknownFieldSet& unknown = reflection->GetUnknownFields(message);
  if (!unknown.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path.empty() ? "the request" : path, " holds field number ", unknown.field(0).number(),
        ", which this coordinator does not know (is the client newer than the coordinator?)"));
  }
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const google::protobuf::FieldDescriptor* field : fields) {
    if (field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const std::string field_path =
        path.empty() ? field->name() : absl::StrCat(path, ".", field->name());
    if (field->is_repeated()) {
      for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
        absl::Status status = CheckFields(reflection->GetRepeatedMessage(message, field, i),
                                          absl::StrCat(field_path, "[", i, "]"));
        if (!status.ok()) return status;
      }
    } else {
      absl::Status status = CheckFields(reflection->GetMessage(message, field), field_path);
      if (!status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // An error may quote what the caller sent (a 100 KB job id); gRPC carries the message in a
  // trailer, which the client refuses past its metadata limit, so the caller would see
  // RESOURCE_EXHAUSTED instead of the real answer.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      TruncateWithMarker(status.message(), kMaxErrorMessageBytes));
}

std::string PeerHost(absl::string_view peer) {
  if (absl::StartsWith(peer, "ipv4:")) return std::string(peer.substr(0, peer.rfind(':')));
  if (absl::StartsWith(peer, "ipv6:[")) {
    const size_t close = peer.find(']');
    if (close != absl::string_view::npos) return std::string(peer.substr(0, close + 1));
  }
  return std::string(peer);
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Walk the longer length in full; a length mismatch folds into the result, not an early exit.
  const size_t length = std::max(a.size(), b.size());
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < length; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    difference |= static_cast<unsigned char>(x ^ y);
  }
  return difference == 0;
}

bool BearerTokenMatches(absl::string_view authorization, absl::string_view token) {
  return absl::ConsumePrefix(&authorization, "Bearer ") && ConstantTimeEquals(authorization, token);
}

grpc::Status Authenticate(const grpc::ServerContext& context, const CallerToken& caller) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  const std::optional<absl::string_view> authorization =
      it == metadata.end() ? std::nullopt
                           : std::optional<absl::string_view>(
                                 absl::string_view(it->second.data(), it->second.size()));
  if (!caller.other_token.empty() && authorization.has_value() &&
      BearerTokenMatches(*authorization, caller.other_token)) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, caller.other_refusal);
  }
  if (caller.token.empty()) return grpc::Status::OK;
  if (!authorization.has_value()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing 'authorization: Bearer <token>' metadata");
  }
  if (!BearerTokenMatches(*authorization, caller.token)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid bearer token");
  }
  return grpc::Status::OK;
}

absl::Status CheckNoUnknownFields(const google::protobuf::Message& message) {
  return CheckFields(message, "");
}

grpc::Status Admit(const grpc::ServerContext& context, const CallerToken& caller,
                   const google::protobuf::Message& request) {
  grpc::Status auth = Authenticate(context, caller);
  if (!auth.ok()) return auth;
  return ToGrpcStatus(CheckNoUnknownFields(request));
}

namespace {

// Sees the request arrive (POST_RECV_MESSAGE gives no message when it did not parse) and, for
// such a call, rewrites the status the handler machinery sends.
class ParseErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit ParseErrorInterceptor(const char* method) : method_(method != nullptr ? method : "") {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsed_ = true;
    }
    if (unparsed_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        methods->GetSendStatus().error_code() == grpc::StatusCode::INTERNAL) {
      const grpc::Status sent = methods->GetSendStatus();
      methods->ModifySendStatus(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("the request to ", method_, " does not parse as its protobuf message",
                       sent.error_message().empty() ? "" : ": ", sent.error_message())));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  bool unparsed_ = false;
};

class ParseErrorInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new ParseErrorInterceptor(info->method());
  }
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeParseErrorInterceptorFactory() {
  return std::make_unique<ParseErrorInterceptorFactory>();
}

}  // namespace moetrain::server
