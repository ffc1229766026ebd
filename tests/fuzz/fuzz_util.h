// What the fuzz targets share: a scratch directory for the readers that take a path, and a check
// that aborts (libFuzzer and the corpus replay both report an abort as a crash).
#ifndef MOETRAIN_TESTS_FUZZ_FUZZ_UTIL_H_
#define MOETRAIN_TESTS_FUZZ_FUZZ_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moetrain::fuzz {

// A directory private to this process, made on first use under /dev/shm when it is writable
// (the readers under test open, map and fsync files thousands of times a second), else under
// $TMPDIR or /tmp; removed at normal exit.
const std::string& ScratchDir();

// Writes `size` bytes to ScratchDir()/`name` (truncating it) and returns that path. `name` may
// hold a subdirectory, which is made when missing.
std::string WriteScratchFile(absl::string_view name, const uint8_t* data, size_t size);

// Prints `what` and `status` to stderr and aborts: a reader broke its documented contract.
[[noreturn]] void Fail(absl::string_view what, const absl::Status& status = absl::OkStatus());

// Aborts unless `status` has one of the codes a reader documents for bad input.
void ExpectCode(const absl::Status& status, std::initializer_list<absl::StatusCode> allowed,
                absl::string_view reader);

// Whether `result` is a refusal, whose code ExpectCode checked; the caller stops there:
//   if (Refused(manifest, {absl::StatusCode::kDataLoss}, "LoadCheckpointManifest")) return;
template <typename T>
bool Refused(const absl::StatusOr<T>& result, std::initializer_list<absl::StatusCode> allowed,
             absl::string_view reader) {
  if (result.ok()) return false;
  ExpectCode(result.status(), allowed, reader);
  return true;
}

}  // namespace moetrain::fuzz

#endif  // MOETRAIN_TESTS_FUZZ_FUZZ_UTIL_H_
