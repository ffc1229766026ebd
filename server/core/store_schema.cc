// Store::Open: the connection's pragmas, the check that the file is a sound database, and the
// schema migrations. Also the default environment and the id rules.
#include <array>
#include <random>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/core/status.h"
#include "server/core/sqlite.h"
#include "server/core/store.h"

namespace moetrain::server {
namespace {

// kMigrations[v] takes a store from schema version v to v + 1. Append, never edit: a released
// migration has already run on somebody's file.
constexpr std::array<const char*, Store::kSchemaVersion> kMigrations = {
    // 0 → 1: the first schema. Times are microseconds since the Unix epoch. created_seq gives
    // ListJobs a stable creation order that a clock step or a VACUUM cannot reorder.
    R"sql(
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE jobs (
  id TEXT PRIMARY KEY,
  created_seq INTEGER NOT NULL UNIQUE,
  submission_id TEXT UNIQUE,
  name TEXT NOT NULL,
  spec BLOB NOT NULL,
  spec_sha256 TEXT NOT NULL,
  priority INTEGER NOT NULL,
  state TEXT NOT NULL,
  state_reason TEXT NOT NULL,
  created_us INTEGER NOT NULL,
  updated_us INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  restarts INTEGER NOT NULL,
  latest_checkpoint_step INTEGER
);
CREATE INDEX jobs_by_state ON jobs (state, created_seq);
CREATE TABLE attempts (
  job_id TEXT NOT NULL REFERENCES jobs (id),
  attempt INTEGER NOT NULL,
  workers TEXT NOT NULL,
  started_us INTEGER NOT NULL,
  ended_us INTEGER,
  outcome TEXT,
  PRIMARY KEY (job_id, attempt)
) WITHOUT ROWID;
CREATE TABLE events (
  job_id TEXT NOT NULL REFERENCES jobs (id),
  sequence INTEGER NOT NULL,
  kind TEXT NOT NULL,
  payload BLOB NOT NULL,
  time_us INTEGER NOT NULL,
  PRIMARY KEY (job_id, sequence)
) WITHOUT ROWID;
CREATE TABLE checkpoints (
  job_id TEXT NOT NULL REFERENCES jobs (id),
  step INTEGER NOT NULL,
  path TEXT NOT NULL,
  tokens_seen INTEGER NOT NULL,
  time_us INTEGER NOT NULL,
  PRIMARY KEY (job_id, step)
) WITHOUT ROWID;
CREATE TABLE workers (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  resources BLOB NOT NULL,
  state TEXT NOT NULL,
  last_heartbeat_us INTEGER NOT NULL
);
)sql",
    // 1 → 2: the newest step report on the job row, with the attempt that sent it (so listings
    // need no event scan, and a restarted coordinator knows which reports are repeats), and the
    // attempt that wrote each checkpoint.
    R"sql(
ALTER TABLE jobs ADD COLUMN last_step_metrics BLOB NOT NULL DEFAULT x'';
ALTER TABLE jobs ADD COLUMN last_step_attempt INTEGER NOT NULL DEFAULT 0;
ALTER TABLE checkpoints ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0;
)sql",
    // 2 → 3: why a waiting job has not started (the scheduler's reason, or its restart backoff),
    // and when a job RESTARTING after a failed attempt may start its next one (the backoff, kept
    // across coordinator restarts). NULL = at once.
    R"sql(
ALTER TABLE jobs ADD COLUMN waiting_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN next_attempt_us INTEGER;
)sql",
    // 3 → 4: the submission ids of deleted jobs, kept for kDeletedSubmissionRetention so that
    // a retried submit cannot create the job a second time.
    R"sql(
CREATE TABLE deleted_submissions (
  submission_id TEXT PRIMARY KEY,
  job_id TEXT NOT NULL,
  deleted_us INTEGER NOT NULL
) WITHOUT ROWID;
)sql",
};

class DefaultEnv : public StoreEnv {
 public:
  absl::Time Now() override { return absl::Now(); }
  std::string NewJobId() override { return RandomId("job-"); }
};

// One query that returns one integer.
absl::StatusOr<int64_t> QueryInt(sqlite::Database& db, absl::string_view sql) {
  MOETRAIN_ASSIGN_OR_RETURN(sqlite::Statement stmt, db.Prepare(sql));
  MOETRAIN_ASSIGN_OR_RETURN(bool row, stmt.Step());
  if (!row) return absl::InternalError(absl::StrCat("store ", db.path(), ": no row from ", sql));
  return stmt.Int(0);
}

// 0 for a fresh file. A file with tables but no schema_version belongs to something else.
absl::StatusOr<int64_t> ReadSchemaVersion(sqlite::Database& db) {
  MOETRAIN_ASSIGN_OR_RETURN(
      int64_t has_table,
      QueryInt(db, "SELECT count(*) FROM sqlite_master WHERE name = 'schema_version'"));
  if (has_table == 0) {
    MOETRAIN_ASSIGN_OR_RETURN(int64_t objects, QueryInt(db, "SELECT count(*) FROM sqlite_master"));
    if (objects != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("store ", db.path(), ": has ", objects,
                       " schema objects but no schema_version table; not a moetrain store"));
    }
    return 0;
  }
  MOETRAIN_ASSIGN_OR_RETURN(int64_t rows, QueryInt(db, "SELECT count(*) FROM schema_version"));
  if (rows != 1) {
    return absl::DataLossError(
        absl::StrCat("store ", db.path(), ": schema_version has ", rows, " rows, expected 1"));
  }
  return QueryInt(db, "SELECT version FROM schema_version");
}

absl::Status CheckIntegrity(sqlite::Database& db) {
  MOETRAIN_ASSIGN_OR_RETURN(sqlite::Statement stmt, db.Prepare("PRAGMA quick_check(10)"));
  std::vector<std::string> problems;
  MOETRAIN_RETURN_IF_ERROR(stmt.ForEachRow([&](const sqlite::Statement& row) {
    std::string line = row.Text(0);
    if (line != "ok") problems.push_back(std::move(line));
    return absl::OkStatus();
  }));
  if (problems.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "store ", db.path(), ": integrity check failed: ", absl::StrJoin(problems, "; ")));
}

absl::Status Migrate(sqlite::Database& db) {
  MOETRAIN_ASSIGN_OR_RETURN(int64_t version, ReadSchemaVersion(db));
  if (version == Store::kSchemaVersion) return absl::OkStatus();
  return db.Transaction([&]() -> absl::Status {
    // Read again under the write lock: another process may have migrated meanwhile.
    MOETRAIN_ASSIGN_OR_RETURN(version, ReadSchemaVersion(db));
    if (version > Store::kSchemaVersion) {
      return absl::FailedPreconditionError(absl::StrCat("store ", db.path(), ": schema version ",
                                                        version, " is newer than this build's ",
                                                        Store::kSchemaVersion));
    }
    for (int64_t v = version; v < Store::kSchemaVersion; ++v) {
      MOETRAIN_RETURN_IF_ERROR(db.Exec(kMigrations[v]));
    }
    MOETRAIN_RETURN_IF_ERROR(db.Exec("DELETE FROM schema_version"));
    return db.Execute("INSERT INTO schema_version (version) VALUES (?)",
                      int64_t{Store::kSchemaVersion});
  });
}

// A file this process may read but not write (a read-only file, directory or mount) opens and
// reads fine, and would then fail every write: one real write transaction at open tells.
absl::Status CheckWritable(sqlite::Database& db) {
  absl::Status written =
      db.Transaction([&] { return db.Exec("UPDATE schema_version SET version = version"); });
  if (written.ok() || written.code() != absl::StatusCode::kFailedPrecondition) return written;
  return absl::FailedPreconditionError(
      absl::StrCat("store ", db.path(), " is not writable: ", written.message()));
}

}  // namespace

std::string RandomId(absl::string_view prefix) {
  static constexpr char kBase32[] = "abcdefghijklmnopqrstuvwxyz234567";
  thread_local std::random_device random;
  uint64_t bits = (static_cast<uint64_t>(random()) << 32) | random();
  std::string id(prefix);
  for (int i = 0; i < 12; ++i, bits >>= 5) id.push_back(kBase32[bits & 31]);
  return id;
}

StoreEnv* DefaultStoreEnv() {
  static DefaultEnv* env = new DefaultEnv();
  return env;
}

absl::Status ValidateJobId(absl::string_view id) {
  bool ok = !id.empty() && id.size() <= 64 && id.front() != '-';
  for (char c : id) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-');
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("job id '", id, "' must be 1-64 characters of [a-z0-9-] not starting with '-'"));
}

absl::Status ValidateWorkerId(absl::string_view id) {
  bool ok = !id.empty() && id.size() <= 128;
  for (char c : id) ok = ok && c > ' ' && c <= '~' && c != ',';
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "worker id '", id, "' must be 1-128 printable ASCII characters without ',' or spaces"));
}

Store::Store(std::string path, StoreEnv* env, std::unique_ptr<sqlite::Database> db)
    : path_(std::move(path)), env_(env), db_(std::move(db)) {}

Store::~Store() = default;

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path,
                                                   const StoreOptions& options) {
  MOETRAIN_ASSIGN_OR_RETURN(std::unique_ptr<sqlite::Database> db,
                            sqlite::Database::Open(path, options.busy_timeout));
  std::unique_ptr<Store> store(
      new Store(path, options.env != nullptr ? options.env : DefaultStoreEnv(), std::move(db)));
  absl::MutexLock lock(&store->mu_);
  absl::Status status = store->Initialize(options);
  if (!status.ok()) {
    // Leave a file we could not vouch for exactly as we found it.
    store->db_->DisableCheckpointOnClose();
    return status;
  }
  return store;
}

absl::Status Store::Initialize(const StoreOptions& options) {
  sqlite::Database& db = *db_;
  // Read before anything could write: a file that is not a database, or is damaged, fails here.
  if (options.verify_on_open) {
    MOETRAIN_RETURN_IF_ERROR(CheckIntegrity(db));
  } else {
    MOETRAIN_RETURN_IF_ERROR(QueryInt(db, "SELECT count(*) FROM sqlite_master").status());
  }
  std::string mode;
  {
    MOETRAIN_ASSIGN_OR_RETURN(sqlite::Statement wal, db.Prepare("PRAGMA journal_mode = WAL"));
    MOETRAIN_ASSIGN_OR_RETURN(bool row, wal.Step());
    if (row) mode = wal.Text(0);
  }
  if (mode != "wal") {
    return absl::FailedPreconditionError(absl::StrCat("store ", path_, ": journal_mode is '", mode,
                                                      "', need 'wal' (a local file system)"));
  }
  // FULL: each commit fsyncs the WAL, so a transition that returned OK survives a crash.
  MOETRAIN_RETURN_IF_ERROR(db.Exec("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON"));
  MOETRAIN_RETURN_IF_ERROR(Migrate(db));
  MOETRAIN_RETURN_IF_ERROR(CheckWritable(db));
  absl::MutexLock read_lock(&read_mu_);
  MOETRAIN_ASSIGN_OR_RETURN(reader_, sqlite::Database::Open(path_, options.busy_timeout));
  return reader_->Exec("PRAGMA query_only = ON");
}

}  // namespace moetrain::server
