#include "worker/reporter.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/log.h"
#include "moetrain/v1/backoff.h"

namespace moetrain {
namespace {

bool IsEnd(const Reporter::Report& report) {
  return std::holds_alternative<v1::ReportAttemptEndRequest>(report);
}

bool Retryable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

std::string Describe(const Reporter::Report& report) {
  return std::visit(
      [](const auto& request) {
        using T = std::decay_t<decltype(request)>;
        const char* kind = std::is_same_v<T, v1::ReportStepRequest>         ? "step report"
                           : std::is_same_v<T, v1::ReportLogRequest>        ? "log lines"
                           : std::is_same_v<T, v1::ReportCheckpointRequest> ? "checkpoint report"
                                                                            : "end report";
        return absl::StrCat(kind, " of attempt ", request.attempt(), " of job ", request.job_id());
      },
      report);
}

}  // namespace

const std::string& ReportJobId(const Reporter::Report& report) {
  return std::visit([](const auto& request) -> const std::string& { return request.job_id(); },
                    report);
}

int64_t ReportAttempt(const Reporter::Report& report) {
  return std::visit([](const auto& request) -> int64_t { return request.attempt(); }, report);
}

const std::string& ReportWorkerId(const Reporter::Report& report) {
  return std::visit([](const auto& request) -> const std::string& { return request.worker_id(); },
                    report);
}

Reporter::Reporter(const Connection* connection, ReporterOptions options)
    : connection_(connection),
      options_(std::move(options)),
      stub_(v1::WorkerService::NewStub(connection->channel)) {
  thread_ = std::thread([this] { SendLoop(); });
}

Reporter::~Reporter() { Stop(); }

void Reporter::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

void Reporter::Enqueue(Report report) {
  absl::MutexLock lock(&mu_);
  if (queue_.size() >= options_.max_queued) {
    // Keep the reports that matter for correctness; the front may be in flight.
    auto droppable =
        std::find_if(queue_.begin() + (sending_ ? 1 : 0), queue_.end(), [](const Report& queued) {
          return std::holds_alternative<v1::ReportStepRequest>(queued) ||
                 std::holds_alternative<v1::ReportLogRequest>(queued);
        });
    if (droppable != queue_.end()) {
      Log(absl::StrCat("report queue full (", queue_.size(), "): dropped the ",
                       Describe(*droppable)));
      queue_.erase(droppable);
    }
  }
  queue_.push_back(std::move(report));
  changed_.SignalAll();
}

void Reporter::SetWorkerSecret(const std::string& worker_id, const std::string& secret) {
  absl::MutexLock lock(&mu_);
  worker_id_ = worker_id;
  worker_secret_ = secret;
}

bool Reporter::Flush(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (!queue_.empty() && !stopping_) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return queue_.empty();
}

grpc::Status Reporter::Send(const Report& report) {
  // The credentials of the registration the report was made under.
  Connection credentials = *connection_;
  const std::string& worker_id = ReportWorkerId(report);
  if (credentials.worker_id != worker_id) {
    credentials.worker_id = worker_id;
    credentials.worker_secret.clear();
  }
  {
    absl::MutexLock lock(&mu_);
    if (worker_id == worker_id_) credentials.worker_secret = worker_secret_;
  }
  grpc::ClientContext context;
  credentials.Prepare(&context, options_.call_timeout);
  return std::visit(
      [&](const auto& request) -> grpc::Status {
        using T = std::decay_t<decltype(request)>;
        if constexpr (std::is_same_v<T, v1::ReportStepRequest>) {
          v1::ReportStepResponse response;
          return stub_->ReportStep(&context, request, &response);
        } else if constexpr (std::is_same_v<T, v1::ReportLogRequest>) {
          v1::ReportLogResponse response;
          return stub_->ReportLog(&context, request, &response);
        } else if constexpr (std::is_same_v<T, v1::ReportCheckpointRequest>) {
          v1::ReportCheckpointResponse response;
          return stub_->ReportCheckpoint(&context, request, &response);
        } else {
          v1::ReportAttemptEndResponse response;
          return stub_->ReportAttemptEnd(&context, request, &response);
        }
      },
      report);
}

void Reporter::DropQueued(const std::function<bool(const Report&)>& drop) {
  std::erase_if(queue_, drop);
}

void Reporter::SendLoop() {
  Backoff backoff({.initial = options_.initial_backoff, .max = options_.max_backoff});
  for (;;) {
    Report front;
    {
      absl::MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) changed_.Wait(&mu_);
      if (stopping_) return;
      front = queue_.front();
      sending_ = true;
    }
    const grpc::Status status = Send(front);
    const std::string job_id = ReportJobId(front), worker_id = ReportWorkerId(front);
    const int64_t attempt = ReportAttempt(front);
    // Told after the lock is released: the owner may enqueue from them.
    std::vector<std::pair<std::string, int64_t>> resolved;
    bool fenced = false, unknown_worker = false;
    {
      absl::MutexLock lock(&mu_);
      sending_ = false;
      if (Retryable(status.error_code())) {
        // The coordinator is away: wait (or stop), then try the same report again.
        changed_.WaitWithDeadline(&mu_, absl::Now() + backoff.Next());
        continue;
      }
      backoff.Reset();
      auto collect_ends = [&](auto&& matches) {
        for (const Report& queued : queue_) {
          if (matches(queued) && IsEnd(queued)) {
            resolved.emplace_back(ReportJobId(queued), ReportAttempt(queued));
          }
        }
        DropQueued(matches);
      };
      if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
        fenced = true;
        collect_ends([&](const Report& queued) {
          return ReportJobId(queued) == job_id && ReportAttempt(queued) == attempt;
        });
      } else if (status.error_code() == grpc::StatusCode::NOT_FOUND &&
                 status.error_message().find("worker") != std::string::npos) {
        unknown_worker = true;
        collect_ends([&](const Report& queued) { return ReportWorkerId(queued) == worker_id; });
      } else {
        // A step report the coordinator already has (a retry whose first answer was lost) has
        // been delivered: nothing to say.
        const bool repeat = status.error_code() == grpc::StatusCode::ALREADY_EXISTS &&
                            std::holds_alternative<v1::ReportStepRequest>(front);
        if (!status.ok() && !repeat) {
          Log(absl::StrCat("the coordinator refused the ", Describe(front), ": ",
                           status.error_message(), " (dropped)"));
        }
        if (IsEnd(front)) resolved.emplace_back(job_id, attempt);
        queue_.pop_front();
      }
      changed_.SignalAll();
    }
    if (fenced && options_.on_fenced) options_.on_fenced(job_id, attempt);
    if (unknown_worker && options_.on_worker_unknown) options_.on_worker_unknown(worker_id);
    if (options_.on_attempt_resolved) {
      for (const auto& [job, number] : resolved) options_.on_attempt_resolved(job, number);
    }
  }
}

}  // namespace moetrain
