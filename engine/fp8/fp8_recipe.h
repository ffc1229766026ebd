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

// The bounds Fp8RecipeConfig::Validate holds (and the job spec's validation, in its own words).
//
// amax_history_len: Transformer Engine's default is 1,024; four times that, 16 KiB of history a
// slot, is the most. The history lives on the host of every rank and goes into every checkpoint.
inline constexpr int64_t kMaxAmaxHistoryLen = 4096;
// margin: the GEMMs dequantise with the scales' inverses (a per-tensor GEMM multiplies the two
// operands' inverses into one factor), and an infinite factor turns a 0 product into NaN. The
// delayed scale fp8_max·2^-margin / amax has the inverse amax·2^margin / fp8_max: up to a margin
// of 8 it is finite for every finite amax (E4M3's fp8_max, 448, is above 2^8), and a larger
// margin makes the factor overflow at ever smaller amaxes (at 64, once two operands' amaxes
// multiply past 2·10^5). A margin of 8 also keeps the largest value in E4M3's normal range
// (448·2^-8 = 1.75).
inline constexpr int kMaxFp8Margin = 8;
// amax_epsilon: a floor for near-zero amaxes, scale = fp8_max / max(amax, epsilon). An operand
// whose amax is below it gets the inverse epsilon / fp8_max, so two of them multiply to
// epsilon² / 448² for E4M3: from epsilon ≈ 8.3·10^21 that overflows and step 1's loss is NaN
// (1e22 did so; 8e21 quantised every tensor to zero instead). At most 1: a tensor of amax 1 or
// more keeps its own scale, and no epsilon dominates one.
inline constexpr float kMaxAmaxEpsilon = 1.0f;

// The largest amax history a delayed recipe keeps for one model, in floats: its slots (one per
// linear layer, routed expert and operand: Fp8SlotCount of engine/model/transformer.h) times
// amax_history_len, 2^28, 1 GiB on the host of every rank and in every checkpoint. DeepSeek-V3
// (92,112 slots) keeps 377 MB at Transformer Engine's default length of 1,024. Checked by
// TrainerConfig::Validate, which knows the model.
inline constexpr double kMaxFp8HistoryFloats = 268435456;  // 2^28

struct Fp8RecipeConfig {
  Fp8RecipeKind recipe = Fp8RecipeKind::kDelayed;
  bool hybrid = true;  // E5M2 gradients; false: E4M3 everywhere
  // delayed
  int64_t amax_history_len = 1024;  // [1, kMaxAmaxHistoryLen]
  int margin = 0;                   // [0, kMaxFp8Margin]
  bool amax_most_recent = false;    // amax = this step's, not the history's max
  // current, blockwise
  bool pow2_scales = false;   // the spec's default is true for blockwise, false for current
  float amax_epsilon = 0.0f;  // [0, kMaxAmaxEpsilon]
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
