// Per-RPC metrics for the coordinator's gRPC server, through a server interceptor:
//   moetrain_rpcs_total{service,method,code}        calls finished, by gRPC status code name
//   moetrain_rpc_duration_seconds{service,method}   from the call's start to its status
// Methods of services the factory was not told about count as service="other", method="other",
// so a client cannot grow the registry by calling made-up names.
//
//   std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
//   MOETRAIN_ASSIGN_OR_RETURN(creators.emplace_back(),
//       MakeRpcMetricsInterceptorFactory(&registry, {"moetrain.v1.JobService"}));
//   builder.experimental().SetInterceptorCreators(std::move(creators));
#ifndef MOETRAIN_SERVER_GRPC_RPC_METRICS_H_
#define MOETRAIN_SERVER_GRPC_RPC_METRICS_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/http/metrics.h"

namespace moetrain::server {

// `services` are full service names ("moetrain.v1.JobService") found in the generated descriptor
// pool; NotFound for one that is not there. The registry is not owned and outlives the server.
absl::StatusOr<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
MakeRpcMetricsInterceptorFactory(MetricsRegistry* registry,
                                 const std::vector<std::string>& services);

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_GRPC_RPC_METRICS_H_
