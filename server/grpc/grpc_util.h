// What both gRPC services share: status conversion, the bearer-token check, and the refusal of
// requests that do not parse or carry fields this build does not know.
#ifndef MOETRAIN_SERVER_GRPC_GRPC_UTIL_H_
#define MOETRAIN_SERVER_GRPC_GRPC_UTIL_H_

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace moetrain::server {

// absl::Status → grpc::Status with the same code and message (the two share their numbering).
grpc::Status ToGrpcStatus(const absl::Status& status);

// Equal without an early exit, so the time taken does not reveal where `a` and `b` differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// Whether an Authorization value (HTTP header or gRPC metadata) is "Bearer <token>", compared in
// constant time.
bool BearerTokenMatches(absl::string_view authorization, absl::string_view token);

// The bearer token a service admits, and the token of the other kind of caller, which it refuses
// by design: with a worker token (--worker-token-file), JobService admits the users' token and
// refuses the worker token, WorkerService the other way round.
struct CallerToken {
  std::string token;  // empty = no authentication
  // The other service's token; empty = none. A call carrying it is PERMISSION_DENIED with
  // `other_refusal`, even where `token` is empty.
  std::string other_token;
  std::string other_refusal;
};

// OK when the call carries `authorization: Bearer <caller.token>`, or caller.token is empty (and
// the call does not carry caller.other_token); PERMISSION_DENIED with caller.other_refusal when it
// carries caller.other_token; else UNAUTHENTICATED, saying which was wrong.
grpc::Status Authenticate(const grpc::ServerContext& context, const CallerToken& caller);

// InvalidArgument naming the first message (by field path) that holds fields unknown to this
// build: a client newer than the coordinator would otherwise have them silently ignored.
absl::Status CheckNoUnknownFields(const google::protobuf::Message& message);

// The client of a call as ServerContext::peer() names it, without its port: "ipv4:10.0.0.7"
// for "ipv4:10.0.0.7:51234", "ipv6:[::1]" for "ipv6:[::1]:51234"; any other form whole. All the
// connections of one host (or of one proxy in front of many) have the same.
std::string PeerHost(absl::string_view peer);

// Authenticate, then CheckNoUnknownFields: the first thing every handler does.
grpc::Status Admit(const grpc::ServerContext& context, const CallerToken& caller,
                   const google::protobuf::Message& request);

// A server interceptor that answers a request whose bytes do not parse as its message with
// INVALID_ARGUMENT naming the method, where gRPC itself sends INTERNAL with an empty message.
// First among the server's interceptor creators:
//   creators.push_back(MakeParseErrorInterceptorFactory());
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeParseErrorInterceptorFactory();

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_GRPC_GRPC_UTIL_H_
