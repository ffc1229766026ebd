// Store operations on what the fleet records: a job's attempts, its checkpoints, and the
// workers.
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/core/status.h"
#include "server/core/limits.h"
#include "server/core/sqlite.h"
#include "server/core/store.h"

namespace moetrain::server {
namespace {

int64_t Micros(absl::Time time) { return absl::ToUnixMicros(time); }
absl::Time FromMicros(int64_t micros) { return absl::FromUnixMicros(micros); }

}  // namespace

absl::StatusOr<int32_t> Store::StartAttempt(absl::string_view job_id,
                                            const std::vector<std::string>& workers) {
  MOETRAIN_RETURN_IF_ERROR(ValidateJobId(job_id));
  if (workers.empty()) return absl::InvalidArgumentError("an attempt needs at least one worker");
  for (const std::string& worker : workers) MOETRAIN_RETURN_IF_ERROR(ValidateWorkerId(worker));
  int32_t attempt = 0;
  MOETRAIN_RETURN_IF_ERROR(Write([&]() -> absl::Status {
    MOETRAIN_ASSIGN_OR_RETURN(JobRecord job, ReadJob(*db_, job_id));
    MOETRAIN_ASSIGN_OR_RETURN(
        sqlite::Statement open,
        db_->Query("SELECT attempt FROM attempts WHERE job_id = ? AND ended_us IS NULL", job_id));
    MOETRAIN_ASSIGN_OR_RETURN(bool running, open.Step());
    if (running) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, ": attempt ", open.Int(0), " has not ended"));
    }
    attempt = job.attempt + 1;
    const int64_t now = Micros(env_->Now());
    MOETRAIN_RETURN_IF_ERROR(db_->Execute(
        "INSERT INTO attempts (job_id, attempt, workers, started_us) VALUES (?, ?, ?, ?)", job_id,
        attempt, absl::StrJoin(workers, ","), now));
    return db_->Execute("UPDATE jobs SET attempt = ?, updated_us = ? WHERE id = ?", attempt, now,
                        job_id);
  }));
  return attempt;
}

absl::Status Store::EndAttempt(absl::string_view job_id, int32_t attempt,
                               absl::string_view outcome) {
  MOETRAIN_RETURN_IF_ERROR(ValidateJobId(job_id));
  if (outcome.empty()) return absl::InvalidArgumentError("attempt outcome is empty");
  return Write([&]() -> absl::Status {
    MOETRAIN_RETURN_IF_ERROR(RequireJob(*db_, job_id));
    MOETRAIN_ASSIGN_OR_RETURN(
        sqlite::Statement stmt,
        db_->Query("SELECT ended_us FROM attempts WHERE job_id = ? AND attempt = ?", job_id,
                   attempt));
    MOETRAIN_ASSIGN_OR_RETURN(bool found, stmt.Step());
    if (!found) {
      return absl::NotFoundError(absl::StrCat("job ", job_id, " has no attempt ", attempt));
    }
    if (!stmt.IsNull(0)) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, ": attempt ", attempt, " already ended"));
    }
    return db_->Execute(
        "UPDATE attempts SET ended_us = ?, outcome = ? WHERE job_id = ? AND attempt = ?",
        Micros(env_->Now()), outcome, job_id, attempt);
  });
}

absl::StatusOr<std::vector<AttemptRecord>> Store::ListAttempts(absl::string_view job_id) {
  MOETRAIN_RETURN_IF_ERROR(ValidateJobId(job_id));
  std::vector<AttemptRecord> attempts;
  MOETRAIN_RETURN_IF_ERROR(Read([&](sqlite::Database& db) -> absl::Status {
    MOETRAIN_RETURN_IF_ERROR(RequireJob(db, job_id));
    MOETRAIN_ASSIGN_OR_RETURN(
        sqlite::Statement stmt,
        db.Query("SELECT attempt, workers, started_us, ended_us, outcome FROM attempts "
                 "WHERE job_id = ? ORDER BY attempt",
                 job_id));
    return stmt.ForEachRow([&](const sqlite::Statement& row) {
      AttemptRecord& attempt = attempts.emplace_back();
      attempt.attempt = static_cast<int32_t>(row.Int(0));
      attempt.workers = absl::StrSplit(row.Text(1), ',', absl::SkipEmpty());
      attempt.started_at = FromMicros(row.Int(2));
      if (!row.IsNull(3)) attempt.ended_at = FromMicros(row.Int(3));
      attempt.outcome = row.Text(4);
      return absl::OkStatus();
    });
  }));
  return attempts;
}

absl::StatusOr<std::vector<std::pair<std::string, AttemptRecord>>> Store::ListOpenAttempts() {
  std::vector<std::pair<std::string, AttemptRecord>> open;
  MOETRAIN_RETURN_IF_ERROR(Read([&](sqlite::Database& db) -> absl::Status {
    MOETRAIN_ASSIGN_OR_RETURN(
        sqlite::Statement stmt,
        db.Prepare("SELECT a.job_id, a.attempt, a.workers, a.started_us FROM attempts a "
                   "JOIN jobs j ON j.id = a.job_id WHERE a.ended_us IS NULL "
                   "ORDER BY j.created_seq, a.attempt"));
    return stmt.ForEachRow([&](const sqlite::Statement& row) {
      AttemptRecord attempt;
      attempt.attempt = static_cast<int32_t>(row.Int(1));
      attempt.workers = absl::StrSplit(row.Text(2), ',', absl::SkipEmpty());
      attempt.started_at = FromMicros(row.Int(3));
      open.emplace_back(row.Text(0), std::move(attempt));
      return absl::OkStatus();
    });
  }));
  return open;
}

absl::Status Store::RecordCheckpoint(absl::string_view job_id, const CheckpointRecord& checkpoint) {
  MOETRAIN_RETURN_IF_ERROR(ValidateJobId(job_id));
  if (checkpoint.path.size() > kMaxPathBytes) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint path has ", checkpoint.path.size(),
                                                   " bytes, more than ", kMaxPathBytes));
  }
  if (checkpoint.step < 0 || checkpoint.tokens_seen < 0 || checkpoint.path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint step = ", checkpoint.step, ", tokens_seen = ", checkpoint.tokens_seen,
        ", path = '", checkpoint.path, "': need step, tokens_seen >= 0 and a path"));
  }
  return Write([&]() -> absl::Status {
    MOETRAIN_RETURN_IF_ERROR(RequireJob(*db_, job_id));
    const int64_t now = Micros(env_->Now());
    MOETRAIN_RETURN_IF_ERROR(db_->Execute(
        "INSERT INTO checkpoints (job_id, step, path, tokens_seen, time_us, attempt) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (job_id, step) DO UPDATE SET "
        "path = excluded.path, tokens_seen = excluded.tokens_seen, time_us = excluded.time_us, "
        "attempt = excluded.attempt",
        job_id, checkpoint.step, checkpoint.path, checkpoint.tokens_seen, now, checkpoint.attempt));
    return db_->Execute(
        "UPDATE jobs SET latest_checkpoint_step = MAX(IFNULL(latest_checkpoint_step, -1), ?1), "
        "updated_us = ?2 WHERE id = ?3",
        checkpoint.step, now, job_id);
  });
}

absl::StatusOr<std::vector<CheckpointRecord>> Store::ListCheckpoints(absl::string_view job_id) {
  MOETRAIN_RETURN_IF_ERROR(ValidateJobId(job_id));
  std::vector<CheckpointRecord> checkpoints;
  MOETRAIN_RETURN_IF_ERROR(Read([&](sqlite::Database& db) -> absl::Status {
    MOETRAIN_RETURN_IF_ERROR(RequireJob(db, job_id));
    MOETRAIN_ASSIGN_OR_RETURN(
        sqlite::Statement stmt,
        db.Query("SELECT step, path, tokens_seen, time_us, attempt FROM checkpoints "
                 "WHERE job_id = ? ORDER BY step",
                 job_id));
    return stmt.ForEachRow([&](const sqlite::Statement& row) {
      checkpoints.push_back({row.Int(0), row.Text(1), row.Int(2), FromMicros(row.Int(3)),
                             static_cast<int32_t>(row.Int(4))});
      return absl::OkStatus();
    });
  }));
  return checkpoints;
}

absl::StatusOr<CheckpointRecord> Store::LatestCheckpoint(absl::string_view job_id) {
  MOETRAIN_ASSIGN_OR_RETURN(std::vector<CheckpointRecord> all, ListCheckpoints(job_id));
  if (all.empty()) return absl::NotFoundError(absl::StrCat("job ", job_id, " has no checkpoint"));
  return all.back();
}

absl::Status Store::UpsertWorker(const WorkerRecord& worker) {
  MOETRAIN_RETURN_IF_ERROR(ValidateWorkerId(worker.id));
  return Write([&]() -> absl::Status {
    return db_->Execute(
        "INSERT INTO workers (id, name, resources, state, last_heartbeat_us) "
        "VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (id) DO UPDATE SET name = excluded.name, "
        "resources = excluded.resources, state = excluded.state, "
        "last_heartbeat_us = excluded.last_heartbeat_us",
        worker.id, worker.name, sqlite::Blob{worker.resources}, WorkerStateName(worker.state),
        Micros(env_->Now()));
  });
}

absl::StatusOr<std::vector<WorkerRecord>> Store::ListWorkers() {
  std::vector<WorkerRecord> workers;
  MOETRAIN_RETURN_IF_ERROR(Read([&](sqlite::Database& db) -> absl::Status {
    MOETRAIN_ASSIGN_OR_RETURN(
        sqlite::Statement stmt,
        db.Prepare(
            "SELECT id, name, resources, state, last_heartbeat_us FROM workers ORDER BY id"));
    return stmt.ForEachRow([&](const sqlite::Statement& row) -> absl::Status {
      WorkerRecord& worker = workers.emplace_back();
      worker.id = row.Text(0);
      worker.name = row.Text(1);
      worker.resources = row.Text(2);
      absl::StatusOr<WorkerState> state = ParseWorkerState(row.Text(3));
      if (!state.ok()) {
        return absl::DataLossError(
            absl::StrCat("store ", path_, ": worker ", worker.id, ": ", state.status().message()));
      }
      worker.state = *state;
      worker.last_heartbeat = FromMicros(row.Int(4));
      return absl::OkStatus();
    });
  }));
  return workers;
}

absl::Status Store::SetWorkerState(absl::string_view worker_id, WorkerState state) {
  MOETRAIN_RETURN_IF_ERROR(ValidateWorkerId(worker_id));
  return Write([&]() -> absl::Status {
    MOETRAIN_RETURN_IF_ERROR(db_->Execute("UPDATE workers SET state = ? WHERE id = ?",
                                          WorkerStateName(state), worker_id));
    if (db_->Changes() == 0) {
      return absl::NotFoundError(absl::StrCat("worker ", worker_id, " not found"));
    }
    return absl::OkStatus();
  });
}

absl::Status Store::DeleteWorker(absl::string_view worker_id) {
  MOETRAIN_RETURN_IF_ERROR(ValidateWorkerId(worker_id));
  return Write([&]() -> absl::Status {
    MOETRAIN_RETURN_IF_ERROR(db_->Execute("DELETE FROM workers WHERE id = ?", worker_id));
    if (db_->Changes() == 0) {
      return absl::NotFoundError(absl::StrCat("worker ", worker_id, " not found"));
    }
    return absl::OkStatus();
  });
}

}  // namespace moetrain::server
