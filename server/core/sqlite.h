// A thin RAII layer over the SQLite C API for the store: one connection, prepared statements
// with typed binds, and SQLite result codes turned into absl::Status by what the caller should do.
// Internal to server/core; not thread-safe (the store serializes access).
#ifndef MOETRAIN_SERVER_CORE_SQLITE_H_
#define MOETRAIN_SERVER_CORE_SQLITE_H_

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace moetrain::server::sqlite {

// Bytes bound as a BLOB (a plain string_view binds as TEXT).
struct Blob {
  absl::string_view bytes;
};

// SQLITE_BUSY / SQLITE_LOCKED → Unavailable (retry), SQLITE_CORRUPT / SQLITE_NOTADB → DataLoss,
// SQLITE_FULL → ResourceExhausted, SQLITE_READONLY / SQLITE_CANTOPEN / SQLITE_PERM →
// FailedPrecondition (fix the permissions), anything else → Internal. The message names the
// database file.
absl::Status SqliteStatus(int code, absl::string_view path, absl::string_view what,
                          absl::string_view detail);

class Database;

// A prepared statement, borrowed from its database's cache and given back (reset, bindings
// cleared) when destroyed. Must not outlive the database.
class Statement {
 public:
  Statement(sqlite3_stmt* stmt, std::string path, Database* owner)
      : stmt_(stmt), path_(std::move(path)), owner_(owner) {}
  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&&) = delete;
  Statement(const Statement&) = delete;
  ~Statement();

  // Binds parameters ?1, ?2, ... in order.
  template <typename... Args>
  absl::Status BindAll(const Args&... args) {
    int index = 0;
    absl::Status status;
    ((status.ok() ? status = Bind(++index, args) : status), ...);
    return status;
  }
  absl::Status Bind(int index, int64_t value);
  absl::Status Bind(int index, int value) { return Bind(index, static_cast<int64_t>(value)); }
  absl::Status Bind(int index, absl::string_view text);
  absl::Status Bind(int index, const std::string& text) {
    return Bind(index, absl::string_view(text));
  }
  absl::Status Bind(int index, const char* text) { return Bind(index, absl::string_view(text)); }
  absl::Status Bind(int index, Blob blob);
  absl::Status Bind(int index, std::nullopt_t);
  template <typename T>
  absl::Status Bind(int index, const std::optional<T>& value) {
    return value.has_value() ? Bind(index, *value) : Bind(index, std::nullopt);
  }

  // True when a row is ready, false when the statement is done.
  absl::StatusOr<bool> Step();
  // Steps to completion, calling `row` on each row (this statement, positioned on it); stops at
  // the first error, SQLite's or the callback's.
  absl::Status ForEachRow(absl::FunctionRef<absl::Status(const Statement&)> row);
  // Steps to completion, expecting no rows (INSERT, UPDATE, DDL).
  absl::Status Run();

  bool IsNull(int column) const;
  int64_t Int(int column) const;
  std::string Text(int column) const;  // also reads BLOBs
  std::optional<int64_t> OptionalInt(int column) const;

 private:
  sqlite3_stmt* stmt_;
  std::string path_;
  Database* owner_;
};

class Database {
 public:
  // Opens (creating if missing) the database file. Only opens the handle: SQLite reads the file
  // lazily, so a bad file shows up at the first statement.
  static absl::StatusOr<std::unique_ptr<Database>> Open(const std::string& path,
                                                        absl::Duration busy_timeout);
  ~Database();

  // Multiple ';'-separated statements, no parameters, no results.
  absl::Status Exec(absl::string_view sql);
  absl::StatusOr<Statement> Prepare(absl::string_view sql);
  // Prepare + BindAll.
  template <typename... Args>
  absl::StatusOr<Statement> Query(absl::string_view sql, const Args&... args) {
    absl::StatusOr<Statement> stmt = Prepare(sql);
    if (!stmt.ok()) return stmt.status();
    absl::Status bound = stmt->BindAll(args...);
    if (!bound.ok()) return bound;
    return stmt;
  }
  // Query + Run.
  template <typename... Args>
  absl::Status Execute(absl::string_view sql, const Args&... args) {
    absl::StatusOr<Statement> stmt = Query(sql, args...);
    if (!stmt.ok()) return stmt.status();
    return stmt->Run();
  }
  // Runs `body` inside BEGIN IMMEDIATE ... COMMIT (the write lock is taken up front, so two
  // writers never deadlock upgrading a read lock); rolls back when the body or COMMIT fails.
  absl::Status Transaction(absl::FunctionRef<absl::Status()> body);
  // Runs every body in one BEGIN IMMEDIATE ... COMMIT (one fsync for all of them), each inside a
  // savepoint of its own, so that a body that fails rolls back only its own changes; results[i]
  // is body i's status. When BEGIN or COMMIT fails, every body that succeeded gets that error
  // and nothing is kept.
  void BatchTransaction(absl::Span<const absl::FunctionRef<absl::Status()>> bodies,
                        absl::Span<absl::Status> results);
  // Rows changed by the last INSERT/UPDATE/DELETE.
  int64_t Changes() const;
  // Keep the file as it is on close (no WAL checkpoint): for a file that failed verification.
  void DisableCheckpointOnClose();

  const std::string& path() const { return path_; }

 private:
  friend class Statement;
  Database(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  // Takes back a statement no longer in use, for the next Prepare of the same SQL.
  void Recycle(sqlite3_stmt* stmt);

  sqlite3* db_;
  std::string path_;
  // Idle prepared statements by SQL text: the store runs the same few dozen statements over and
  // over, and compiling them was a visible share of each call.
  std::unordered_multimap<std::string, sqlite3_stmt*> idle_;
};

}  // namespace moetrain::server::sqlite

#endif  // MOETRAIN_SERVER_CORE_SQLITE_H_
