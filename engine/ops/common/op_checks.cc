#include "engine/ops/common/op_checks.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace moetrain::ops {
namespace {

// Debian's Abseil is built with its own string_view, which StrCat needs.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

absl::Status CheckDevices(const ExecContext& ctx, std::string_view op,
                          std::initializer_list<Arg> args) {
  for (const Arg& arg : args) {
    if (arg.tensor.empty() || arg.tensor.device() == ctx.device()) continue;
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(op), ": ", ToAbsl(arg.name), " is on ",
                     arg.tensor.device().DebugString(), ", but the op runs on ",
                     ctx.device().DebugString(), " (copy it there with ops::CopyTensor)"));
  }
  return absl::OkStatus();
}

absl::Status NoBackend(const ExecContext& ctx, std::string_view op) {
  return absl::InvalidArgumentError(
      absl::StrCat(ToAbsl(op), ": no backend in this build serves ", ctx.device().DebugString()));
}

absl::Status EnsureOutput(const ExecContext& ctx, Tensor* t, DType dtype,
                          std::initializer_list<int64_t> shape) {
  if (!t->empty() && t->dtype() == dtype && t->device() == ctx.device() &&
      t->view().shape() == absl::Span<const int64_t>(shape)) {
    return absl::OkStatus();
  }
  absl::StatusOr<Tensor> allocated = Tensor::Allocate(ctx.allocator(), dtype, shape);
  if (!allocated.ok()) return allocated.status();
  *t = *std::move(allocated);
  return absl::OkStatus();
}

absl::Status CheckAct(const TensorView& t, std::string_view name,
                      std::initializer_list<int64_t> shape) {
  if (t.empty() || !IsActDType(t.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(name),
                                                   ": expected an f32 or bf16 tensor, got ",
                                                   t.empty() ? "none" : t.DebugString()));
  }
  return CheckDenseTensor(t, name, t.dtype(), shape);
}

}  // namespace moetrain::ops
