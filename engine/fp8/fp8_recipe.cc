#include "engine/fp8/fp8_recipe.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace moetrain {
namespace {

// absl::string_view, not std::: this Abseil is built with its own string_view, which StrCat needs.
absl::Status Invalid(absl::string_view field, auto value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("train.fp8.", field, " = ", value, " ", why));
}

}  // namespace

std::string_view Fp8RecipeName(Fp8RecipeKind recipe) {
  switch (recipe) {
    case Fp8RecipeKind::kDelayed:
      return "delayed";
    case Fp8RecipeKind::kCurrent:
      return "current";
    case Fp8RecipeKind::kBlockwise:
      return "blockwise";
    case Fp8RecipeKind::kMxfp8:
      return "mxfp8";
  }
  return "unknown";
}

absl::Status Fp8RecipeConfig::Validate() const {
  // An enum read from a wider integer may hold no enumerator; every switch on it would misroute.
  if (recipe != Fp8RecipeKind::kDelayed && recipe != Fp8RecipeKind::kCurrent &&
      recipe != Fp8RecipeKind::kBlockwise && recipe != Fp8RecipeKind::kMxfp8) {
    return Invalid("recipe", static_cast<int>(recipe), "is not an FP8 recipe");
  }
  if (amax_history_len < 1 || amax_history_len > kMaxAmaxHistoryLen) {
    return Invalid("amax_history_len", amax_history_len,
                   absl::StrCat("must be in [1, ", kMaxAmaxHistoryLen, "]"));
  }
  if (margin < 0 || margin > kMaxFp8Margin) {
    return Invalid("margin", margin, absl::StrCat("must be in [0, ", kMaxFp8Margin, "]"));
  }
  if (!(amax_epsilon >= 0.0f && amax_epsilon <= kMaxAmaxEpsilon)) {
    return Invalid("amax_epsilon", amax_epsilon,
                   absl::StrCat("must be in [0, ", kMaxAmaxEpsilon, "]"));
  }
  return absl::OkStatus();
}

ops::Fp8Scaling Fp8RecipeConfig::scaling(Fp8Role role) const {
  switch (recipe) {
    case Fp8RecipeKind::kDelayed:
    case Fp8RecipeKind::kCurrent:
      return ops::Fp8Scaling::kTensor;
    case Fp8RecipeKind::kBlockwise:
      // DeepSeek-V3: weights in 128×128 tiles (one scale serves both the weight and its
      // transposed copy), activations and gradients in 1×128 strips along K.
      return role == Fp8Role::kWeight ? ops::Fp8Scaling::kBlock128x128
                                      : ops::Fp8Scaling::kBlock1x128;
    case Fp8RecipeKind::kMxfp8:
      return ops::Fp8Scaling::kMx1x32;
  }
  return ops::Fp8Scaling::kTensor;
}

}  // namespace moetrain
