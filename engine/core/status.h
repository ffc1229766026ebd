// Status helpers. Debian's Abseil (20220623) ships no status macros, so these are ours.
#ifndef MOETRAIN_ENGINE_CORE_STATUS_H_
#define MOETRAIN_ENGINE_CORE_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

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

namespace moetrain {

// A NaN or Inf met in the numbers of a step (activations, logits, losses): the trainer fails the
// step naming it, or skips it when the job allows, instead of treating it as a bug. The code is
// OutOfRange; a payload marks it so that callers can tell it from other range errors.
inline constexpr char kNonFinitePayload[] = "moetrain.dev/non-finite";
inline absl::Status NonFiniteError(absl::string_view message) {
  absl::Status status = absl::OutOfRangeError(message);
  status.SetPayload(kNonFinitePayload, absl::Cord("1"));
  return status;
}
inline bool IsNonFiniteError(const absl::Status& status) {
  return status.GetPayload(kNonFinitePayload).has_value();
}

// The status of a failed file-system call (`error_number` an errno value, e.g. from errno or a
// std::error_code of std::filesystem), `message` naming the call and the path; the errno text is
// appended. NotFound (ENOENT), PermissionDenied (EACCES, EPERM) and ResourceExhausted (ENOSPC,
// EMFILE) keep their codes; the codes that would say the job itself is wrong (FailedPrecondition
// for EBUSY or ENOTEMPTY, Unimplemented for EXDEV, OutOfRange for EFBIG, InvalidArgument for
// EINVAL) become Unavailable: an I/O failure may pass, so a restart is worth trying.
inline absl::Status IoError(int error_number, absl::string_view message) {
  if (error_number == 0) return absl::UnknownError(message);
  absl::Status status = absl::ErrnoToStatus(error_number, message);
  switch (status.code()) {
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kInvalidArgument:
      return absl::UnavailableError(status.message());
    default:
      return status;
  }
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_STATUS_H_
