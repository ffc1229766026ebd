// The GEMMs of a linear layer y = x·wᵀ and of a set of grouped ones (the MoE experts), in the
// compute dtype or, when the model trains in FP8, quantised by the recipe (fp8_recipe.h):
//
//   forward        y  [+]= x · wᵀ     x: Input,  w: Weight
//   backward data  dx [+]= dy · w     dy: Grad,  w: Weight (its transposed FP8 copy)
//   backward wgt   dw [+]= dyᵀ · x    dy, x: their transposed FP8 copies (quantised along tokens)
//
// Without FP8 these are exactly the ops::Gemm / ops::GroupedGemm calls (same bits). With FP8 each
// operand is quantised (ops/fp8/fp8.h) with its slot's scale or its own blocks, and multiplied by
// ops::Fp8Gemm. Statistics (amax, saturations) are recorded once per operand and pass: by the
// forward for x and w, by the data gradient for dy.
//
// x, w and dy are in the compute dtype ("act": f32 or bf16); y, dx and dw are f32. A linear holds
// no tensors: it borrows the caller's and allocates its FP8 copies per call.
//
// Row padding: cuBLASLt's block-scaled FP8 kernels on Hopper want the token count of each product
// (the rows of x and dy; the inner dimension of the weight gradient) a multiple of 16; for other
// counts they offer no kernel, and ops::Fp8Gemm takes its exact f32 fallback, many times slower.
// So under the blockwise recipe on CUDA a group whose rows are not a multiple of 16 is quantised
// from a copy padded with zero rows, and its products are taken on the padded rows and cut back.
// Zero rows change no amax, no scale and no saturation count, and add only exact zeros to the
// weight gradient. The per-tensor kernels take any count (the FP8 copies' columns are padded to
// 16 bytes already), and padding them measured slower on an H200, so they are not padded.
#ifndef MOETRAIN_ENGINE_FP8_LINEAR_H_
#define MOETRAIN_ENGINE_FP8_LINEAR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/fp8/fp8_recipe.h"
#include "engine/fp8/fp8_state.h"

namespace moetrain {

// The row multiple of the FP8 products of `config` on ctx's device: 16 for the blockwise recipe
// on CUDA, else 1 (no padding).
int64_t Fp8RowMultiple(const ExecContext& ctx, const Fp8RecipeConfig& config);

class Linear {
 public:
  // Without FP8 (fp8 null), or as linear `id` of `fp8` (fp8->Register). row_multiple: the rows of
  // the FP8 products are padded to a multiple of it (0: Fp8RowMultiple; tests set 16 on the
  // CPU to check the padding).
  Linear(const ExecContext& ctx, Fp8State* fp8 = nullptr, int id = -1, int64_t row_multiple = 0)
      : ctx_(ctx), fp8_(fp8), id_(id), row_multiple_(row_multiple) {}

  bool is_fp8() const { return fp8_ != nullptr; }

  // x (T, K), w (N, K) → y (T, N).
  absl::Status Forward(TensorView x, TensorView w, TensorView y, bool accumulate = false) const;
  // dy (T, N), w (N, K) → dx (T, K).
  absl::Status BackwardData(TensorView dy, TensorView w, TensorView dx,
                            bool accumulate = false) const;
  // dy (T, N), x (T, K) → dw (N, K).
  absl::Status BackwardWeight(TensorView dy, TensorView x, TensorView dw,
                              bool accumulate = true) const;

 private:
  ExecContext ctx_;
  Fp8State* fp8_;
  int id_;
  int64_t row_multiple_;
};

// G groups: group g owns rows [offsets[g], offsets[g+1]) (host numbers from 0) and weight w[g];
// its FP8 slots are those of group first_group + g of the registered linear (a rank's local
// experts are global experts [first, first + G)). Empty groups cost nothing.
class GroupedLinear {
 public:
  GroupedLinear(const ExecContext& ctx, Fp8State* fp8 = nullptr, int id = -1,
                int64_t row_multiple = 0)
      : ctx_(ctx), fp8_(fp8), id_(id), row_multiple_(row_multiple) {}

  bool is_fp8() const { return fp8_ != nullptr; }

  // x (R, K), w (G, N, K) → y (R, N).
  absl::Status Forward(TensorView x, TensorView w, absl::Span<const int64_t> offsets,
                       int64_t first_group, TensorView y) const;
  // dy (R, N), w (G, N, K) → dx (R, K).
  absl::Status BackwardData(TensorView dy, TensorView w, absl::Span<const int64_t> offsets,
                            int64_t first_group, TensorView dx) const;
  // dy (R, N), x (R, K) → dw (G, N, K), added when accumulate.
  absl::Status BackwardWeight(TensorView dy, TensorView x, absl::Span<const int64_t> offsets,
                              int64_t first_group, TensorView dw, bool accumulate) const;

 private:
  ExecContext ctx_;
  Fp8State* fp8_;
  int id_;
  int64_t row_multiple_;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_FP8_LINEAR_H_
