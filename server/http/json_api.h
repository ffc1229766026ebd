// The coordinator's JSON API, read-only, for the dashboard page (and for scripts):
//
//   GET /api/v1/jobs                 {"jobs": [job summary...], "next_page_token"}
//                                    ?page_size=N (1..1000, default 100) &page_token=T
//                                    &state=RUNNING (or several: state=RUNNING,RESTARTING)
//   GET /api/v1/jobs/{id}            {"job": job summary + "spec" (the stored JobSpec as JSON)
//                                    + "last_metrics" (the newest step report, or null)}
//   GET /api/v1/jobs/{id}/metrics    {"job_id", "points": [step report...], "next_after", "more",
//                                    "expert_tokens": {"step", "layers", "experts", "counts"}|null}
//                                    ?after=S (only events after sequence S) &limit=N (1..10000);
//                                    a page also ends before 1 MiB of points (`more` set)
//   GET /api/v1/workers              {"workers": [worker...], "next_page_token"}
//                                    ?page_size=N (1..1000, default 100) &page_token=T
//
// Field by field in docs/service.md. With a bearer token configured every call needs
// `Authorization: Bearer <token>`: 401 otherwise. Errors are JSON too:
// {"error": {"code": 404, "status": "NOT_FOUND", "message": "..."}}.
//
// Transport only: reads go to the Coordinator and the Fleet; this file converts.
#ifndef MOETRAIN_SERVER_HTTP_JSON_API_H_
#define MOETRAIN_SERVER_HTTP_JSON_API_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/core/coordinator.h"
#include "server/core/fleet.h"
#include "server/http/http_server.h"

namespace moetrain::server {

// Most step reports one metrics call returns unless `limit` says otherwise; the caller asks again
// with next_after when `more` is true.
inline constexpr int kDefaultMetricsLimit = 5000;
inline constexpr int kMaxMetricsLimit = 10000;

class JsonApi : public HttpHandler {
 public:
  // Not owned; they outlive the API. An empty token: no authentication.
  JsonApi(Coordinator* coordinator, Fleet* fleet, std::string bearer_token);

  // Every path under /api/: the known ones by their template, the others as "other" (answered
  // 404).
  std::optional<std::string> Route(absl::string_view path) const override;
  HttpResponse Handle(const HttpRequest& request) override;

 private:
  // The newest evaluation of a job found so far in its events, and where the scan stopped.
  struct EvalScan {
    int64_t next_sequence = 1;  // store sequence
    std::optional<double> eval_loss;
    int64_t eval_step = 0;
  };

  HttpResponse ListJobs(const HttpRequest& request);
  HttpResponse GetJob(const std::string& job_id);
  HttpResponse JobMetrics(const std::string& job_id, const HttpRequest& request);
  HttpResponse ListWorkers(const HttpRequest& request);
  // Brings the job's EvalScan up to its newest event. The first call for a job reads its log
  // backward to the newest evaluation; later ones read only the events since.
  absl::StatusOr<EvalScan> LatestEval(const std::string& job_id);

  Coordinator* const coordinator_;
  Fleet* const fleet_;
  const std::string bearer_token_;
  absl::Mutex mu_;
  std::map<std::string, EvalScan> eval_scans_ ABSL_GUARDED_BY(mu_);
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_HTTP_JSON_API_H_
