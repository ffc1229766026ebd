// What every op does before it dispatches to a backend: check that its tensors are on the device
// of its execution context and that activations are f32 or bf16, and allocate its outputs.
#ifndef MOETRAIN_ENGINE_OPS_COMMON_OP_CHECKS_H_
#define MOETRAIN_ENGINE_OPS_COMMON_OP_CHECKS_H_

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"

namespace moetrain::ops {

// One tensor argument of an op, under the name its errors give it.
struct Arg {
  std::string_view name;
  const TensorView& tensor;
};

// OK when every argument that holds a tensor (empty views are skipped) is on ctx's device, else
// InvalidArgument naming the op, the argument and both devices: "gemm: b is on cuda:0, but the op
// runs on cpu (copy it there with ops::CopyTensor)".
absl::Status CheckDevices(const ExecContext& ctx, std::string_view op,
                          std::initializer_list<Arg> args);

// What an op returns when its context is on a device for which this build has no kernel of it.
absl::Status NoBackend(const ExecContext& ctx, std::string_view op);

// An output tensor an op allocates: `t` is reused when it already has this dtype, shape and
// device, else allocated on ctx's device (uninitialised). ResourceExhausted when there is no room.
absl::Status EnsureOutput(const ExecContext& ctx, Tensor* t, DType dtype,
                          std::initializer_list<int64_t> shape);

// Activations ("act") are f32 or bf16.
inline bool IsActDType(DType dtype) { return dtype == DType::kF32 || dtype == DType::kBF16; }

// A dense f32 or bf16 tensor of `shape` (-1 = any extent), else InvalidArgument naming it.
absl::Status CheckAct(const TensorView& t, std::string_view name,
                      std::initializer_list<int64_t> shape);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_COMMON_OP_CHECKS_H_
