// The job spec the CLI and service tests train: a 2-layer MoE model on a synthetic source, whose
// steps take about a millisecond on one thread. The knobs the tests vary are fields; the rest is
// fixed so that results are comparable across runs.
#ifndef MOETRAIN_TESTS_INTEGRATION_TINY_SPEC_H_
#define MOETRAIN_TESTS_INTEGRATION_TINY_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace moetrain::testutil {

// The model's dimensions, shared by the specs below: `model:` and its lines up to the MoE section.
inline constexpr char kTinyModelDims[] = R"(model:
  vocab_size: 64
  hidden_size: 32
  num_layers: 2
  num_heads: 2
  num_kv_heads: 1
  ffn_dim: 48
  first_dense_layers: 1
)";

struct TinySpec {
  std::string name = "tiny";
  int64_t steps = 40;
  int64_t log_every = 1;
  int64_t eval_every = 10;  // 0 = never
  int64_t checkpoint_every = 10;
  int64_t keep_last = 3;
  int64_t workers = 1;
  int64_t expert_parallel = 1;  // workers / expert_parallel data-parallel replicas
  int64_t max_restarts = 3;
  std::string top_k_line = "top_k: 2";  // replaced to make bad specs
  // More lines of the train: section, each indented two spaces and ending in a newline (say
  // "  precision: FP8\n").
  std::string train_extra;
  // More lines of the checkpoint: section, likewise ("  init_from: /x/step-00000040\n").
  std::string checkpoint_extra;

  std::string Yaml() const {
    return absl::StrCat("name: ", name, "\n", kTinyModelDims, R"(  rope_theta: 5000
  rms_norm_eps: 1e-5
  moe:
    num_experts: 4
    )",
                        top_k_line, R"(
    expert_ffn_dim: 24
    routed_scaling_factor: 1.5
data:
  format: SYNTHETIC
  synthetic_vocab_size: 32
  seed: 3
train:
  steps: )",
                        steps, R"(
  batch_size: 4
  seq_len: 32
  optimizer:
    lr: 3e-3
    warmup_steps: 2
  seed: 1
  log_every: )",
                        log_every, R"(
  eval_every: )",
                        eval_every, R"(
  eval_batches: 2
)",
                        train_extra, R"(checkpoint:
  every_steps: )",
                        checkpoint_every, R"(
  keep_last: )",
                        keep_last, "\n", checkpoint_extra, R"(resources:
  workers: )",
                        workers, R"(
parallel:
  expert_parallel: )",
                        expert_parallel, R"(
restart:
  max_restarts: )",
                        max_restarts, "\n");
  }
};

// A spec to plan rather than train: a 2-layer MoE model (8 experts of width 24), `batch_size`
// sequences of 32 tokens, and `resources` (lines indented two spaces, then any later sections)
// after "resources:". The tests of the device-memory plan and its admission share it, so that
// their figures are of one model.
inline std::string PlannedSpecYaml(const std::string& name, int64_t batch_size,
                                   const std::string& resources) {
  return absl::StrCat("name: ", name, "\n", kTinyModelDims, R"(  moe:
    num_experts: 8
    top_k: 2
    expert_ffn_dim: 24
data:
  format: SYNTHETIC
train:
  steps: 10
  batch_size: )",
                      batch_size, R"(
  seq_len: 32
resources:
)",
                      resources);
}

}  // namespace moetrain::testutil

#endif  // MOETRAIN_TESTS_INTEGRATION_TINY_SPEC_H_
