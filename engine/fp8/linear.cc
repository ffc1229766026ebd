#include "engine/fp8/linear.h"

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/core/status.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/fp8/fp8.h"
#include "engine/ops/gemm/gemm.h"
#include "engine/ops/grouped_gemm/grouped_gemm.h"

namespace moetrain {
namespace {

// Quantises the operands of one linear's FP8 products, each with its slot (linear `id`, a group)
// and the recipe's format and scaling for its role.
class Quantizer {
 public:
  Quantizer(const ExecContext& ctx, const Fp8State& fp8, int id) : ctx_(ctx), fp8_(fp8), id_(id) {}

  // src (R, C) → (R, C), or (C, R) with transpose. `record`: this is the operand's first
  // quantisation in its pass, whose statistics the slot keeps (when the state is recording).
  absl::StatusOr<ops::OwnedFp8Tensor> Quantize(TensorView src, int64_t group, Fp8Role role,
                                               bool transpose, bool record) {
    const Fp8RecipeConfig& config = fp8_.config();
    const int64_t rows = transpose ? src.dim(1) : src.dim(0);
    const int64_t cols = transpose ? src.dim(0) : src.dim(1);
    MOETRAIN_ASSIGN_OR_RETURN(
        ops::OwnedFp8Tensor quantized,
        ops::AllocateFp8Tensor(ctx_, config.format(role), config.scaling(role), rows, cols));
    const Fp8State::Slot slot = fp8_.slot(id_, group, role);
    ops::Fp8QuantizeArgs args;
    args.src = src;
    args.transpose = transpose;
    args.out = quantized.view;
    switch (config.recipe) {
      case Fp8RecipeKind::kDelayed:
        // The slot's scale, from the amax history of earlier steps.
        args.scale = slot.scale;
        args.compute_scale = false;
        break;
      case Fp8RecipeKind::kCurrent:
        // Each quantisation computes its own scale. It goes to a scratch scalar, not the slot:
        // the slot's scale is delayed scaling's state, and the statistics report current
        // scaling's from the step's amax (Fp8State::EndStep).
        MOETRAIN_RETURN_IF_ERROR(EnsureScratch());
        args.scale = scratch_scale_;
        args.compute_scale = true;
        args.pow2_scales = config.pow2_scales;
        args.amax_epsilon = config.amax_epsilon;
        break;
      case Fp8RecipeKind::kBlockwise:
      case Fp8RecipeKind::kMxfp8:
        args.pow2_scales = config.pow2_scales;
        args.amax_epsilon = config.amax_epsilon;
        break;
    }
    if (record && fp8_.recording()) {
      args.amax = slot.amax;
      args.saturated = slot.saturated;
    }
    MOETRAIN_RETURN_IF_ERROR(ops::Fp8Quantize(ctx_, args));
    return quantized;
  }

 private:
  absl::Status EnsureScratch() {
    if (!scratch_scale_.empty()) return absl::OkStatus();
    MOETRAIN_ASSIGN_OR_RETURN(scratch_scale_, Tensor::Allocate(ctx_.allocator(), DType::kF32, {1}));
    return absl::OkStatus();
  }

  const ExecContext& ctx_;
  const Fp8State& fp8_;
  int id_;
  Tensor scratch_scale_;  // (1) f32 on the device: current scaling's scale of one quantisation
};

// OK when linear `id` of `fp8` is registered with groups [first_group, first_group + groups)
// and the state is allocated, else FailedPrecondition naming what is missing.
absl::Status CheckRegistered(const Fp8State& fp8, int id, int64_t first_group, int64_t groups,
                             absl::string_view op) {
  if (id < 0 || id >= static_cast<int>(fp8.linears().size())) {
    return absl::FailedPreconditionError(absl::StrCat(op, ": linear ", id,
                                                      " is not registered with the FP8 state (",
                                                      fp8.linears().size(), " linears)"));
  }
  const Fp8State::LinearInfo& info = fp8.linears()[id];
  if (first_group < 0 || groups < 0 || first_group + groups > info.groups) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": groups [", first_group, ", ", first_group + groups, ") of ", info.name,
                     " exceed its ", info.groups, " registered groups"));
  }
  if (fp8.slot(id, first_group, Fp8Role::kInput).amax.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": the FP8 state of ", info.name, " is not allocated"));
  }
  return absl::OkStatus();
}

// Both operands are matrices (the FP8 path reads their extents before the ops check them).
absl::Status CheckMatrices(absl::string_view op, absl::string_view a_name, TensorView a,
                           absl::string_view b_name, TensorView b) {
  for (const auto& [name, t] : {std::pair{a_name, a}, {b_name, b}}) {
    if (t.empty() || t.rank() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " must be a matrix, got ",
                                                     t.empty() ? "none" : t.DebugString()));
    }
  }
  return absl::OkStatus();
}

// `src` (R, C) with zero rows below it up to a multiple of `multiple` (linear.h, "Row
// padding"): src itself when R is one already, else a copy in `storage`.
struct Padded {
  TensorView view;
  Tensor storage;
};

absl::StatusOr<Padded> PadRows(const ExecContext& ctx, TensorView src, int64_t multiple) {
  const int64_t rows = src.dim(0);
  const int64_t padded = (rows + multiple - 1) / multiple * multiple;
  if (padded == rows) return Padded{.view = src, .storage = Tensor()};
  Padded out;
  MOETRAIN_ASSIGN_OR_RETURN(out.storage,
                            Tensor::Allocate(ctx.allocator(), src.dtype(), {padded, src.dim(1)}));
  out.view = out.storage.view();
  MOETRAIN_RETURN_IF_ERROR(ops::Fill(ctx, out.view.Slice(rows, padded), 0.0f));
  MOETRAIN_RETURN_IF_ERROR(ops::CopyTensor(ctx, src, out.view.Slice(0, rows)));
  return out;
}

// An f32 product (R, N) taken on `padded_rows` rows: `out` itself when they are R, else a
// scratch holding out's rows (when accumulating) above zero rows, copied back by Unpad.
absl::StatusOr<Padded> PadOutput(const ExecContext& ctx, TensorView out, int64_t padded_rows,
                                 bool accumulate) {
  if (padded_rows == out.dim(0)) return Padded{.view = out, .storage = Tensor()};
  // padded_rows is out's rows rounded up to the multiple, so rounding them up to padded_rows
  // gives padded_rows again.
  if (accumulate) return PadRows(ctx, out, padded_rows);
  Padded padded;
  MOETRAIN_ASSIGN_OR_RETURN(
      padded.storage, Tensor::Allocate(ctx.allocator(), DType::kF32, {padded_rows, out.dim(1)}));
  padded.view = padded.storage.view();
  return padded;
}

absl::Status Unpad(const ExecContext& ctx, const Padded& padded, TensorView out) {
  if (padded.storage.empty()) return absl::OkStatus();
  return ops::CopyTensor(ctx, padded.view.Slice(0, out.dim(0)), out);
}

// The three products of one (group of a) linear in FP8. Each operand is quantised along the
// product's K, the one form Hopper multiplies (TN), from its rows padded to `row_multiple`.

// y (T, N) [+]= x (T, K) · w (N, K)ᵀ: x and w are recorded.
absl::Status Fp8Forward(const ExecContext& ctx, Quantizer& quantizer, int64_t group, TensorView x,
                        TensorView w, TensorView y, bool accumulate, int64_t row_multiple) {
  if (x.dim(0) == 0) return absl::OkStatus();
  MOETRAIN_ASSIGN_OR_RETURN(const Padded px, PadRows(ctx, x, row_multiple));
  MOETRAIN_ASSIGN_OR_RETURN(
      ops::OwnedFp8Tensor qx,
      quantizer.Quantize(px.view, group, Fp8Role::kInput, /*transpose=*/false, /*record=*/true));
  MOETRAIN_ASSIGN_OR_RETURN(
      ops::OwnedFp8Tensor qw,
      quantizer.Quantize(w, group, Fp8Role::kWeight, /*transpose=*/false, /*record=*/true));
  MOETRAIN_ASSIGN_OR_RETURN(const Padded py, PadOutput(ctx, y, px.view.dim(0), accumulate));
  MOETRAIN_RETURN_IF_ERROR(
      ops::Fp8Gemm(ctx, {.a = qx.view, .b = qw.view, .c = py.view, .accumulate = accumulate}));
  return Unpad(ctx, py, y);
}

// dx (T, K) [+]= dy (T, N) · w (N, K): dy is recorded; w's transposed copy (K, N) is not (the
// forward recorded w).
absl::Status Fp8BackwardData(const ExecContext& ctx, Quantizer& quantizer, int64_t group,
                             TensorView dy, TensorView w, TensorView dx, bool accumulate,
                             int64_t row_multiple) {
  if (dy.dim(0) == 0) return absl::OkStatus();
  MOETRAIN_ASSIGN_OR_RETURN(const Padded pdy, PadRows(ctx, dy, row_multiple));
  MOETRAIN_ASSIGN_OR_RETURN(
      ops::OwnedFp8Tensor qdy,
      quantizer.Quantize(pdy.view, group, Fp8Role::kGrad, /*transpose=*/false, /*record=*/true));
  MOETRAIN_ASSIGN_OR_RETURN(
      ops::OwnedFp8Tensor qwt,
      quantizer.Quantize(w, group, Fp8Role::kWeight, /*transpose=*/true, /*record=*/false));
  MOETRAIN_ASSIGN_OR_RETURN(const Padded pdx, PadOutput(ctx, dx, pdy.view.dim(0), accumulate));
  MOETRAIN_RETURN_IF_ERROR(
      ops::Fp8Gemm(ctx, {.a = qdy.view, .b = qwt.view, .c = pdx.view, .accumulate = accumulate}));
  return Unpad(ctx, pdx, dx);
}

// dw (N, K) [+]= dy (T, N)ᵀ · x (T, K): the transposed copies dyᵀ (N, T) and xᵀ (K, T),
// quantised along the tokens; neither is recorded (the forward and the data gradient did). The
// padding rows are zero terms of the sum over tokens.
absl::Status Fp8BackwardWeight(const ExecContext& ctx, Quantizer& quantizer, int64_t group,
                               TensorView dy, TensorView x, TensorView dw, bool accumulate,
                               int64_t row_multiple) {
  if (dy.dim(0) == 0) {
    // No tokens: a zero product.
    return accumulate ? absl::OkStatus() : ops::Fill(ctx, dw, 0.0f);
  }
  MOETRAIN_ASSIGN_OR_RETURN(const Padded pdy, PadRows(ctx, dy, row_multiple));
  MOETRAIN_ASSIGN_OR_RETURN(const Padded px, PadRows(ctx, x, row_multiple));
  MOETRAIN_ASSIGN_OR_RETURN(
      ops::OwnedFp8Tensor qdyt,
      quantizer.Quantize(pdy.view, group, Fp8Role::kGrad, /*transpose=*/true, /*record=*/false));
  MOETRAIN_ASSIGN_OR_RETURN(
      ops::OwnedFp8Tensor qxt,
      quantizer.Quantize(px.view, group, Fp8Role::kInput, /*transpose=*/true, /*record=*/false));
  return ops::Fp8Gemm(ctx, {.a = qdyt.view, .b = qxt.view, .c = dw, .accumulate = accumulate});
}

// offsets: G + 1 host numbers from 0 to `rows`, non-decreasing (as GroupedGemm* require).
absl::Status CheckOffsets(absl::string_view op, absl::Span<const int64_t> offsets, int64_t groups,
                          int64_t rows) {
  if (static_cast<int64_t>(offsets.size()) != groups + 1 || offsets.front() != 0 ||
      offsets.back() != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": offsets must be ", groups + 1, " numbers from 0 to ", rows, ", got ", offsets.size(),
        offsets.empty() ? "" : absl::StrCat(" from ", offsets.front(), " to ", offsets.back())));
  }
  for (int64_t g = 0; g < groups; ++g) {
    if (offsets[g + 1] < offsets[g]) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": offsets decrease at group ", g, " (",
                                                     offsets[g], " > ", offsets[g + 1], ")"));
    }
  }
  return absl::OkStatus();
}

// The grouped checks of the FP8 path, before any slicing: `rows_view` (R, ·) and `other` (R, ·)
// (the output, or x of the weight gradient), w (G, ·, ·), the offsets, the slots.
absl::Status CheckGrouped(const Fp8State& fp8, int id, absl::string_view op, TensorView rows_view,
                          absl::string_view other_name, TensorView other, TensorView w,
                          absl::Span<const int64_t> offsets, int64_t first_group) {
  if (rows_view.empty() || rows_view.rank() != 2 || w.empty() || w.rank() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": expected rows (R, ·) and weights (G, ·, ·), got ",
                     rows_view.empty() ? "none" : rows_view.DebugString(), " and ",
                     w.empty() ? "none" : w.DebugString()));
  }
  if (other.empty() || other.rank() != 2 || other.dim(0) != rows_view.dim(0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", other_name, " must have the ", rows_view.dim(0), " rows of ",
        rows_view.DebugString(), ", got ", other.empty() ? "none" : other.DebugString()));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckOffsets(op, offsets, w.dim(0), rows_view.dim(0)));
  return CheckRegistered(fp8, id, first_group, w.dim(0), op);
}

// A linear's row multiple: its own, or its device's.
int64_t RowMultiple(const ExecContext& ctx, const Fp8State& fp8, int64_t own) {
  return own > 0 ? own : Fp8RowMultiple(ctx, fp8.config());
}

}  // namespace

int64_t Fp8RowMultiple(const ExecContext& ctx, const Fp8RecipeConfig& config) {
  return ctx.device().type == DeviceType::kCuda && config.recipe == Fp8RecipeKind::kBlockwise ? 16
                                                                                              : 1;
}

absl::Status Linear::Forward(TensorView x, TensorView w, TensorView y, bool accumulate) const {
  if (!is_fp8()) {
    return ops::Gemm(ctx_, {.a = x, .b = w, .c = y, .trans_b = true, .accumulate = accumulate});
  }
  MOETRAIN_RETURN_IF_ERROR(CheckMatrices("linear forward", "x", x, "w", w));
  MOETRAIN_RETURN_IF_ERROR(CheckRegistered(*fp8_, id_, 0, 1, "linear forward"));
  Quantizer quantizer(ctx_, *fp8_, id_);
  return Fp8Forward(ctx_, quantizer, 0, x, w, y, accumulate,
                    RowMultiple(ctx_, *fp8_, row_multiple_));
}

absl::Status Linear::BackwardData(TensorView dy, TensorView w, TensorView dx,
                                  bool accumulate) const {
  if (!is_fp8()) return ops::Gemm(ctx_, {.a = dy, .b = w, .c = dx, .accumulate = accumulate});
  MOETRAIN_RETURN_IF_ERROR(CheckMatrices("linear backward data", "dy", dy, "w", w));
  MOETRAIN_RETURN_IF_ERROR(CheckRegistered(*fp8_, id_, 0, 1, "linear backward data"));
  Quantizer quantizer(ctx_, *fp8_, id_);
  return Fp8BackwardData(ctx_, quantizer, 0, dy, w, dx, accumulate,
                         RowMultiple(ctx_, *fp8_, row_multiple_));
}

absl::Status Linear::BackwardWeight(TensorView dy, TensorView x, TensorView dw,
                                    bool accumulate) const {
  if (!is_fp8()) {
    return ops::Gemm(ctx_, {.a = dy, .b = x, .c = dw, .trans_a = true, .accumulate = accumulate});
  }
  MOETRAIN_RETURN_IF_ERROR(CheckMatrices("linear backward weight", "dy", dy, "x", x));
  MOETRAIN_RETURN_IF_ERROR(CheckRegistered(*fp8_, id_, 0, 1, "linear backward weight"));
  Quantizer quantizer(ctx_, *fp8_, id_);
  return Fp8BackwardWeight(ctx_, quantizer, 0, dy, x, dw, accumulate,
                           RowMultiple(ctx_, *fp8_, row_multiple_));
}

absl::Status GroupedLinear::Forward(TensorView x, TensorView w, absl::Span<const int64_t> offsets,
                                    int64_t first_group, TensorView y) const {
  if (!is_fp8()) return ops::GroupedGemmForward(ctx_, x, w, offsets, y);
  MOETRAIN_RETURN_IF_ERROR(
      CheckGrouped(*fp8_, id_, "grouped linear forward", x, "y", y, w, offsets, first_group));
  Quantizer quantizer(ctx_, *fp8_, id_);
  for (int64_t g = 0; g + 1 < static_cast<int64_t>(offsets.size()); ++g) {
    const int64_t begin = offsets[g], end = offsets[g + 1];
    if (begin == end) continue;
    MOETRAIN_RETURN_IF_ERROR(Fp8Forward(ctx_, quantizer, first_group + g, x.Slice(begin, end),
                                        w.Select(g), y.Slice(begin, end), /*accumulate=*/false,
                                        RowMultiple(ctx_, *fp8_, row_multiple_)));
  }
  return absl::OkStatus();
}

absl::Status GroupedLinear::BackwardData(TensorView dy, TensorView w,
                                         absl::Span<const int64_t> offsets, int64_t first_group,
                                         TensorView dx) const {
  if (!is_fp8()) return ops::GroupedGemmBackwardData(ctx_, dy, w, offsets, dx);
  MOETRAIN_RETURN_IF_ERROR(CheckGrouped(*fp8_, id_, "grouped linear backward data", dy, "dx", dx, w,
                                        offsets, first_group));
  Quantizer quantizer(ctx_, *fp8_, id_);
  for (int64_t g = 0; g + 1 < static_cast<int64_t>(offsets.size()); ++g) {
    const int64_t begin = offsets[g], end = offsets[g + 1];
    if (begin == end) continue;
    MOETRAIN_RETURN_IF_ERROR(Fp8BackwardData(
        ctx_, quantizer, first_group + g, dy.Slice(begin, end), w.Select(g), dx.Slice(begin, end),
        /*accumulate=*/false, RowMultiple(ctx_, *fp8_, row_multiple_)));
  }
  return absl::OkStatus();
}

absl::Status GroupedLinear::BackwardWeight(TensorView dy, TensorView x,
                                           absl::Span<const int64_t> offsets, int64_t first_group,
                                           TensorView dw, bool accumulate) const {
  if (!is_fp8()) return ops::GroupedGemmBackwardWeight(ctx_, dy, x, offsets, dw, accumulate);
  MOETRAIN_RETURN_IF_ERROR(CheckGrouped(*fp8_, id_, "grouped linear backward weight", dy, "x", x,
                                        dw, offsets, first_group));
  Quantizer quantizer(ctx_, *fp8_, id_);
  for (int64_t g = 0; g + 1 < static_cast<int64_t>(offsets.size()); ++g) {
    const int64_t begin = offsets[g], end = offsets[g + 1];
    // An empty group's product is zero: Fp8BackwardWeight fills it (or leaves it when
    // accumulating), as GroupedGemmBackwardWeight does.
    MOETRAIN_RETURN_IF_ERROR(Fp8BackwardWeight(
        ctx_, quantizer, first_group + g, dy.Slice(begin, end), x.Slice(begin, end), dw.Select(g),
        accumulate, RowMultiple(ctx_, *fp8_, row_multiple_)));
  }
  return absl::OkStatus();
}

}  // namespace moetrain
