#include "server/core/sqlite.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace moetrain::server::sqlite {

absl::Status SqliteStatus(int code, absl::string_view path, absl::string_view what,
                          absl::string_view detail) {
  std::string message =
      absl::StrCat("store ", path, ": ", what, ": ", detail, " (sqlite code ", code, ")");
  switch (code & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(message);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(message);
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(message);
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
      // Permissions or a read-only mount: nothing a retry fixes, the operator must.
      return absl::FailedPreconditionError(
          absl::StrCat(message, "; the coordinator must be able to write ", path, " and to create ",
                       path, "-wal and ", path, "-shm beside it"));
    default:
      return absl::InternalError(message);
  }
}

namespace {

absl::Status StatementError(sqlite3_stmt* stmt, int code, absl::string_view path) {
  sqlite3* db = sqlite3_db_handle(stmt);
  const char* sql = sqlite3_sql(stmt);
  return SqliteStatus(code, path, sql != nullptr ? sql : "statement", sqlite3_errmsg(db));
}

}  // namespace

Statement::Statement(Statement&& other) noexcept
    : stmt_(std::exchange(other.stmt_, nullptr)),
      path_(std::move(other.path_)),
      owner_(other.owner_) {}

Statement::~Statement() {
  if (stmt_ != nullptr) owner_->Recycle(stmt_);
}

absl::Status Statement::Bind(int index, int64_t value) {
  int code = sqlite3_bind_int64(stmt_, index, value);
  return code == SQLITE_OK ? absl::OkStatus() : StatementError(stmt_, code, path_);
}

absl::Status Statement::Bind(int index, absl::string_view text) {
  int code =
      sqlite3_bind_text64(stmt_, index, text.data(), text.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
  return code == SQLITE_OK ? absl::OkStatus() : StatementError(stmt_, code, path_);
}

absl::Status Statement::Bind(int index, Blob blob) {
  // A null data pointer would bind NULL; an empty blob must stay an empty blob.
  const char* data = blob.bytes.data() != nullptr ? blob.bytes.data() : "";
  int code = sqlite3_bind_blob64(stmt_, index, data, blob.bytes.size(), SQLITE_TRANSIENT);
  return code == SQLITE_OK ? absl::OkStatus() : StatementError(stmt_, code, path_);
}

absl::Status Statement::Bind(int index, std::nullopt_t) {
  int code = sqlite3_bind_null(stmt_, index);
  return code == SQLITE_OK ? absl::OkStatus() : StatementError(stmt_, code, path_);
}

absl::StatusOr<bool> Statement::Step() {
  int code = sqlite3_step(stmt_);
  if (code == SQLITE_ROW) return true;
  if (code == SQLITE_DONE) return false;
  return StatementError(stmt_, code, path_);
}

absl::Status Statement::ForEachRow(absl::FunctionRef<absl::Status(const Statement&)> row) {
  for (;;) {
    absl::StatusOr<bool> ready = Step();
    if (!ready.ok()) return ready.status();
    if (!*ready) return absl::OkStatus();
    absl::Status status = row(*this);
    if (!status.ok()) return status;
  }
}

absl::Status Statement::Run() {
  return ForEachRow([](const Statement&) { return absl::OkStatus(); });
}

bool Statement::IsNull(int column) const {
  return sqlite3_column_type(stmt_, column) == SQLITE_NULL;
}

int64_t Statement::Int(int column) const { return sqlite3_column_int64(stmt_, column); }

std::string Statement::Text(int column) const {
  const void* data = sqlite3_column_blob(stmt_, column);
  int size = sqlite3_column_bytes(stmt_, column);
  if (data == nullptr || size <= 0) return std::string();
  return std::string(static_cast<const char*>(data), static_cast<size_t>(size));
}

std::optional<int64_t> Statement::OptionalInt(int column) const {
  if (IsNull(column)) return std::nullopt;
  return Int(column);
}

absl::StatusOr<std::unique_ptr<Database>> Database::Open(const std::string& path,
                                                         absl::Duration busy_timeout) {
  sqlite3* db = nullptr;
  // The store serializes access to its connection with its own mutex.
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
  int code = sqlite3_open_v2(path.c_str(), &db, flags, nullptr);
  if (code != SQLITE_OK) {
    absl::Status status =
        SqliteStatus(code, path, "open", db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(code));
    sqlite3_close(db);
    return status;
  }
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, static_cast<int>(absl::ToInt64Milliseconds(busy_timeout)));
  return std::unique_ptr<Database>(new Database(db, path));
}

Database::~Database() {
  for (auto& [sql, stmt] : idle_) sqlite3_finalize(stmt);
  sqlite3_close_v2(db_);
}

absl::Status Database::Exec(absl::string_view sql) {
  std::string owned(sql);
  char* error = nullptr;
  int code = sqlite3_exec(db_, owned.c_str(), nullptr, nullptr, &error);
  if (code == SQLITE_OK) return absl::OkStatus();
  absl::Status status =
      SqliteStatus(code, path_, owned, error != nullptr ? error : sqlite3_errstr(code));
  sqlite3_free(error);
  return status;
}

absl::StatusOr<Statement> Database::Prepare(absl::string_view sql) {
  auto idle = idle_.find(std::string(sql));
  if (idle != idle_.end()) {
    sqlite3_stmt* stmt = idle->second;
    idle_.erase(idle);
    return Statement(stmt, path_, this);
  }
  sqlite3_stmt* stmt = nullptr;
  int code = sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()),
                                SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
  if (code != SQLITE_OK) {
    sqlite3_finalize(stmt);
    return SqliteStatus(code, path_, sql, sqlite3_errmsg(db_));
  }
  return Statement(stmt, path_, this);
}

void Database::Recycle(sqlite3_stmt* stmt) {
  sqlite3_reset(stmt);
  sqlite3_clear_bindings(stmt);
  idle_.emplace(sqlite3_sql(stmt), stmt);
}

absl::Status Database::Transaction(absl::FunctionRef<absl::Status()> body) {
  absl::Status status = Exec("BEGIN IMMEDIATE");
  if (!status.ok()) return status;
  status = body();
  if (status.ok()) status = Exec("COMMIT");
  // Some errors (SQLITE_FULL, SQLITE_IOERR) already rolled the transaction back.
  if (!status.ok() && sqlite3_get_autocommit(db_) == 0) Exec("ROLLBACK").IgnoreError();
  return status;
}

void Database::BatchTransaction(absl::Span<const absl::FunctionRef<absl::Status()>> bodies,
                                absl::Span<absl::Status> results) {
  absl::Status begun = Exec("BEGIN IMMEDIATE");
  if (!begun.ok()) {
    for (absl::Status& result : results) result = begun;
    return;
  }
  for (size_t i = 0; i < bodies.size(); ++i) {
    absl::Status status = Exec("SAVEPOINT body");
    if (status.ok()) status = bodies[i]();
    if (!status.ok() && sqlite3_get_autocommit(db_) != 0) {
      // The error rolled back the whole transaction (SQLITE_FULL, SQLITE_IOERR): what ran before
      // is gone too.
      for (absl::Status& result : results) result = status;
      return;
    }
    if (!status.ok()) Exec("ROLLBACK TO body").IgnoreError();
    Exec("RELEASE body").IgnoreError();
    results[i] = status;
  }
  absl::Status committed = Exec("COMMIT");
  if (committed.ok()) return;
  if (sqlite3_get_autocommit(db_) == 0) Exec("ROLLBACK").IgnoreError();
  for (absl::Status& result : results) {
    if (result.ok()) result = committed;
  }
}

int64_t Database::Changes() const { return sqlite3_changes64(db_); }

void Database::DisableCheckpointOnClose() {
  sqlite3_db_config(db_, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
}

}  // namespace moetrain::server::sqlite
