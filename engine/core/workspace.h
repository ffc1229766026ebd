// Buffers that live across steps, so that a steady-state step allocates (and page-faults)
// nothing: each of a layer's slots is grown, uninitialised, when a request needs more than it
// holds, and handed out as a view of the shape asked for. Workspaces of layers that never hold
// activations at the same time can share their slots (ShareSlotsOf: activation recompute).
#ifndef MOETRAIN_ENGINE_CORE_WORKSPACE_H_
#define MOETRAIN_ENGINE_CORE_WORKSPACE_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/core/allocator.h"
#include "engine/core/tensor.h"

namespace moetrain {

class Workspace {
 public:
  // `num_slots` slots whose memory comes from `allocator` (not owned; outlives this).
  Workspace(int num_slots, Allocator& allocator)
      : num_slots_(num_slots),
        slots_(std::make_shared<std::vector<Tensor>>(num_slots)),
        allocator_(&allocator) {}
  // Moved, never copied: a copy would share the slots without saying so (ShareSlotsOf does).
  Workspace(Workspace&&) = default;
  Workspace& operator=(Workspace&&) = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // Slot `slot` as a contiguous view of `shape` and `dtype`, on the allocator's device. The view
  // stays valid until the slot is asked for again with a larger size. ResourceExhausted when the
  // device has no room.
  absl::StatusOr<TensorView> Get(int slot, DType dtype, std::initializer_list<int64_t> shape);

  // From now on this workspace hands out `other`'s first slots (as many as it has; other has at
  // least as many, from the same allocator), its own going back: views of one are then
  // overwritten by the other's users. For layers that run one after another and keep nothing
  // between their turns. Internal error when other has fewer slots or another allocator.
  absl::Status ShareSlotsOf(const Workspace& other);

  // The bytes its slots hold now; the bytes of every distinct slot storage of `workspaces` (shared
  // slots counted once).
  int64_t bytes() const;
  static int64_t DistinctBytes(std::initializer_list<const Workspace*> workspaces);
  static int64_t DistinctBytes(const std::vector<const Workspace*>& workspaces);

 private:
  int num_slots_;
  std::shared_ptr<std::vector<Tensor>> slots_;  // num_slots_ or more (shared)
  Allocator* allocator_;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_WORKSPACE_H_
