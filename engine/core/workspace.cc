#include "engine/core/workspace.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace moetrain {

absl::StatusOr<TensorView> Workspace::Get(int slot, DType dtype,
                                          std::initializer_list<int64_t> shape) {
  if (slot < 0 || slot >= static_cast<int>(slots_.size())) {
    return absl::InternalError(
        absl::StrCat("workspace slot ", slot, " is outside [0, ", slots_.size(), ")"));
  }
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  // Kept as f32 words, whatever dtype each request views them as.
  const int64_t words = (numel * static_cast<int64_t>(DTypeSize(dtype)) + 3) / 4;
  Tensor& storage = slots_[slot];
  if (storage.empty() || storage.numel() < words) {
    storage = Tensor();  // the old buffer goes back before the larger one is asked for
    absl::StatusOr<Tensor> grown = Tensor::Allocate(*allocator_, DType::kF32, {words});
    if (!grown.ok()) return grown.status();
    storage = *std::move(grown);
  }
  return TensorView(storage.view().raw(), dtype, shape, allocator_->device());
}

}  // namespace moetrain
