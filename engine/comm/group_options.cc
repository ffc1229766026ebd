#include "engine/comm/group_options.h"

#include "absl/strings/str_cat.h"

namespace moetrain {

absl::Status GroupOptions::Validate(bool needs_store) const {
  if (needs_store && store == nullptr) {
    return absl::InvalidArgumentError("communicator options: store is null");
  }
  if (size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("communicator size = ", size, " < 1"));
  }
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("communicator rank = ", rank, " is outside [0, size = ", size, ")"));
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("communicator timeout = ", absl::FormatDuration(timeout), " is not positive"));
  }
  return absl::OkStatus();
}

}  // namespace moetrain
