#include "engine/core/workspace.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace moetrain {

absl::StatusOr<TensorView> Workspace::Get(int slot, DType dtype,
                                          std::initializer_list<int64_t> shape) {
  if (slot < 0 || slot >= num_slots_) {
    return absl::InternalError(
        absl::StrCat("workspace slot ", slot, " is outside [0, ", num_slots_, ")"));
  }
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  // Kept as f32 words, whatever dtype each request views them as.
  const int64_t words = (numel * static_cast<int64_t>(DTypeSize(dtype)) + 3) / 4;
  Tensor& storage = (*slots_)[slot];
  if (storage.empty() || storage.numel() < words) {
    storage = Tensor();  // the old buffer goes back before the larger one is asked for
    absl::StatusOr<Tensor> grown = Tensor::Allocate(*allocator_, DType::kF32, {words});
    if (!grown.ok()) return grown.status();
    storage = *std::move(grown);
  }
  return TensorView(storage.view().raw(), dtype, shape, allocator_->device());
}

absl::Status Workspace::ShareSlotsOf(const Workspace& other) {
  if (other.num_slots_ < num_slots_ || other.allocator_ != allocator_) {
    return absl::InternalError(absl::StrCat("a workspace of ", num_slots_,
                                            " slots cannot share one of ", other.num_slots_));
  }
  slots_ = other.slots_;
  return absl::OkStatus();
}

int64_t Workspace::bytes() const { return DistinctBytes({this}); }

int64_t Workspace::DistinctBytes(std::initializer_list<const Workspace*> workspaces) {
  return DistinctBytes(std::vector<const Workspace*>(workspaces));
}

int64_t Workspace::DistinctBytes(const std::vector<const Workspace*>& workspaces) {
  std::vector<const std::vector<Tensor>*> seen;
  int64_t bytes = 0;
  for (const Workspace* w : workspaces) {
    if (std::find(seen.begin(), seen.end(), w->slots_.get()) != seen.end()) continue;
    seen.push_back(w->slots_.get());
    for (const Tensor& slot : *w->slots_) bytes += slot.empty() ? 0 : slot.numel() * 4;
  }
  return bytes;
}

}  // namespace moetrain
