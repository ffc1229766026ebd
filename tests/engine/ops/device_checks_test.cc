// Every op refuses a tensor that is not on its context's device, before it reads anything, with
// an InvalidArgument that names the op, the argument and both devices.
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/rng.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/ops/attention/attention.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/embedding/embedding.h"
#include "engine/ops/gemm/gemm.h"
#include "engine/ops/grouped_gemm/grouped_gemm.h"
#include "engine/ops/loss/lm_head_loss.h"
#include "engine/ops/norm/rms_norm.h"
#include "engine/ops/optim/optim.h"
#include "engine/ops/permute/permute.h"
#include "engine/ops/rope/rope.h"
#include "engine/ops/router/router.h"
#include "engine/ops/swiglu/swiglu.h"
#include "gtest/gtest.h"

namespace moetrain::ops {
namespace {

// Host tensors of the right shapes for every op below, and one view of "device memory" (never
// dereferenced: the check must come first).
struct Args {
  Tensor f32_8x4 = Tensor::Zeros(DType::kF32, {8, 4});
  Tensor f32_8x8 = Tensor::Zeros(DType::kF32, {8, 8});
  Tensor f32_4x4 = Tensor::Zeros(DType::kF32, {4, 4});
  Tensor f32_2x4x4 = Tensor::Zeros(DType::kF32, {2, 4, 4});
  Tensor f32_8 = Tensor::Zeros(DType::kF32, {8});
  Tensor f32_4 = Tensor::Zeros(DType::kF32, {4});
  Tensor i32_8 = Tensor::Zeros(DType::kI32, {8});
  Tensor i32_8x2 = Tensor::Zeros(DType::kI32, {8, 2});
  Tensor f32_8x2 = Tensor::Zeros(DType::kF32, {8, 2});
  Tensor i32_2x5 = Tensor::Zeros(DType::kI32, {2, 5});
  Tensor lse = Tensor::Zeros(DType::kF32, {1, 1, 8});
  float fake_device_memory[64] = {};
  // Host memory that says it is a GPU's, for tensors (never read as device memory here).
  class GpuLabelledAllocator final : public Allocator {
   public:
    Device device() const override { return Device::Cuda(0); }
    absl::StatusOr<void*> Allocate(size_t bytes) override { return CpuAllocator().Allocate(bytes); }
    void Deallocate(void* data) override { CpuAllocator().Deallocate(data); }
  } gpu_allocator;
  TensorView OnGpu(const Tensor& shaped) const {
    return TensorView(const_cast<float*>(fake_device_memory), shaped.dtype(), shaped.view().shape(),
                      Device::Cuda(0));
  }
};

struct Case {
  std::string op;    // as the error names it
  std::string name;  // the argument on the GPU
  std::function<absl::Status(const ExecContext&, Args&)> call;
};

std::vector<Case> Cases() {
  MoeConfig moe;
  moe.num_experts = 4;
  moe.top_k = 2;
  const AttentionShape shape = {
      .batch = 1, .seq_len = 8, .num_heads = 1, .num_kv_heads = 1, .head_dim = 4};
  return {
      {"gemm", "b",
       [](const ExecContext& c, Args& a) {
         return Gemm(c, {.a = a.f32_8x4, .b = a.OnGpu(a.f32_4x4), .c = a.f32_8x4});
       }},
      {"grouped gemm forward", "w",
       [](const ExecContext& c, Args& a) {
         return GroupedGemmForward(c, a.f32_8x4, a.OnGpu(a.f32_2x4x4), {0, 4, 8}, a.f32_8x4);
       }},
      {"grouped gemm backward data", "dx",
       [](const ExecContext& c, Args& a) {
         return GroupedGemmBackwardData(c, a.f32_8x4, a.f32_2x4x4, {0, 4, 8}, a.OnGpu(a.f32_8x4));
       }},
      {"grouped gemm backward weight", "dw",
       [](const ExecContext& c, Args& a) {
         return GroupedGemmBackwardWeight(c, a.f32_8x4, a.f32_8x4, {0, 4, 8}, a.OnGpu(a.f32_2x4x4),
                                          false);
       }},
      {"swiglu", "out",
       [](const ExecContext& c, Args& a) {
         return SwigluForward(c, a.f32_8x8, a.OnGpu(a.f32_8x4));
       }},
      {"swiglu backward", "d_out",
       [](const ExecContext& c, Args& a) {
         return SwigluBackward(c, a.f32_8x8, a.OnGpu(a.f32_8x4), a.f32_8x8);
       }},
      {"router", "logits",
       [moe](const ExecContext& c, Args& a) {
         RouterOutput out;
         return RouterForward(c, moe, {a.OnGpu(a.f32_8x4), {}, 0}, &out);
       }},
      {"router aux loss", "losses",
       [moe](const ExecContext& c, Args& a) {
         RouterOutput out;
         const RouterArgs args = {a.f32_8x4, {}, 0};
         absl::Status status = RouterForward(c, moe, args, &out);
         if (!status.ok()) return status;
         // The forward's losses as a tensor of the GPU.
         absl::StatusOr<Tensor> losses = Tensor::Allocate(a.gpu_allocator, DType::kF32, {2});
         if (!losses.ok()) return losses.status();
         out.losses = *std::move(losses);
         return RouterAuxLoss(c, moe, args, &out);
       }},
      {"router backward", "d_logits",
       [moe](const ExecContext& c, Args& a) {
         RouterOutput out;
         const RouterArgs args = {a.f32_8x4, {}, 0};
         absl::Status status = RouterForward(c, moe, args, &out);
         if (!status.ok()) return status;
         return RouterBackward(c, moe, args, out, a.f32_8x2, a.OnGpu(a.f32_8x4));
       }},
      {"expert bias update", "bias",
       [](const ExecContext& c, Args& a) {
         Tensor counts = Tensor::Zeros(DType::kI64, {4});
         return UpdateExpertBias(c, counts, 0.1f, a.OnGpu(a.f32_4));
       }},
      {"permutation", "topk_experts",
       [moe](const ExecContext& c, Args& a) {
         Permutation out;
         return BuildPermutation(
             c, moe, {.topk_experts = a.OnGpu(a.i32_8x2), .topk_weights = a.f32_8x2}, &out);
       }},
      {"gather", "index",
       [](const ExecContext& c, Args& a) {
         return GatherRows(c, a.f32_8x4, a.OnGpu(a.i32_8), a.f32_8x4);
       }},
      {"combine", "extra",
       [](const ExecContext& c, Args& a) {
         return CombineRows(c, a.f32_8x4, a.i32_8x2, a.f32_8x2, a.OnGpu(a.f32_8x4), a.f32_8x4);
       }},
      {"combine backward", "d_weights",
       [](const ExecContext& c, Args& a) {
         return CombineRowsBackward(c, a.f32_8x4, a.f32_8x4, a.i32_8x2, a.f32_8x2, a.f32_8x4,
                                    a.OnGpu(a.f32_8x2));
       }},
      {"sum rows", "addend",
       [](const ExecContext& c, Args& a) {
         const TensorView addends[] = {a.OnGpu(a.f32_8x4)};
         return SumPairRows(c, a.f32_8x4, a.i32_8x2, addends, a.f32_8x4);
       }},
      {"rms_norm", "weight",
       [](const ExecContext& c, Args& a) {
         return RmsNormForward(c, a.f32_8x4, a.OnGpu(a.f32_4), 1e-6f, a.f32_8x4, a.f32_8);
       }},
      {"rms_norm backward", "d_x",
       [](const ExecContext& c, Args& a) {
         return RmsNormBackward(c, {.x = a.f32_8x4,
                                    .weight = a.f32_4,
                                    .rstd = a.f32_8,
                                    .d_out = a.f32_8x4,
                                    .d_x = a.OnGpu(a.f32_8x4),
                                    .d_weight = a.f32_4});
       }},
      {"split tokens", "windows",
       [](const ExecContext& c, Args& a) {
         return SplitTokens(c, a.OnGpu(a.i32_2x5), 16, a.i32_8, a.i32_8);
       }},
      {"embedding", "table",
       [](const ExecContext& c, Args& a) {
         return EmbeddingForward(c, a.OnGpu(a.f32_8x4), a.i32_8, a.f32_8x4);
       }},
      {"embedding backward", "d_table",
       [](const ExecContext& c, Args& a) {
         return EmbeddingBackward(c, a.i32_8, a.f32_8x4, a.OnGpu(a.f32_8x4));
       }},
      {"lm_head", "weight",
       [](const ExecContext& c, Args& a) {
         return LmHeadLossForward(
                    c, {.hidden = a.f32_8x4, .weight = a.OnGpu(a.f32_8x4), .targets = a.i32_8},
                    nullptr)
             .status();
       }},
      {"rope", "x",
       [shape](const ExecContext& c, Args& a) {
         return ApplyRope(c, shape, 10000.0f, false, a.OnGpu(a.f32_8x4));
       }},
      {"attention", "v",
       [shape](const ExecContext& c, Args& a) {
         return CausalAttentionForward(c, shape, a.f32_8x4, a.f32_8x4, a.OnGpu(a.f32_8x4),
                                       a.f32_8x4, a.lse);
       }},
      {"attention backward", "d_q",
       [shape](const ExecContext& c, Args& a) {
         return CausalAttentionBackward(c, shape, a.f32_8x4, a.f32_8x4, a.f32_8x4, a.f32_8x4, a.lse,
                                        a.f32_8x4, a.OnGpu(a.f32_8x4), a.f32_8x4, a.f32_8x4);
       }},
      {"convert", "dst",
       [](const ExecContext& c, Args& a) {
         return ConvertTensor(c, a.f32_8x4, a.OnGpu(a.f32_8x4));
       }},
      {"add", "b",
       [](const ExecContext& c, Args& a) {
         return Add(c, a.f32_8x4, a.OnGpu(a.f32_8x4), a.f32_8x4);
       }},
      {"fill", "t", [](const ExecContext& c, Args& a) { return Fill(c, a.OnGpu(a.f32_8), 0.0f); }},
      {"fill normal", "t",
       [](const ExecContext& c, Args& a) {
         return FillNormal(c, a.OnGpu(a.f32_8), Rng(1, 0, 0, 0), 0.0f, 1.0f);
       }},
      {"squared norm", "tensors[1]",
       [](const ExecContext& c, Args& a) {
         const TensorView tensors[] = {a.f32_8, a.OnGpu(a.f32_8)};
         return SquaredNorm(c, tensors).status();
       }},
      {"scale", "tensors[0]",
       [](const ExecContext& c, Args& a) {
         const TensorView tensors[] = {a.OnGpu(a.f32_8)};
         return ScaleTensors(c, tensors, 0.5f);
       }},
      {"all finite", "tensors[0]",
       [](const ExecContext& c, Args& a) {
         const TensorView tensors[] = {a.OnGpu(a.f32_8)};
         return AllFinite(c, tensors).status();
       }},
      {"adamw state", "w.exp_avg_sq",
       [](const ExecContext& c, Args& a) {
         return CheckAdamWMoments(c, "w.exp_avg", a.f32_8, "w.exp_avg_sq", a.OnGpu(a.f32_8));
       }},
      {"adamw", "exp_avg_sq[0]",
       [](const ExecContext& c, Args& a) {
         const TensorView p[] = {a.f32_8}, g[] = {a.f32_8}, m[] = {a.f32_8};
         const TensorView v[] = {a.OnGpu(a.f32_8)};
         const std::vector<bool> decay = {true};
         return AdamWStep(c, {.params = p,
                              .grads = g,
                              .exp_avg = m,
                              .exp_avg_sq = v,
                              .weight_decay = &decay,
                              .decaying = {},
                              .plain = {}});
       }},
  };
}

TEST(OpDeviceChecksTest, EveryOpNamesTheArgumentOnAnotherDevice) {
  const ExecContext cpu = ExecContext::Cpu();
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.op);
    Args args;
    const absl::Status status = c.call(cpu, args);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(std::string(status.message()),
              c.op + ": " + c.name + " is on cuda:0, but the op runs on cpu (copy it there with " +
                  "ops::CopyTensor)");
  }
}

// CopyTensor is the one op whose tensors may sit on two devices, the CPU and its context's; a
// device that is neither is named, and a copy to or from a device no backend serves is refused.
TEST(OpDeviceChecksTest, CopyTensorCrossesOnlyBetweenTheHostAndItsDevice) {
  const ExecContext cpu = ExecContext::Cpu();
  Args args;
  const absl::Status status = CopyTensor(cpu, args.OnGpu(args.f32_8), args.f32_8);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(std::string(status.message()),
            "copy: src is on cuda:0, neither the CPU nor the op's device cpu");
  Tensor host = Tensor::Zeros(DType::kF32, {8});
  EXPECT_TRUE(CopyTensor(cpu, args.f32_8, host).ok());
}

}  // namespace
}  // namespace moetrain::ops
