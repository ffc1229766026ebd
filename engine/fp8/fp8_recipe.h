// The FP8 training recipes (train.fp8 in the job spec; docs/fp8.md): which scaling each operand of
// an FP8 GEMM gets, and with what options. Transformer Engine's four recipes:
//
//   delayed    one scale per tensor from the amax history of earlier steps (reduced over the
//              data-parallel ranks): scale = fp8_max·2^-margin / amax, the old scale kept when
//              amax is 0 or not finite;
//   current    one scale per tensor from this tensor's amax;
//   blockwise  1×128 blocks for activations and gradients, 128×128 for weights (DeepSeek-V3);
//              power-of-two scales by default;
//   mxfp8      an E8M0 scale per 32 elements along K, for every operand.
//
// Formats: HYBRID (default) = E4M3 for activations and weights, E5M2 for gradients; E4M3 = E4M3
// everywhere.
#ifndef MOETRAIN_ENGINE_FP8_FP8_RECIPE_H_
#define MOETRAIN_ENGINE_FP8_FP8_RECIPE_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "engine/core/fp8_math.h"
#include "engine/ops/fp8/fp8.h"

namespace moetrain {

enum class Fp8RecipeKind : uint8_t { kDelayed, kCurrent, kBlockwise, kMxfp8 };
// "delayed", "current", "blockwise", "mxfp8".
std::string_view Fp8RecipeName(Fp8RecipeKind recipe);

// The three operands of a linear layer's GEMMs.
enum class Fp8Role : uint8_t { kInput, kWeight, kGrad };
inline constexpr int kNumFp8Roles = 3;

struct Fp8RecipeConfig {
  Fp8RecipeKind recipe = Fp8RecipeKind::kDelayed;
  bool hybrid = true;  // E5M2 gradients; false: E4M3 everywhere
  // delayed
  int64_t amax_history_len = 1024;  // >= 1
  int margin = 0;                   // >= 0
  bool amax_most_recent = false;    // amax = this step's, not the history's max
  // current, blockwise
  bool pow2_scales = false;   // the spec's default is true for blockwise, false for current
  float amax_epsilon = 0.0f;  // >= 0, finite
  // Expert-parallel dispatch sends E4M3 rows with 1×128 power-of-two scales (and the receiver
  // dequantises them) instead of compute-dtype rows.
  bool fp8_dispatch = false;

  // InvalidArgument naming the train.fp8 field and value.
  absl::Status Validate() const;

  Fp8Format format(Fp8Role role) const {
    return role == Fp8Role::kGrad && hybrid ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
  }
  // The scaling of an operand under this recipe.
  ops::Fp8Scaling scaling(Fp8Role role) const;
  // Delayed scaling keeps state (histories and scales) between steps; the others none.
  bool has_state() const { return recipe == Fp8RecipeKind::kDelayed; }
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_FP8_FP8_RECIPE_H_
