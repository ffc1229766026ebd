#include "server/grpc/rpc_metrics.h"

#include <google/protobuf/descriptor.h>

#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/core/status.h"

namespace moetrain::server {
namespace {

// The labels of one method. Series are made on first use, so /metrics lists the methods and codes
// that happened, not all seventeen codes of every method.
struct MethodSeries {
  std::string service;
  std::string method;
  Family<Counter>* calls = nullptr;
  Family<Histogram>* duration = nullptr;
};

class RpcMetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit RpcMetricsInterceptor(const MethodSeries* series)
      : series_(series), start_(absl::Now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const std::string code = absl::StatusCodeToString(
          static_cast<absl::StatusCode>(methods->GetSendStatus().error_code()));
      absl::StatusOr<Counter*> calls =
          series_->calls->WithLabels({series_->service, series_->method, code});
      if (calls.ok()) (*calls)->Increment();
      absl::StatusOr<Histogram*> duration =
          series_->duration->WithLabels({series_->service, series_->method});
      if (duration.ok()) (*duration)->Observe(absl::ToDoubleSeconds(absl::Now() - start_));
    }
    methods->Proceed();
  }

 private:
  const MethodSeries* series_;
  const absl::Time start_;
};

class RpcMetricsFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsFactory(std::map<std::string, MethodSeries> series)
      : series_(std::move(series)) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    auto it = series_.find(info->method() == nullptr ? "" : info->method());
    if (it == series_.end()) it = series_.find("");
    return new RpcMetricsInterceptor(&it->second);
  }

 private:
  // By full method path ("/moetrain.v1.JobService/SubmitJob"); "" holds the "other" series.
  const std::map<std::string, MethodSeries> series_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
MakeRpcMetricsInterceptorFactory(MetricsRegistry* registry,
                                 const std::vector<std::string>& services) {
  MOETRAIN_ASSIGN_OR_RETURN(
      Family<Counter>* calls,
      registry->AddCounter("moetrain_rpcs_total", "gRPC calls finished, by method and status code.",
                           {"service", "method", "code"}));
  MOETRAIN_ASSIGN_OR_RETURN(
      Family<Histogram>* duration,
      registry->AddHistogram("moetrain_rpc_duration_seconds",
                             "gRPC call duration, from its start to its status (long polls and "
                             "streams included).",
                             {"service", "method"}, ExponentialBuckets(0.0005, 4, 12)));
  std::map<std::string, MethodSeries> series;
  series[""] = {"other", "other", calls, duration};
  for (const std::string& name : services) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    if (service == nullptr) {
      return absl::NotFoundError(absl::StrCat("gRPC service ", name, " is not linked in"));
    }
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string& method = service->method(i)->name();
      series[absl::StrCat("/", name, "/", method)] = {name, method, calls, duration};
    }
  }
  return std::make_unique<RpcMetricsFactory>(std::move(series));
}

}  // namespace moetrain::server
