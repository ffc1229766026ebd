// The coordinator's durable store: jobs and their state machine, attempts, per-job events,
// checkpoints and workers, in one SQLite file (WAL, synchronous=FULL: a call that returned OK
// survives kill -9 and power loss). Every write is atomic; writes that arrive together share one
// commit (group commit: one fsync for the batch, each write in a savepoint of its own), so
// concurrent callers do not queue behind each other's fsyncs. Thread-safe.
//
// Errors: NotFound (no such job/worker), InvalidArgument (a malformed id or argument),
// FailedPrecondition (the state is not what the call needs: stale `from`, illegal transition,
// attempt already ended), AlreadyExists (a submission id reused with another spec, or a deleted
// job's within kDeletedSubmissionRetention), Unavailable (the file stayed locked past the busy
// timeout: retry), DataLoss (the file is corrupt: the store never writes over it),
// FailedPrecondition too when the file or its directory is not writable, Internal (anything else
// SQLite reports).
#ifndef MOETRAIN_SERVER_CORE_STORE_H_
#define MOETRAIN_SERVER_CORE_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/core/job_state.h"

namespace moetrain::server {

namespace sqlite {
class Database;
}

// The first event of every job, appended by CreateJob in the job's own transaction; the payload is
// the reason text. It stands for the change from no state to PENDING.
inline constexpr char kSubmittedEventKind[] = "submitted";
// Appended by RecordStepMetrics; the payload is the caller's (a serialized
// moetrain.v1.StepMetrics).
inline constexpr char kStepMetricsEventKind[] = "step_metrics";

// How long a deleted job's submission id stays taken (DeleteJob keeps a tombstone of it): a
// client that retries a submit after a delete, within this time, gets AlreadyExists naming the
// deleted job rather than a second run of it.
inline constexpr absl::Duration kDeletedSubmissionRetention = absl::Hours(24);

// What the store needs from the world, so tests can pin time and force id collisions.
class StoreEnv {
 public:
  virtual ~StoreEnv() = default;
  virtual absl::Time Now() = 0;
  // A fresh job id candidate; the store validates it and retries on a collision.
  virtual std::string NewJobId() = 0;
};
// absl::Now() and RandomId("job-").
StoreEnv* DefaultStoreEnv();

// `prefix` and 12 random base-32 characters (a-z, 2-7) from std::random_device: 60 bits, valid in
// job ids, worker ids and paths.
std::string RandomId(absl::string_view prefix);

// Job ids name checkpoint folders: 1-64 characters of [a-z0-9-], starting with a letter or digit
// (so no '/', no "..", nothing a shell or a path would read specially).
absl::Status ValidateJobId(absl::string_view id);
// Worker ids are stored joined by ','; 1-128 printable ASCII characters, no ',' or space.
absl::Status ValidateWorkerId(absl::string_view id);

struct NewJob {
  // Client-chosen idempotency key; empty means none (every call creates a job).
  std::string submission_id;
  std::string name;
  std::string spec;  // serialized moetrain.v1.JobSpec, opaque here; serialize deterministically
  int32_t priority = 0;
};

struct JobRecord {
  std::string id;
  std::string submission_id;
  std::string name;
  std::string spec;
  std::string spec_sha256;  // lowercase hex of SHA-256(spec)
  int32_t priority = 0;
  JobState state = JobState::kPending;
  std::string state_reason;
  absl::Time created_at;
  absl::Time updated_at;
  int32_t attempt = 0;   // the latest attempt number, 0 before the first StartAttempt
  int32_t restarts = 0;  // transitions into RESTARTING that counted (TransitionOptions)
  std::optional<int64_t> latest_checkpoint_step;
  std::string last_step_metrics;  // payload of the newest RecordStepMetrics; empty before one
  int32_t last_step_attempt = 0;  // the attempt that reported it
  // Why a PENDING or RESTARTING job has not started (SetWaitingReasons); every transition clears
  // it.
  std::string waiting_reason;
  // RESTARTING after a failed attempt: its next attempt starts no earlier (the restart backoff).
  // Set by the transition into RESTARTING (TransitionOptions), cleared by every other one.
  std::optional<absl::Time> next_attempt_at;
};

struct ListJobsOptions {
  std::vector<JobState> states;  // only jobs in one of these states; empty = every state
  int page_size = 100;           // 1..1000; 0 means the default
  std::string page_token;        // empty for the first page
  // The page ends before the job that would take it past this many bytes (estimated from the
  // stored sizes; kMaxListPageBytes when 0), but always holds one job. Strings of rows stored
  // before the size limits are cut short in the listing (limits.h).
  size_t max_bytes = 0;
};

struct JobPage {
  std::vector<JobRecord> jobs;  // in creation order
  std::string next_page_token;  // empty on the last page
};

struct EventRecord {
  int64_t sequence = 0;  // per job, from 1, without gaps
  std::string kind;
  std::string payload;
  absl::Time time;
};

struct NewEvent {
  std::string job_id;
  std::string kind;
  std::string payload;
};

struct AttemptRecord {
  int32_t attempt = 0;
  std::vector<std::string> workers;  // by rank
  absl::Time started_at;
  std::optional<absl::Time> ended_at;
  std::string outcome;  // empty while the attempt runs
};

struct CheckpointRecord {
  int64_t step = 0;
  std::string path;
  int64_t tokens_seen = 0;
  absl::Time time;      // set by the store
  int32_t attempt = 0;  // the attempt that wrote it
};

struct TransitionOptions {
  // Whether entering RESTARTING counts against the job's restarts. Not for an attempt its worker
  // stopped in good order (SIGTERM) or one that a coordinator restart cut short.
  bool count_restart = true;
  // Becomes the job's next_attempt_at (unset = at once).
  std::optional<absl::Time> next_attempt_at;
};

struct WorkerRecord {
  std::string id;
  std::string name;
  std::string resources;  // opaque bytes (serialized proto)
  WorkerState state = WorkerState::kIdle;
  absl::Time last_heartbeat;  // set to the store's Now() by UpsertWorker
};

struct StoreOptions {
  StoreEnv* env = nullptr;  // DefaultStoreEnv() when null; not owned, must outlive the store
  // How long a write waits for another connection's lock before Unavailable.
  absl::Duration busy_timeout = absl::Seconds(5);
  // Run PRAGMA quick_check on open (reads the whole file once), so truncation is caught at
  // startup rather than by the first query that touches the missing pages.
  bool verify_on_open = true;
};

class Store {
 public:
  static constexpr int kSchemaVersion = 4;

  // Opens or creates the store at `path` and migrates its schema to kSchemaVersion.
  // DataLoss (naming the file) when the file is not a database or is damaged; the file is left
  // as it was. FailedPrecondition when it was written by a newer schema or is another program's,
  // or when this process cannot write it (a read-only file, directory or mount): one write
  // transaction at open tells, rather than the first real write.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path,
                                                     const StoreOptions& options = {});
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Creates a PENDING job and its kSubmittedEventKind event, atomically. A repeated non-empty
  // submission_id returns the existing job when its spec hash and priority match, and
  // AlreadyExists when they do not, or when it named a job deleted less than
  // kDeletedSubmissionRetention ago; nothing is written then.
  absl::StatusOr<JobRecord> CreateJob(const NewJob& job);
  // Whether a job was created with this non-empty submission_id (one deleted less than
  // kDeletedSubmissionRetention ago included).
  absl::StatusOr<bool> HasSubmission(absl::string_view submission_id);
  absl::StatusOr<JobRecord> GetJob(absl::string_view job_id);
  // In creation order, one page at a time.
  absl::StatusOr<JobPage> ListJobs(const ListJobsOptions& options);
  // Moves the job from `from` to `to` and appends a state-change event, atomically.
  // FailedPrecondition when the job is not in `from` or the transition is illegal; nothing
  // changes then. A reason over kMaxReasonBytes is cut and marked (limits.h). Returns the
  // updated job.
  absl::StatusOr<JobRecord> TransitionJob(absl::string_view job_id, JobState from, JobState to,
                                          absl::string_view reason,
                                          const TransitionOptions& options = {});
  // Records why jobs wait, (job id, reason) each, in one commit. Only jobs still PENDING or
  // RESTARTING take their reason (one that moved on meanwhile keeps the empty one its transition
  // left); unknown ids are skipped.
  absl::Status SetWaitingReasons(const std::vector<std::pair<std::string, std::string>>& reasons);
  // Removes a job in a final state (SUCCEEDED, FAILED, CANCELLED) with its events, attempts and
  // checkpoint records, atomically (store_delete.cc), keeping its submission id taken for
  // kDeletedSubmissionRetention. NotFound for an unknown job, FailedPrecondition naming the state
  // of one that is not final. Files are the caller's business.
  absl::Status DeleteJob(absl::string_view job_id);
  // Every state with its number of jobs (zeros included), for metrics.
  absl::StatusOr<std::map<JobState, int64_t>> CountJobsByState();

  // Returns the new event's sequence number.
  absl::StatusOr<int64_t> AppendEvent(absl::string_view job_id, absl::string_view kind,
                                      absl::string_view payload);
  // Appends every event in one transaction (each job's in the order given); NotFound, and nothing
  // appended, when one names no job.
  absl::Status AppendEvents(const std::vector<NewEvent>& events);
  // The job's newest event; nullopt when it has none.
  absl::StatusOr<std::optional<EventRecord>> LastEvent(absl::string_view job_id);
  // Appends a kStepMetricsEventKind event and makes `payload` (reported by `attempt`) the job's
  // last_step_metrics, atomically. Returns the event's sequence number.
  absl::StatusOr<int64_t> RecordStepMetrics(absl::string_view job_id, int32_t attempt,
                                            absl::string_view payload);
  // Up to `limit` (1..10000) events with sequence >= from_sequence, in order.
  absl::StatusOr<std::vector<EventRecord>> ReadEvents(absl::string_view job_id,
                                                      int64_t from_sequence, int limit);

  // Starts the job's next attempt on `workers` (by rank) and returns its number (1, 2, ...).
  // FailedPrecondition while the previous attempt has not ended.
  absl::StatusOr<int32_t> StartAttempt(absl::string_view job_id,
                                       const std::vector<std::string>& workers);
  // FailedPrecondition when the attempt already ended; outcome must not be empty.
  absl::Status EndAttempt(absl::string_view job_id, int32_t attempt, absl::string_view outcome);
  absl::StatusOr<std::vector<AttemptRecord>> ListAttempts(absl::string_view job_id);
  // Every attempt that has not ended, with its job id, in (job creation, attempt) order.
  absl::StatusOr<std::vector<std::pair<std::string, AttemptRecord>>> ListOpenAttempts();

  // Records (or, for a step already recorded, replaces) a checkpoint and raises the job's
  // latest_checkpoint_step. InvalidArgument for a path over kMaxPathBytes.
  absl::Status RecordCheckpoint(absl::string_view job_id, const CheckpointRecord& checkpoint);
  absl::StatusOr<std::vector<CheckpointRecord>> ListCheckpoints(absl::string_view job_id);
  // NotFound when the job has none.
  absl::StatusOr<CheckpointRecord> LatestCheckpoint(absl::string_view job_id);

  // Registers a worker or refreshes it (a heartbeat), stamping last_heartbeat.
  absl::Status UpsertWorker(const WorkerRecord& worker);
  absl::StatusOr<std::vector<WorkerRecord>> ListWorkers();
  absl::Status SetWorkerState(absl::string_view worker_id, WorkerState state);
  // NotFound when there is no such worker.
  absl::Status DeleteWorker(absl::string_view worker_id);

  const std::string& path() const { return path_; }

 private:
  Store(std::string path, StoreEnv* env, std::unique_ptr<sqlite::Database> db);

  // Pragmas, verification and schema migration, before the store is handed out.
  absl::Status Initialize(const StoreOptions& options) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // On `db`: the writer inside a write, the reader otherwise (its lock held).
  absl::StatusOr<JobRecord> ReadJob(sqlite::Database& db, absl::string_view job_id);
  absl::Status RequireJob(sqlite::Database& db, absl::string_view job_id);
  // AlreadyExists naming the deleted job while `submission_id` is a tombstone younger than
  // kDeletedSubmissionRetention; forgets the older tombstones first (store_delete.cc).
  absl::Status RefuseDeletedSubmission(absl::string_view submission_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> AppendEventLocked(absl::string_view job_id, absl::string_view kind,
                                            absl::string_view payload, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `body` (with mu_ held) as one atomic write, in a transaction shared with the writes
  // queued meanwhile; returns the body's status, or the commit's error.
  absl::Status Write(absl::FunctionRef<absl::Status()> body) ABSL_LOCKS_EXCLUDED(mu_, queue_mu_);
  // Runs `body` on the read-only connection, its lock held; returns what `body` returns.
  template <typename Body>
  auto Read(Body body) ABSL_LOCKS_EXCLUDED(read_mu_) {
    absl::MutexLock lock(&read_mu_);
    return body(*reader_);
  }

  const std::string path_;
  StoreEnv* const env_;
  // Held by the writer of a batch for the whole batch.
  absl::Mutex mu_;
  std::unique_ptr<sqlite::Database> db_ ABSL_GUARDED_BY(mu_);
  // A second, read-only connection: WAL lets it read the last commit while a batch commits, so
  // lookups never wait for a write's fsync.
  absl::Mutex read_mu_;
  std::unique_ptr<sqlite::Database> reader_ ABSL_GUARDED_BY(read_mu_);

  // Group commit: a writer queues its body; the first writer that finds no batch in flight
  // takes the whole queue, commits it, and wakes the others.
  struct PendingWrite;
  absl::Mutex queue_mu_;
  std::vector<PendingWrite*> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool batch_in_flight_ ABSL_GUARDED_BY(queue_mu_) = false;
  absl::CondVar batch_done_;
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_CORE_STORE_H_
