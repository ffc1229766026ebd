#include "server/http/json_api.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "moetrain/v1/coordinator.pb.h"
#include "moetrain/v1/proto_time.h"
#include "nlohmann/json.hpp"
#include "server/core/limits.h"
#include "server/grpc/grpc_util.h"
#include "server/grpc/job_service.h"

namespace moetrain::server {
namespace {

using Json = nlohmann::json;

constexpr char kApiPrefix[] = "/api/";
constexpr char kJobsPath[] = "/api/v1/jobs";
constexpr char kJobsPrefix[] = "/api/v1/jobs/";
constexpr char kMetricsSuffix[] = "/metrics";
constexpr char kWorkersPath[] = "/api/v1/workers";
constexpr char kJsonContentType[] = "application/json; charset=utf-8";
// Largest page of jobs (and of workers) the coordinator lists.
constexpr int kMaxPageSize = 1000;
// Events per read of the store's log.
constexpr int kEventsPerRead = 1000;
// Events per read for the metrics route, which may stop after the first (a page is full): fewer,
// so that a read of large reports does not hold many that the page will not use.
constexpr int kMetricsEventsPerRead = 100;

// What a path under /api/ names.
struct Target {
  enum Kind { kUnknown, kJobs, kJob, kJobMetrics, kWorkers } kind = kUnknown;
  std::string job_id;
};

Target Parse(absl::string_view path) {
  if (path == kJobsPath) return {Target::kJobs, ""};
  if (path == kWorkersPath) return {Target::kWorkers, ""};
  if (!absl::ConsumePrefix(&path, kJobsPrefix)) return {};
  Target::Kind kind = Target::kJob;
  if (absl::ConsumeSuffix(&path, kMetricsSuffix)) kind = Target::kJobMetrics;
  if (path.empty() || absl::StrContains(path, '/')) return {};
  return {kind, std::string(path)};
}

int HttpCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kFailedPrecondition:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

// `value` as an answer carries it. Invalid UTF-8 (a log line, a name) is replaced rather than
// failing the whole answer.
std::string JsonText(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

size_t JsonBytes(const Json& value) { return JsonText(value).size(); }

HttpResponse JsonResponse(int code, const Json& body) {
  HttpResponse response;
  response.code = code;
  response.content_type = kJsonContentType;
  response.body = JsonText(body);
  // Live data: a cached answer would show a stale job.
  response.headers.emplace_back("Cache-Control", "no-store");
  return response;
}

HttpResponse ErrorResponse(int code, absl::string_view status, absl::string_view message) {
  HttpResponse response = JsonResponse(
      code,
      {{"error",
        {{"code", code}, {"status", std::string(status)}, {"message", std::string(message)}}}});
  if (code == 401) response.headers.emplace_back("WWW-Authenticate", "Bearer");
  return response;
}

HttpResponse ErrorResponse(const absl::Status& status) {
  return ErrorResponse(HttpCode(status.code()), absl::StatusCodeToString(status.code()),
                       status.message());
}

std::string TimeText(absl::Time time) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone());
}

// Doubles that JSON cannot hold (NaN and infinities of a diverging step) become null.
Json Number(double value) { return std::isfinite(value) ? Json(value) : Json(nullptr); }

// The proto3 JSON mapping with the proto's own field names, as job specs are written.
absl::StatusOr<Json> MessageJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string text;
  const auto status = google::protobuf::util::MessageToJsonString(message, &text, options);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot write a ", message.GetTypeName(), " as JSON: ", status.ToString()));
  }
  Json parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return absl::InternalError(
        absl::StrCat("the JSON of a ", message.GetTypeName(), " does not parse back"));
  }
  return parsed;
}

// One step report; its per-expert counts go elsewhere (ExpertTokensJson): only the newest is shown.
Json MetricsJson(const v1::StepMetrics& m) {
  Json layers = Json::array();
  for (double load : m.expert_load_per_layer()) layers.push_back(Number(load));
  return {{"step", m.step()},
          {"loss", Number(m.loss())},
          {"eval_loss", m.has_eval_loss() ? Number(m.eval_loss()) : Json(nullptr)},
          {"lr", Number(m.lr())},
          {"grad_norm", Number(m.grad_norm())},
          {"tokens_per_s", Number(m.tokens_per_s())},
          {"mfu", Number(m.mfu())},
          {"tokens_seen", m.tokens_seen()},
          {"aux_loss", Number(m.aux_loss())},
          {"z_loss", Number(m.z_loss())},
          {"mtp_loss", m.has_mtp_loss() ? Number(m.mtp_loss()) : Json(nullptr)},
          {"dropped_tokens", m.dropped_tokens()},
          {"step_seconds", Number(m.step_seconds())},
          {"device_memory_bytes", m.device_memory_bytes()},
          {"device_memory_peak_bytes", m.device_memory_peak_bytes()},
          {"expert_load_max_over_mean", Number(m.expert_load_max_over_mean())},
          {"expert_load_per_layer", std::move(layers)}};
}

// The (layers × experts) counts of a report, or null when it has none or they do not form a
// matrix.
Json ExpertTokensJson(int64_t sequence, const v1::StepMetrics& m) {
  const int layers = m.expert_load_per_layer_size();
  if (layers == 0 || m.expert_tokens_size() == 0 || m.expert_tokens_size() % layers != 0) {
    return nullptr;
  }
  const int experts = m.expert_tokens_size() / layers;
  Json counts = Json::array();
  for (int l = 0; l < layers; ++l) {
    counts.push_back(std::vector<int64_t>(m.expert_tokens().begin() + l * experts,
                                          m.expert_tokens().begin() + (l + 1) * experts));
  }
  return {{"sequence", sequence},
          {"step", m.step()},
          {"layers", layers},
          {"experts", experts},
          {"counts", std::move(counts)}};
}

// `name` from the query as an integer in [low, high]; `fallback` when absent.
absl::StatusOr<int64_t> IntParam(const HttpRequest& request, const std::string& name,
                                 int64_t fallback, int64_t low, int64_t high) {
  auto it = request.query.find(name);
  if (it == request.query.end()) return fallback;
  int64_t value = 0;
  if (!absl::SimpleAtoi(it->second, &value) || value < low || value > high) {
    return absl::InvalidArgumentError(absl::StrCat("query parameter ", name, " = '", it->second,
                                                   "' is not an integer in [", low, ", ", high,
                                                   "]"));
  }
  return value;
}

// A listing's page_size (1 to kMaxPageSize; 0 when absent: the default) and page_token.
struct PageQuery {
  int page_size = 0;
  std::string page_token;
};

absl::StatusOr<PageQuery> PageQueryOf(const HttpRequest& request) {
  PageQuery query;
  absl::StatusOr<int64_t> page_size = IntParam(request, "page_size", 0, 1, kMaxPageSize);
  if (!page_size.ok()) return page_size.status();
  query.page_size = static_cast<int>(*page_size);
  if (auto it = request.query.find("page_token"); it != request.query.end()) {
    query.page_token = it->second;
  }
  return query;
}

}  // namespace

JsonApi::JsonApi(Coordinator* coordinator, Fleet* fleet, std::string bearer_token)
    : coordinator_(coordinator), fleet_(fleet), bearer_token_(std::move(bearer_token)) {}

std::optional<std::string> JsonApi::Route(absl::string_view path) const {
  if (!absl::StartsWith(path, kApiPrefix)) return std::nullopt;
  switch (Parse(path).kind) {
    case Target::kJobs:
      return kJobsPath;
    case Target::kJob:
      return "/api/v1/jobs/{id}";
    case Target::kJobMetrics:
      return "/api/v1/jobs/{id}/metrics";
    case Target::kWorkers:
      return kWorkersPath;
    case Target::kUnknown:
      break;
  }
  return "other";
}

HttpResponse JsonApi::Handle(const HttpRequest& request) {
  if (!bearer_token_.empty()) {
    if (request.authorization.empty()) {
      return ErrorResponse(
          absl::UnauthenticatedError("missing 'Authorization: Bearer <token>' header"));
    }
    if (!BearerTokenMatches(request.authorization, bearer_token_)) {
      return ErrorResponse(absl::UnauthenticatedError("invalid bearer token"));
    }
  }
  const Target target = Parse(request.path);
  if (target.kind == Target::kUnknown) {
    return ErrorResponse(absl::NotFoundError(absl::StrCat("no API at ", request.path)));
  }
  if (request.method != "GET" && request.method != "HEAD") {
    HttpResponse response =
        ErrorResponse(405, "METHOD_NOT_ALLOWED",
                      absl::StrCat("method ", request.method, " is not allowed on ", request.path,
                                   ": the API is read-only (GET)"));
    response.headers.emplace_back("Allow", "GET, HEAD");
    return response;
  }
  switch (target.kind) {
    case Target::kJobs:
      return ListJobs(request);
    case Target::kJob:
      return GetJob(target.job_id);
    case Target::kJobMetrics:
      return JobMetrics(target.job_id, request);
    case Target::kWorkers:
      return ListWorkers(request);
    case Target::kUnknown:
      break;
  }
  return ErrorResponse(absl::NotFoundError(absl::StrCat("no API at ", request.path)));
}

namespace {

// The evaluation a step report carries, if any.
std::optional<v1::StepMetrics> Evaluation(const EventRecord& event) {
  if (event.kind != kStepMetricsEventKind) return std::nullopt;
  v1::StepMetrics metrics;
  if (!metrics.ParseFromString(event.payload) || !metrics.has_eval_loss()) return std::nullopt;
  return metrics;
}

}  // namespace

absl::StatusOr<JsonApi::EvalScan> JsonApi::LatestEval(const std::string& job_id) {
  std::optional<EvalScan> cached;
  {
    absl::MutexLock lock(&mu_);
    auto it = eval_scans_.find(job_id);
    if (it != eval_scans_.end()) cached = it->second;
  }
  EvalScan scan;
  if (cached.has_value()) {
    // Forward from where the last scan stopped: only the events since.
    scan = *cached;
    for (;;) {
      absl::StatusOr<std::vector<EventRecord>> events =
          coordinator_->ReadEvents(job_id, scan.next_sequence, kEventsPerRead);
      if (!events.ok()) return events.status();
      for (const EventRecord& event : *events) {
        scan.next_sequence = event.sequence + 1;
        if (std::optional<v1::StepMetrics> eval = Evaluation(event); eval.has_value()) {
          scan.eval_loss = eval->eval_loss();
          scan.eval_step = eval->step();
        }
      }
      if (static_cast<int>(events->size()) < kEventsPerRead) break;
    }
  } else {
    // First look at this job: backward from its newest event, one block at a time, to the newest
    // evaluation, which is near the end of a long log.
    absl::StatusOr<std::optional<EventRecord>> last = coordinator_->LastEvent(job_id);
    if (!last.ok()) return last.status();
    const int64_t newest = last->has_value() ? (*last)->sequence : 0;
    scan.next_sequence = newest + 1;
    for (int64_t end = newest; end >= 1 && !scan.eval_loss.has_value(); end -= kEventsPerRead) {
      const int64_t begin = std::max<int64_t>(1, end - kEventsPerRead + 1);
      absl::StatusOr<std::vector<EventRecord>> events =
          coordinator_->ReadEvents(job_id, begin, static_cast<int>(end - begin + 1));
      if (!events.ok()) return events.status();
      for (auto it = events->rbegin(); it != events->rend(); ++it) {
        if (std::optional<v1::StepMetrics> eval = Evaluation(*it); eval.has_value()) {
          scan.eval_loss = eval->eval_loss();
          scan.eval_step = eval->step();
          break;
        }
      }
    }
  }
  absl::MutexLock lock(&mu_);
  EvalScan& stored = eval_scans_[job_id];
  // Another request may have scanned further meanwhile; keep whichever saw more.
  if (scan.next_sequence >= stored.next_sequence) stored = scan;
  return stored;
}

namespace {

// The fields of a job the list and the single view share.
Json JobSummary(const JobRecord& record, const v1::Job& job, const std::optional<double>& eval_loss,
                int64_t eval_step) {
  const v1::StepMetrics& m = job.last_metrics();
  const bool reported = job.has_last_metrics();
  const int64_t total_steps = job.spec().train().steps();
  return {
      {"id", record.id},
      {"name", record.name},
      {"submission_id", record.submission_id},
      {"state", std::string(JobStateName(record.state))},
      {"state_reason", record.state_reason},
      {"waiting_reason", record.waiting_reason},
      {"next_attempt_time", record.next_attempt_at.has_value()
                                ? Json(TimeText(*record.next_attempt_at))
                                : Json(nullptr)},
      {"priority", record.priority},
      {"attempt", record.attempt},
      {"restarts", record.restarts},
      {"create_time", TimeText(record.created_at)},
      {"update_time", TimeText(record.updated_at)},
      {"workers", job.spec().resources().workers()},
      {"step", reported ? m.step() : 0},
      {"total_steps", total_steps},
      {"progress", total_steps > 0 && reported
                       ? std::clamp(static_cast<double>(m.step()) / total_steps, 0.0, 1.0)
                       : 0.0},
      {"loss", reported ? Number(m.loss()) : Json(nullptr)},
      {"eval_loss", eval_loss.has_value() ? Number(*eval_loss) : Json(nullptr)},
      {"eval_step", eval_loss.has_value() ? Json(eval_step) : Json(nullptr)},
      {"tokens_per_s", reported ? Number(m.tokens_per_s()) : Json(nullptr)},
      {"tokens_seen", reported ? m.tokens_seen() : 0},
      {"mfu", reported ? Number(m.mfu()) : Json(nullptr)},
      {"expert_load_max_over_mean",
       reported ? Number(m.expert_load_max_over_mean()) : Json(nullptr)},
      {"best_possible_loss",
       reported && m.has_best_possible_loss() ? Number(m.best_possible_loss()) : Json(nullptr)},
      {"latest_checkpoint_step", record.latest_checkpoint_step.has_value()
                                     ? Json(*record.latest_checkpoint_step)
                                     : Json(nullptr)},
  };
}

}  // namespace

HttpResponse JsonApi::ListJobs(const HttpRequest& request) {
  ListOptions options;
  absl::StatusOr<PageQuery> page_query = PageQueryOf(request);
  if (!page_query.ok()) return ErrorResponse(page_query.status());
  options.page_size = page_query->page_size;
  options.page_token = page_query->page_token;
  if (auto it = request.query.find("state"); it != request.query.end()) {
    for (absl::string_view name : absl::StrSplit(it->second, ',', absl::SkipEmpty())) {
      absl::StatusOr<JobState> state = ParseJobState(name);
      if (!state.ok()) {
        return ErrorResponse(absl::InvalidArgumentError(
            absl::StrCat("query parameter state: ", state.status().message())));
      }
      options.states.push_back(*state);
    }
  }
  absl::StatusOr<JobPage> page = coordinator_->List(options);
  if (!page.ok()) return ErrorResponse(page.status());
  Json jobs = Json::array();
  for (const JobRecord& record : page->jobs) {
    v1::Job job;
    if (absl::Status converted = ToProto(record, &job); !converted.ok()) {
      return ErrorResponse(converted);
    }
    absl::StatusOr<EvalScan> eval = LatestEval(record.id);
    if (!eval.ok()) return ErrorResponse(eval.status());
    jobs.push_back(JobSummary(record, job, eval->eval_loss, eval->eval_step));
  }
  return JsonResponse(200, {{"jobs", std::move(jobs)}, {"next_page_token", page->next_page_token}});
}

HttpResponse JsonApi::GetJob(const std::string& job_id) {
  absl::StatusOr<JobRecord> record = coordinator_->Get(job_id);
  if (!record.ok()) return ErrorResponse(record.status());
  v1::Job job;
  if (absl::Status converted = ToProto(*record, &job); !converted.ok()) {
    return ErrorResponse(converted);
  }
  absl::StatusOr<EvalScan> eval = LatestEval(record->id);
  if (!eval.ok()) return ErrorResponse(eval.status());
  Json summary = JobSummary(*record, job, eval->eval_loss, eval->eval_step);
  absl::StatusOr<Json> spec = MessageJson(job.spec());
  if (!spec.ok()) return ErrorResponse(spec.status());
  summary["spec"] = *std::move(spec);
  summary["last_metrics"] = job.has_last_metrics() ? MetricsJson(job.last_metrics()) : Json();
  return JsonResponse(200, {{"job", std::move(summary)}});
}

HttpResponse JsonApi::JobMetrics(const std::string& job_id, const HttpRequest& request) {
  // Sequences as the gRPC WatchJob numbers them (from 0); the store's start at 1.
  absl::StatusOr<int64_t> after = IntParam(request, "after", -1, -1, INT64_MAX - 2);
  if (!after.ok()) return ErrorResponse(after.status());
  absl::StatusOr<int64_t> limit =
      IntParam(request, "limit", kDefaultMetricsLimit, 1, kMaxMetricsLimit);
  if (!limit.ok()) return ErrorResponse(limit.status());
  Json points = Json::array();
  Json expert_tokens = nullptr;
  int64_t next_after = *after;
  bool more = false;
  // The answer's bytes: its points, and the per-expert counts of every point that has them (only
  // the newest are sent, so this overcounts, and a page may end early).
  size_t page_bytes = 0;
  // Store sequences start at 1, the wire's at 0: after S (wire) is from S + 2 (store).
  for (int64_t from = *after + 2;;) {
    absl::StatusOr<std::vector<EventRecord>> events =
        coordinator_->ReadEvents(job_id, from, kMetricsEventsPerRead);
    if (!events.ok()) return ErrorResponse(events.status());
    for (const EventRecord& event : *events) {
      if (static_cast<int64_t>(points.size()) >= *limit) {
        more = true;  // this event is read again by the next call
        break;
      }
      const int64_t sequence = event.sequence - 1;
      v1::StepMetrics metrics;
      // A payload that does not decode is left out (the gRPC watch shows it as text).
      if (event.kind == kStepMetricsEventKind && metrics.ParseFromString(event.payload)) {
        Json point = MetricsJson(metrics);
        point["sequence"] = sequence;
        point["time"] = TimeText(event.time);
        Json counts = ExpertTokensJson(sequence, metrics);
        const size_t bytes = JsonBytes(point) + (counts.is_null() ? 0 : JsonBytes(counts));
        // A page holds at least one point, so that every point can be read.
        if (!points.empty() && page_bytes + bytes > kMaxListPageBytes) {
          more = true;
          break;
        }
        page_bytes += bytes;
        points.push_back(std::move(point));
        if (!counts.is_null()) expert_tokens = std::move(counts);
      }
      next_after = sequence;
      from = event.sequence + 1;
    }
    if (more || static_cast<int>(events->size()) < kMetricsEventsPerRead) break;
  }
  return JsonResponse(200, {{"job_id", job_id},
                            {"points", std::move(points)},
                            {"next_after", next_after},
                            {"more", more},
                            {"expert_tokens", std::move(expert_tokens)}});
}

HttpResponse JsonApi::ListWorkers(const HttpRequest& request) {
  absl::StatusOr<PageQuery> page_query = PageQueryOf(request);
  if (!page_query.ok()) return ErrorResponse(page_query.status());
  absl::StatusOr<WorkerPage> page = fleet_->ListWorkers(
      {.page_size = page_query->page_size, .page_token = page_query->page_token});
  if (!page.ok()) return ErrorResponse(page.status());
  Json workers = Json::array();
  for (const v1::WorkerInfo& worker : page->workers) {
    absl::string_view state = v1::WorkerState_Name(worker.state());
    absl::ConsumePrefix(&state, "WORKER_STATE_");
    workers.push_back({{"id", worker.id()},
                       {"name", worker.name()},
                       {"state", std::string(state)},
                       {"device", v1::ResourceConfig::Device_Name(worker.device())},
                       {"device_count", worker.device_count()},
                       {"device_memory_bytes", worker.device_memory_bytes()},
                       {"threads", worker.threads()},
                       {"version", worker.version()},
                       {"last_heartbeat", TimeText(FromProtoTimestamp(worker.last_heartbeat()))},
                       {"current_job_id", worker.current_job_id()},
                       {"current_attempt", worker.current_attempt()}});
  }
  return JsonResponse(
      200, {{"workers", std::move(workers)}, {"next_page_token", page->next_page_token}});
}

}  // namespace moetrain::server
