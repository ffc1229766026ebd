#include "engine/ops/loss/lm_head_loss_cpu.h"

#include "absl/strings/str_cat.h"
#include "engine/backend/cpu/rows.h"
#include "engine/ops/embedding/embedding_cpu.h"
#include "engine/ops/loss/cross_entropy_math.h"

namespace moetrain::cpu {

absl::Status CheckTargets(TensorView targets, int64_t vocab) {
  return CheckTokenIds(targets, vocab, "targets");
}

void CrossEntropyRows(const ExecContext& ctx, TensorView z, TensorView targets,
                      TensorView token_loss, TensorView d_logits, float scale) {
  const int64_t rows = z.dim(0), v = z.dim(1);
  ctx.thread_pool().ParallelFor(rows, RowGrain(v), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = z.data<float>() + r * v;
      const int32_t target = targets.data<int32_t>()[r];
      float exp_sum;
      token_loss.data<float>()[r] = CrossEntropyRow(row, v, target, &exp_sum);
      if (d_logits.empty()) continue;
      float* d = WriteRow(d_logits, r, v, 0);
      CrossEntropyGrad(row, v, target, exp_sum, scale, d);
      FinishRow(d_logits, r, v, d);
    }
  });
}

double SumInOrder(TensorView token_loss) {
  double total = 0.0;
  for (int64_t r = 0; r < token_loss.numel(); ++r) total += token_loss.data<float>()[r];
  return total;
}

}  // namespace moetrain::cpu
