// Compiles every per-element math header that the CPU kernels and the CUDA kernels share
// (MOETRAIN_HOST_DEVICE, engine/core/host_device.h) for the device, sm_90a, so that a change
// that breaks their device compilation fails this build at once, before a CUDA kernel of the op
// layer includes them. The kernel is compiled, never launched: it checks the headers, nothing
// else.
#include <cstdint>

#include "engine/core/dtype_math.h"
#include "engine/core/fast_math.h"
#include "engine/core/philox_math.h"
#include "engine/ops/common/softmax_math.h"
#include "engine/ops/loss/cross_entropy_math.h"
#include "engine/ops/norm/rms_norm_math.h"
#include "engine/ops/optim/adamw_math.h"
#include "engine/ops/permute/permute_math.h"
#include "engine/ops/rope/rope_math.h"
#include "engine/ops/router/router_math.h"
#include "engine/ops/swiglu/swiglu_math.h"

namespace moetrain {

__global__ void SharedMathCompilesForTheDevice(float* x, int32_t* chosen, uint8_t* flags,
                                               RoutingParams routing, AdamWScalars adamw) {
  const int i = threadIdx.x;
  float d_gate, d_up;
  x[i] = BF16BitsToFloat(FloatToBF16Bits(x[i]));
  const PhiloxWords words = Philox4x32({{1u, 2u, 3u, static_cast<uint32_t>(i)}}, 7u, 9u);
  x[i] += PhiloxUnit(words.w[0]) + PhiloxNormal(words.w[1], words.w[2]) + FastExp(x[i]);
  x[i] += SwigluForwardValue(x[i], x[i + 1]);
  SwigluBackwardValue(x[i], x[i + 1], x[i + 2], &d_gate, &d_up);
  const float rstd = RmsNormRstd(x[i], 64, 1e-6f);
  x[i] += RmsNormValue(x[i], rstd, d_gate) + RmsNormWeightGradTerm(d_up, x[i], rstd) +
          RmsNormInputGrad(x[i], d_gate, rstd, RmsNormGradScale(d_up, rstd, 64));
  float exp_sum;
  x[i] += static_cast<float>(Softmax(x, 8, x + 8) + LogSumExp(x, 8));
  x[i] += CrossEntropyRow(x + 16, 8, 3, &exp_sum);
  CrossEntropyGrad(x + 16, 8, 3, exp_sum, 0.5f, x + 24);
  float out1, out2;
  RopeRotate(x[i], x[i + 1], static_cast<float>(RopeAngle(i, 1, 64, 10000.0f)), 0.5f, &out1, &out2);
  x[i] += out1 + out2 + Sigmoid(x[i]) + SigmoidGrad(x[i]);
  float m = x[i], v = x[i + 1], p = x[i + 2];
  AdamWUpdateElement(&p, x[i + 3], &m, &v, adamw);
  x[i] += p + AdamWParameter(p, m, sqrtf(v), adamw);
  const TopKScratch scratch = {x + 32, chosen + 16, x + 48, flags};
  SelectTopK(routing, x, scratch, chosen);
  CombineWeights(routing, x, x + 8, chosen, x + 56);
  x[i] = AddWeighted(x[i], x[i + 1], x[i + 2]);
}

}  // namespace moetrain
