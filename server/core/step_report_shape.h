// The arrays a job's step report may carry, from its spec, and the check of a report against
// them. A genuine worker copies them from the engine's StepReport (worker/rank_runner.cc's
// ReportingObserver): one load per MoE layer and one token count per expert of each
// (engine/train/step_stats.cc), and under FP8 one entry per transformer block with FP8 linears
// and per routed expert (engine/train/fp8_report.cc). Anything else is refused before any of it
// is stored or exported, so that a report cannot grow /metrics or the event log past what the
// model makes. Computed from the spec alone: the coordinator links no engine code.
#ifndef MOETRAIN_SERVER_CORE_STEP_REPORT_SHAPE_H_
#define MOETRAIN_SERVER_CORE_STEP_REPORT_SHAPE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "moetrain/v1/coordinator.pb.h"
#include "moetrain/v1/job.pb.h"

namespace moetrain::server {

struct StepReportShape {
  // model.num_layers + model.mtp_depth: the blocks model.layers.<i>, the MTP modules' last.
  int64_t blocks = 0;
  // model.first_dense_layers: the blocks before it have a dense FFN, the others (the MTP
  // modules' included) an MoE FFN.
  int64_t first_moe_block = 0;
  int64_t num_experts = 0;  // model.moe.num_experts
  bool fp8 = false;         // train.precision FP8

  // Of a stored spec (defaults applied).
  static StepReportShape Of(const v1::JobSpec& spec);
  int64_t moe_layers() const { return blocks - first_moe_block; }
};

// OK when the arrays of `metrics` fit `shape`; else InvalidArgument naming the field, the index
// or length, and the model's figure:
//   expert_load_per_layer  empty, or one entry per MoE layer;
//   expert_tokens          empty, or MoE layers × num_experts entries;
//   fp8_layers             empty unless FP8; layers strictly ascending in [0, blocks), expert 0;
//   fp8_experts            empty unless FP8; (layer, expert) strictly ascending, layer an MoE
//                          block, expert in [0, num_experts).
absl::Status CheckStepReport(const v1::StepMetrics& metrics, const StepReportShape& shape);

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_CORE_STEP_REPORT_SHAPE_H_
