// Store operations: jobs and transitions, and their events. Attempts, checkpoints and workers
// live in store_attempts.cc, deletion in store_delete.cc, Open and the schema in store_schema.cc.
#include "server/core/store.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/core/sha256.h"
#include "engine/core/status.h"
#include "server/core/limits.h"
#include "server/core/sqlite.h"

namespace moetrain::server {
namespace {

constexpr int kMaxPageSize = 1000;
constexpr int kDefaultPageSize = 100;
constexpr int kMaxEventsPerRead = 10000;
constexpr int kJobIdTries = 8;
constexpr size_t kMaxSubmissionIdBytes = 1024;
// Job names are at most 128 characters (ValidateJobSpec); longer ones are older rows.
constexpr size_t kMaxListedNameBytes = 256;

constexpr char kJobColumns[] =
    "id, submission_id, name, spec, spec_sha256, priority, state, state_reason, created_us, "
    "updated_us, attempt, restarts, latest_checkpoint_step, created_seq, last_step_metrics, "
    "last_step_attempt, waiting_reason, next_attempt_us";

int64_t Micros(absl::Time time) { return absl::ToUnixMicros(time); }
absl::Time FromMicros(int64_t micros) { return absl::FromUnixMicros(micros); }

// A row of kJobColumns. An unreadable state means the file holds what no build wrote.
absl::StatusOr<JobRecord> JobFromRow(const sqlite::Statement& row, absl::string_view path) {
  JobRecord job;
  job.id = row.Text(0);
  job.submission_id = row.Text(1);
  job.name = row.Text(2);
  job.spec = row.Text(3);
  job.spec_sha256 = row.Text(4);
  job.priority = static_cast<int32_t>(row.Int(5));
  absl::StatusOr<JobState> state = ParseJobState(row.Text(6));
  if (!state.ok()) {
    return absl::DataLossError(
        absl::StrCat("store ", path, ": job ", job.id, ": ", state.status().message()));
  }
  job.state = *state;
  job.state_reason = row.Text(7);
  job.created_at = FromMicros(row.Int(8));
  job.updated_at = FromMicros(row.Int(9));
  job.attempt = static_cast<int32_t>(row.Int(10));
  job.restarts = static_cast<int32_t>(row.Int(11));
  job.latest_checkpoint_step = row.OptionalInt(12);
  job.last_step_metrics = row.Text(14);
  job.last_step_attempt = static_cast<int32_t>(row.Int(15));
  job.waiting_reason = row.Text(16);
  if (std::optional<int64_t> next = row.OptionalInt(17); next.has_value()) {
    job.next_attempt_at = FromMicros(*next);
  }
  return job;
}

// A job's share of a listing: its strings, and a generous allowance for the fixed fields and
// the encoding.
size_t ListedBytes(const JobRecord& job) {
  return 512 + job.id.size() + job.submission_id.size() + job.name.size() + job.spec.size() +
         job.state_reason.size() + job.last_step_metrics.size();
}

absl::Status NoSuchJob(absl::string_view job_id) {
  return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
}

}  // namespace

struct Store::PendingWrite {
  absl::FunctionRef<absl::Status()> body;
  absl::Status status;
  bool done = false;
};

absl::Status Store::Write(absl::FunctionRef<absl::Status()> body) {
  PendingWrite write{body, absl::OkStatus(), false};
  std::vector<PendingWrite*> batch;
  {
    absl::MutexLock lock(&queue_mu_);
    queue_.push_back(&write);
    // Either a batch carries this write, or nobody is committing and this caller leads.
    while (!write.done && batch_in_flight_) batch_done_.Wait(&queue_mu_);
    if (write.done) return write.status;
    batch.swap(queue_);
    batch_in_flight_ = true;
  }
  std::vector<absl::FunctionRef<absl::Status()>> bodies;
  bodies.reserve(batch.size());
  for (PendingWrite* pending : batch) bodies.push_back(pending->body);
  std::vector<absl::Status> results(batch.size());
  {
    absl::MutexLock lock(&mu_);
    db_->BatchTransaction(bodies, absl::MakeSpan(results));
  }
  absl::MutexLock lock(&queue_mu_);
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i]->status = std::move(results[i]);
    batch[i]->done = true;
  }
  batch_in_flight_ = false;
  batch_done_.SignalAll();
  return write.status;
}

absl::StatusOr<JobRecord> Store::ReadJob(sqlite::Database& db, absl::string_view job_id) {
  MOETRAIN_ASSIGN_OR_RETURN(
      sqlite::Statement stmt,
      db.Query(absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE id = ?"), job_id));
  MOETRAIN_ASSIGN_OR_RETURN(bool row, stmt.Step());
  if (!row) return NoSuchJob(job_id);
  return JobFromRow(stmt, path_);
}

absl::Status Store::RequireJob(sqlite::Database& db, absl::string_view job_id) {
  MOETRAIN_ASSIGN_OR_RETURN(sqlite::Statement stmt,
                            db.Query("SELECT 1 FROM jobs WHERE id = ?", job_id));
  MOETRAIN_ASSIGN_OR_RETURN(bool row, stmt.Step());
  return row ? absl::OkStatus() : NoSuchJob(job_id);
}

absl::StatusOr<JobRecord> Store::CreateJob(const NewJob& job) {
  if (job.submission_id.size() > kMaxSubmissionIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("submission_id is ", job.submission_id.size(),
                                                   " bytes, more than ", kMaxSubmissionIdBytes));
  }
  MOETRAIN_ASSIGN_OR_RETURN(const std::string spec_digest, Sha256Digest(job.spec));
  const std::string spec_sha256 = absl::BytesToHexString(spec_digest);
  JobRecord result;
  MOETRAIN_RETURN_IF_ERROR(Write([&]() -> absl::Status {
    if (!job.submission_id.empty()) {
      MOETRAIN_ASSIGN_OR_RETURN(
          sqlite::Statement existing,
          db_->Query("SELECT id, spec_sha256, priority FROM jobs WHERE submission_id = ?",
                     job.submission_id));
      MOETRAIN_ASSIGN_OR_RETURN(bool found, existing.Step());
      if (found) {
        std::string id = existing.Text(0);
        if (existing.Text(1) != spec_sha256) {
          return absl::AlreadyExistsError(absl::StrCat("submission_id '", job.submission_id,
                                                       "' already names job ", id,
                                                       ", with a different spec"));
        }
        if (existing.Int(2) != job.priority) {
          return absl::AlreadyExistsError(
              absl::StrCat("submission_id '", job.submission_id, "' already names job ", id,
                           ", with priority ", existing.Int(2), " (not ", job.priority, ")"));
        }
        MOETRAIN_ASSIGN_OR_RETURN(result, ReadJob(*db_, id));
        return absl::OkStatus();
      }
      MOETRAIN_RETURN_IF_ERROR(RefuseDeletedSubmission(job.submission_id));
    }
    std::string id;
    for (int attempt = 0; attempt < kJobIdTries && id.empty(); ++attempt) {
      std::string candidate = env_->NewJobId();
      if (absl::Status valid = ValidateJobId(candidate); !valid.ok()) {
        return absl::InternalError(absl::StrCat("store env: ", valid.message()));
      }
      absl::Status taken = RequireJob(*db_, candidate);
      if (absl::IsNotFound(taken)) {
        id = std::move(candidate);
      } else if (!taken.ok()) {
        return taken;
      }
    }
    if (id.empty()) {
      return absl::InternalError(
          absl::StrCat("no unused job id in ", kJobIdTries, " draws; is the id source random?"));
    }
    const int64_t now = Micros(env_->Now());
    std::optional<absl::string_view> submission_id;
    if (!job.submission_id.empty()) submission_id = job.submission_id;
    MOETRAIN_RETURN_IF_ERROR(db_->Execute(
        "INSERT INTO jobs (id, created_seq, submission_id, name, spec, spec_sha256, priority, "
        "state, state_reason, created_us, updated_us, attempt, restarts) VALUES (?1, "
        "(SELECT IFNULL(MAX(created_seq), 0) + 1 FROM jobs), ?2, ?3, ?4, ?5, ?6, ?7, '', ?8, ?8, "
        "0, 0)",
        id, submission_id, job.name, sqlite::Blob{job.spec}, spec_sha256, job.priority,
        JobStateName(JobState::kPending), now));
    MOETRAIN_RETURN_IF_ERROR(
        AppendEventLocked(id, kSubmittedEventKind, "submitted", FromMicros(now)).status());
    MOETRAIN_ASSIGN_OR_RETURN(result, ReadJob(*db_, id));
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<bool> Store::HasSubmission(absl::string_view submission_id) {
  if (submission_id.empty() || submission_id.size() > kMaxSubmissionIdBytes) return false;
  return Read([&](sqlite::Database& db) -> absl::StatusOr<bool> {
    MOETRAIN_ASSIGN_OR_RETURN(
        sqlite::Statement existing,
        db.Query("SELECT id FROM jobs WHERE submission_id = ?1 UNION ALL SELECT job_id FROM "
                 "deleted_submissions WHERE submission_id = ?1 AND deleted_us >= ?2",
                 std::string(submission_id), Micros(env_->Now() - kDeletedSubmissionRetention)));
    return existing.Step();
  });
}

absl::StatusOr<JobRecord> Store::GetJob(absl::string_view job_id) {
  MOETRAIN_RETURN_IF_ERROR(ValidateJobId(job_id));
  return Read([&](sqlite::Database& db) { return ReadJob(db, job_id); });
}

absl::StatusOr<JobPage> Store::ListJobs(const ListJobsOptions& options) {
  int page_size = options.page_size == 0 ? kDefaultPageSize : options.page_size;
  const size_t max_bytes = options.max_bytes == 0 ? kMaxListPageBytes : options.max_bytes;
  if (page_size < 1 || page_size > kMaxPageSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size = ", options.page_size, " is outside 0..", kMaxPageSize));
  }
  // The token is the created_seq of the last job on the previous page.
  int64_t after = 0;
  if (!options.page_token.empty() && (!absl::SimpleAtoi(options.page_token, &after) || after < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token '", options.page_token, "' is not one ListJobs returned"));
  }
  // State names are fixed identifiers (JobStateName), so they are spelled into the SQL; the
  // jobs_by_state index serves one state or several.
  std::string filter;
  for (JobState state : options.states) {
    absl::StrAppend(&filter, filter.empty() ? " AND state IN ('" : ", '", JobStateName(state), "'");
  }
  if (!filter.empty()) filter += ")";
  return Read([&](sqlite::Database& db) -> absl::StatusOr<JobPage> {
    MOETRAIN_ASSIGN_OR_RETURN(
        sqlite::Statement stmt,
        db.Query(absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE created_seq > ?1", filter,
                              " ORDER BY created_seq LIMIT ?2"),
                 after, page_size + 1));
    JobPage page;
    int64_t last_seq = 0;
    size_t page_bytes = 0;
    // Step() rather than ForEachRow: the page may fill before the rows run out.
    for (;;) {
      MOETRAIN_ASSIGN_OR_RETURN(bool row, stmt.Step());
      if (!row) break;
      if (static_cast<int>(page.jobs.size()) == page_size) {
        page.next_page_token = absl::StrCat(last_seq);
        break;
      }
      MOETRAIN_ASSIGN_OR_RETURN(JobRecord job, JobFromRow(stmt, path_));
      // Rows stored before the caps may hold longer strings than any write now can.
      job.state_reason = TruncateWithMarker(job.state_reason, kMaxReasonBytes);
      job.name = TruncateWithMarker(job.name, kMaxListedNameBytes);
      // A page holds at least one job, so that every job can be listed.
      const size_t bytes = ListedBytes(job);
      if (!page.jobs.empty() && page_bytes + bytes > max_bytes) {
        page.next_page_token = absl::StrCat(last_seq);
        break;
      }
      page_bytes += bytes;
      page.jobs.push_back(std::move(job));
      last_seq = stmt.Int(13);
    }
    return page;
  });
}

absl::StatusOr<JobRecord> Store::TransitionJob(absl::string_view job_id, JobState from, JobState to,
                                               absl::string_view reason,
                                               const TransitionOptions& options) {
  MOETRAIN_RETURN_IF_ERROR(ValidateJobId(job_id));
  if (!IsLegalTransition(from, to)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, ": ", JobStateName(from),
                                                      " -> ", JobStateName(to),
                                                      " is not a legal transition"));
  }
  // A failure message that a worker reported once is kept, cut short, rather than refused.
  const std::string bounded_reason = TruncateWithMarker(reason, kMaxReasonBytes);
  JobRecord result;
  MOETRAIN_RETURN_IF_ERROR(Write([&]() -> absl::Status {
    MOETRAIN_ASSIGN_OR_RETURN(JobRecord current, ReadJob(*db_, job_id));
    if (current.state != from) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id, " is ", JobStateName(current.state), ", not ", JobStateName(from)));
    }
    const absl::Time now = env_->Now();
    std::optional<int64_t> next_attempt_us;
    if (options.next_attempt_at.has_value()) next_attempt_us = Micros(*options.next_attempt_at);
    MOETRAIN_RETURN_IF_ERROR(db_->Execute(
        "UPDATE jobs SET state = ?1, state_reason = ?2, updated_us = ?3, restarts = restarts + ?4, "
        "waiting_reason = '', next_attempt_us = ?6 WHERE id = ?5",
        JobStateName(to), bounded_reason, Micros(now),
        to == JobState::kRestarting && options.count_restart ? 1 : 0, job_id, next_attempt_us));
    MOETRAIN_RETURN_IF_ERROR(AppendEventLocked(job_id, kStateChangeEventKind,
                                               EncodeStateChange({from, to, bounded_reason}), now)
                                 .status());
    MOETRAIN_ASSIGN_OR_RETURN(result, ReadJob(*db_, job_id));
    return absl::OkStatus();
  }));
  return result;
}

absl::Status Store::SetWaitingReasons(
    const std::vector<std::pair<std::string, std::string>>& reasons) {
  if (reasons.empty()) return absl::OkStatus();
  return Write([&]() -> absl::Status {
    const int64_t now = Micros(env_->Now());
    for (const auto& [job_id, reason] : reasons) {
      MOETRAIN_RETURN_IF_ERROR(
          db_->Execute("UPDATE jobs SET waiting_reason = ?1, updated_us = ?2 WHERE id = ?3 AND "
                       "state IN ('PENDING', 'RESTARTING') AND waiting_reason != ?1",
                       reason, now, job_id));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::map<JobState, int64_t>> Store::CountJobsByState() {
  std::map<JobState, int64_t> counts;
  for (JobState state : kAllJobStates) counts[state] = 0;
  MOETRAIN_RETURN_IF_ERROR(Read([&](sqlite::Database& db) -> absl::Status {
    MOETRAIN_ASSIGN_OR_RETURN(sqlite::Statement stmt,
                              db.Prepare("SELECT state, count(*) FROM jobs GROUP BY state"));
    return stmt.ForEachRow([&](const sqlite::Statement& row) -> absl::Status {
      absl::StatusOr<JobState> state = ParseJobState(row.Text(0));
      if (!state.ok()) {
        return absl::DataLossError(absl::StrCat("store ", path_, ": ", state.status().message()));
      }
      counts[*state] = row.Int(1);
      return absl::OkStatus();
    });
  }));
  return counts;
}

absl::StatusOr<int64_t> Store::AppendEventLocked(absl::string_view job_id, absl::string_view kind,
                                                 absl::string_view payload, absl::Time now) {
  // MAX + 1 inside the write transaction: sequences stay gapless whatever the concurrency.
  MOETRAIN_ASSIGN_OR_RETURN(
      sqlite::Statement stmt,
      db_->Query("INSERT INTO events (job_id, sequence, kind, payload, time_us) "
                 "SELECT ?1, IFNULL(MAX(sequence), 0) + 1, ?2, ?3, ?4 FROM events "
                 "WHERE job_id = ?1 RETURNING sequence",
                 job_id, kind, sqlite::Blob{payload}, Micros(now)));
  MOETRAIN_ASSIGN_OR_RETURN(bool row, stmt.Step());
  if (!row) return absl::InternalError(absl::StrCat("store ", path_, ": no event sequence"));
  int64_t sequence = stmt.Int(0);
  MOETRAIN_RETURN_IF_ERROR(stmt.Run());
  return sequence;
}

absl::StatusOr<int64_t> Store::AppendEvent(absl::string_view job_id, absl::string_view kind,
                                           absl::string_view payload) {
  MOETRAIN_RETURN_IF_ERROR(ValidateJobId(job_id));
  if (kind.empty()) return absl::InvalidArgumentError("event kind is empty");
  int64_t sequence = 0;
  MOETRAIN_RETURN_IF_ERROR(Write([&]() -> absl::Status {
    MOETRAIN_RETURN_IF_ERROR(RequireJob(*db_, job_id));
    MOETRAIN_ASSIGN_OR_RETURN(sequence, AppendEventLocked(job_id, kind, payload, env_->Now()));
    return absl::OkStatus();
  }));
  return sequence;
}

absl::Status Store::AppendEvents(const std::vector<NewEvent>& events) {
  for (const NewEvent& event : events) {
    MOETRAIN_RETURN_IF_ERROR(ValidateJobId(event.job_id));
    if (event.kind.empty()) return absl::InvalidArgumentError("event kind is empty");
  }
  return Write([&]() -> absl::Status {
    const absl::Time now = env_->Now();
    for (const NewEvent& event : events) {
      MOETRAIN_RETURN_IF_ERROR(RequireJob(*db_, event.job_id));
      MOETRAIN_RETURN_IF_ERROR(
          AppendEventLocked(event.job_id, event.kind, event.payload, now).status());
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::optional<EventRecord>> Store::LastEvent(absl::string_view job_id) {
  MOETRAIN_RETURN_IF_ERROR(ValidateJobId(job_id));
  return Read([&](sqlite::Database& db) -> absl::StatusOr<std::optional<EventRecord>> {
    MOETRAIN_RETURN_IF_ERROR(RequireJob(db, job_id));
    MOETRAIN_ASSIGN_OR_RETURN(
        sqlite::Statement stmt,
        db.Query("SELECT sequence, kind, payload, time_us FROM events WHERE job_id = ?1 "
                 "ORDER BY sequence DESC LIMIT 1",
                 job_id));
    MOETRAIN_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) return std::optional<EventRecord>();
    return std::optional<EventRecord>(
        EventRecord{stmt.Int(0), stmt.Text(1), stmt.Text(2), FromMicros(stmt.Int(3))});
  });
}

absl::StatusOr<int64_t> Store::RecordStepMetrics(absl::string_view job_id, int32_t attempt,
                                                 absl::string_view payload) {
  MOETRAIN_RETURN_IF_ERROR(ValidateJobId(job_id));
  int64_t sequence = 0;
  MOETRAIN_RETURN_IF_ERROR(Write([&]() -> absl::Status {
    MOETRAIN_RETURN_IF_ERROR(RequireJob(*db_, job_id));
    const absl::Time now = env_->Now();
    MOETRAIN_ASSIGN_OR_RETURN(sequence,
                              AppendEventLocked(job_id, kStepMetricsEventKind, payload, now));
    return db_->Execute(
        "UPDATE jobs SET last_step_metrics = ?1, last_step_attempt = ?2, updated_us = ?3 "
        "WHERE id = ?4",
        sqlite::Blob{payload}, attempt, Micros(now), job_id);
  }));
  return sequence;
}

absl::StatusOr<std::vector<EventRecord>> Store::ReadEvents(absl::string_view job_id,
                                                           int64_t from_sequence, int limit) {
  MOETRAIN_RETURN_IF_ERROR(ValidateJobId(job_id));
  if (from_sequence < 0 || limit < 1 || limit > kMaxEventsPerRead) {
    return absl::InvalidArgumentError(absl::StrCat("from_sequence = ", from_sequence,
                                                   " must be >= 0 and limit = ", limit,
                                                   " within 1..", kMaxEventsPerRead));
  }
  std::vector<EventRecord> events;
  MOETRAIN_RETURN_IF_ERROR(Read([&](sqlite::Database& db) -> absl::Status {
    MOETRAIN_RETURN_IF_ERROR(RequireJob(db, job_id));
    MOETRAIN_ASSIGN_OR_RETURN(
        sqlite::Statement stmt,
        db.Query("SELECT sequence, kind, payload, time_us FROM events WHERE job_id = ?1 AND "
                 "sequence >= ?2 ORDER BY sequence LIMIT ?3",
                 job_id, from_sequence, limit));
    return stmt.ForEachRow([&](const sqlite::Statement& row) {
      events.push_back({row.Int(0), row.Text(1), row.Text(2), FromMicros(row.Int(3))});
      return absl::OkStatus();
    });
  }));
  return events;
}

}  // namespace moetrain::server
