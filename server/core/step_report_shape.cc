// StepReportShape and CheckStepReport (step_report_shape.h).
#include "server/core/step_report_shape.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"

namespace moetrain::server {
namespace {

// `field` has `size` entries where the model makes `expected` (`what`) or none.
absl::Status CheckLength(const char* field, int64_t size, int64_t expected,
                         const std::string& what) {
  if (size == 0 || size == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("metrics.", field, " has ", size,
                                                 " entries; the model has ", what,
                                                 ", so a report has ", expected, " or none"));
}

// The FP8 entries of `field`: `[lowest, blocks)` the blocks they may name, `experts` the experts
// (0: the entries name none, expert 0), in strictly ascending (layer, expert) order.
absl::Status CheckFp8Entries(const char* field,
                             const google::protobuf::RepeatedPtrField<v1::Fp8Stats>& entries,
                             const StepReportShape& shape, int64_t lowest, const char* blocks_are,
                             int64_t experts) {
  if (!shape.fp8 && !entries.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("metrics.", field, " has ", entries.size(),
                                                   " entries, but train.precision is not FP8: a "
                                                   "report of this job has none"));
  }
  std::pair<int64_t, int64_t> previous = {-1, -1};
  for (int i = 0; i < entries.size(); ++i) {
    const v1::Fp8Stats& entry = entries[i];
    const std::string name = absl::StrCat("metrics.", field, "[", i, "]");
    if (entry.layer() < lowest || entry.layer() >= shape.blocks) {
      return absl::InvalidArgumentError(absl::StrCat(name, ".layer = ", entry.layer(),
                                                     " is outside [", lowest, ", ", shape.blocks,
                                                     "), the model's ", blocks_are));
    }
    if (experts == 0 && entry.expert() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, ".expert = ", entry.expert(),
                                                     ": an entry of ", field, " has expert 0"));
    }
    if (experts > 0 && (entry.expert() < 0 || entry.expert() >= experts)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ".expert = ", entry.expert(),
                                                     " is outside [0, ", experts,
                                                     "), model.moe.num_experts = ", experts));
    }
    const std::pair<int64_t, int64_t> key = {entry.layer(), entry.expert()};
    if (key <= previous) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " (layer ", key.first, ", expert ", key.second,
                       ") does not come after entry ", i - 1, " (layer ", previous.first,
                       ", expert ", previous.second, "): entries are strictly ascending"));
    }
    previous = key;
  }
  return absl::OkStatus();
}

}  // namespace

StepReportShape StepReportShape::Of(const v1::JobSpec& spec) {
  const v1::ModelConfig& model = spec.model();
  return {.blocks = model.num_layers() + model.mtp_depth(),
          .first_moe_block = model.first_dense_layers(),
          .num_experts = model.moe().num_experts(),
          .fp8 = spec.train().precision() == v1::TrainConfig::FP8};
}

absl::Status CheckStepReport(const v1::StepMetrics& metrics, const StepReportShape& shape) {
  const int64_t layers = shape.moe_layers();
  const std::string moe_layers = absl::StrCat(
      layers, " MoE layers (model.num_layers + model.mtp_depth - model.first_dense_layers)");
  MOETRAIN_RETURN_IF_ERROR(CheckLength("expert_load_per_layer",
                                       metrics.expert_load_per_layer_size(), layers, moe_layers));
  // MoE layers × experts, compared by division: the product of two spec figures may overflow.
  const int64_t tokens = metrics.expert_tokens_size();
  if (tokens != 0 &&
      (layers <= 0 || tokens % layers != 0 || tokens / layers != shape.num_experts)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics.expert_tokens has ", tokens, " entries; the model has ", moe_layers,
                     " of ", shape.num_experts,
                     " experts (model.moe.num_experts), so a report has one count per "
                     "layer and expert or none"));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckFp8Entries("fp8_layers", metrics.fp8_layers(), shape, 0,
                                           "blocks (model.num_layers + model.mtp_depth)", 0));
  return CheckFp8Entries("fp8_experts", metrics.fp8_experts(), shape, shape.first_moe_block,
                         "MoE blocks (from model.first_dense_layers)", shape.num_experts);
}

}  // namespace moetrain::server
