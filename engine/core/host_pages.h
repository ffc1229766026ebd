// Host memory a buffer keeps allocated but lets the system have back for a while: sharded
// gradients (grad_sync.h) give up the pages of the blocks other ranks keep once these are summed,
// and use them again, zero-filled by the kernel, at the next backward.
#ifndef MOETRAIN_ENGINE_CORE_HOST_PAGES_H_
#define MOETRAIN_ENGINE_CORE_HOST_PAGES_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moetrain {

// The bytes [data, data + bytes) of one host allocation (private anonymous memory: the C heap
// or an anonymous mapping) read as zero afterwards. The whole pages inside the range go back to
// the system (madvise MADV_DONTNEED; the next touch maps a zero page); the parts of the first and
// last pages that other bytes share are zeroed in place. Internal naming the range when the
// system refuses.
absl::Status DiscardHostRange(void* data, size_t bytes);

// The bytes of the pages that hold [data, data + bytes) and are resident in memory now (mincore),
// whole pages counted: what the range costs the machine, measured. A discarded page that was read
// but not written since maps the kernel's shared zero page, which counts as resident here though
// it costs nothing: measure before reading. Internal when the system refuses.
absl::StatusOr<int64_t> ResidentHostBytes(const void* data, size_t bytes);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_HOST_PAGES_H_
