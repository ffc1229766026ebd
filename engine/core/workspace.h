// Buffers that live across steps, so that a steady-state step allocates (and page-faults)
// nothing: each of a layer's slots is grown, uninitialised, when a request needs more than it
// holds, and handed out as a view of the shape asked for.
#ifndef MOETRAIN_ENGINE_CORE_WORKSPACE_H_
#define MOETRAIN_ENGINE_CORE_WORKSPACE_H_

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/core/allocator.h"
#include "engine/core/tensor.h"

namespace moetrain {

class Workspace {
 public:
  // `num_slots` slots whose memory comes from `allocator` (not owned; outlives this).
  Workspace(int num_slots, Allocator& allocator) : slots_(num_slots), allocator_(&allocator) {}

  // Slot `slot` as a contiguous view of `shape` and `dtype`, on the allocator's device. The view
  // stays valid until the slot is asked for again with a larger size. ResourceExhausted when the
  // device has no room.
  absl::StatusOr<TensorView> Get(int slot, DType dtype, std::initializer_list<int64_t> shape);

 private:
  std::vector<Tensor> slots_;
  Allocator* allocator_;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_WORKSPACE_H_
