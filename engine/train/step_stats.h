// What one optimizer step's micro-batches add up to on a rank, then over the ranks: the losses,
// the tokens, and every MoE layer's tokens per expert. The trainer's bookkeeping, kept out of
// the step itself.
#ifndef MOETRAIN_ENGINE_TRAIN_STEP_STATS_H_
#define MOETRAIN_ENGINE_TRAIN_STEP_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/comm/communicator.h"
#include "engine/model/transformer.h"

namespace moetrain {

struct StepReport;

class StepStats {
 public:
  // `mtp`: the model has multi-token prediction, whose loss the report then carries.
  StepStats(int64_t moe_layers, int64_t num_experts, bool mtp = false);

  // One micro-batch's result.
  void Add(const StepResult& result);
  // A micro-batch whose activations went NaN or Inf: the step is non-finite, `detail` says where.
  void AddNonFinite(std::string detail);

  // Sums every number over the ranks of `world` (the same bits on every rank).
  absl::Status SumOverRanks(Communicator* world);

  // The losses, each the mean over `shares` micro-batch shares (micro-batches × ranks).
  double loss(int64_t shares) const { return losses_[0] / shares; }
  double aux_loss(int64_t shares) const { return losses_[1] / shares; }
  double z_loss(int64_t shares) const { return losses_[2] / shares; }
  double mtp_loss(int64_t shares) const { return losses_[3] / shares; }
  bool finite_losses() const;
  const std::string& non_finite_detail() const { return non_finite_detail_; }
  int64_t tokens() const { return counts_[0]; }
  // Tokens routed to each expert of MoE layer `layer` (E), before capacity drops.
  std::vector<int64_t> tokens_per_expert(int64_t layer) const;

  // Writes the losses, dropped tokens and the expert load of the report.
  void Report(int64_t shares, StepReport* report) const;

 private:
  int64_t moe_layers_, num_experts_;
  bool mtp_;
  double losses_[4] = {0, 0, 0, 0};  // cross-entropy, aux, z, MTP cross-entropy
  // [tokens, dropped tokens, tokens per expert (MoE layers × E)]
  std::vector<int64_t> counts_;
  std::string non_finite_detail_;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_STEP_STATS_H_
