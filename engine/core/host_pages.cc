#include "engine/core/host_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace moetrain {
namespace {

uintptr_t PageBytes() {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return page;
}

absl::Status SystemError(const char* call, const void* data, size_t bytes) {
  return absl::InternalError(absl::StrCat(call, " of ", bytes, " bytes at ",
                                          reinterpret_cast<uintptr_t>(data), ": ",
                                          std::strerror(errno)));
}

}  // namespace

absl::Status DiscardHostRange(void* data, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  const uintptr_t page = PageBytes();
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data), end = begin + bytes;
  const uintptr_t first = (begin + page - 1) / page * page;  // the first whole page's start
  const uintptr_t last = end / page * page;                  // the last whole page's end
  if (first >= last) {                                       // no whole page inside
    std::memset(data, 0, bytes);
    return absl::OkStatus();
  }
  std::memset(data, 0, first - begin);
  std::memset(reinterpret_cast<void*>(last), 0, end - last);
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) {
    return SystemError("madvise(MADV_DONTNEED)", data, bytes);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ResidentHostBytes(const void* data, size_t bytes) {
  if (bytes == 0) return int64_t{0};
  const uintptr_t page = PageBytes();
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes + page - 1) / page * page;
  std::vector<unsigned char> resident((end - begin) / page);
  if (mincore(reinterpret_cast<void*>(begin), end - begin, resident.data()) != 0) {
    return SystemError("mincore", data, bytes);
  }
  int64_t pages = 0;
  for (const unsigned char flags : resident) pages += flags & 1;
  return pages * static_cast<int64_t>(page);
}

}  // namespace moetrain
