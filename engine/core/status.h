// Status helpers. Debian's Abseil (20220623) ships no status macros, so these are ours.
#ifndef MOETRAIN_ENGINE_CORE_STATUS_H_
#define MOETRAIN_ENGINE_CORE_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MOETRAIN_STATUS_CONCAT_INNER_(a, b) a##b
#define MOETRAIN_STATUS_CONCAT_(a, b) MOETRAIN_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define MOETRAIN_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    ::absl::Status moetrain_status_ = (expr);            \
    if (!moetrain_status_.ok()) return moetrain_status_; \
  } while (0)

// `MOETRAIN_ASSIGN_OR_RETURN(auto x, Foo());` assigns the value of a StatusOr or returns its error.
#define MOETRAIN_ASSIGN_OR_RETURN(lhs, expr) \
  MOETRAIN_ASSIGN_OR_RETURN_IMPL_(MOETRAIN_STATUS_CONCAT_(moetrain_statusor_, __LINE__), lhs, expr)

#define MOETRAIN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                    \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = std::move(statusor).value()

#endif  // MOETRAIN_ENGINE_CORE_STATUS_H_
