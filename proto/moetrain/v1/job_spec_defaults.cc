// ApplyDefaults (job_spec.h): every unset field of a job spec gets its default, and every
// "0 = derived" field the value it stands for. ValidateJobSpec (job_spec_validate.cc) checks the
// result.
#include <cstdint>

#include "moetrain/v1/job_spec.h"
#include "moetrain/v1/job_spec_internal.h"

namespace moetrain {

using job_spec_internal::kMaxDevicesPerWorker;
using job_spec_internal::kMaxWorkers;

void ApplyDefaults(v1::JobSpec* spec) {
  // The model defaults are those of moetrain::ModelConfig and moetrain::MoeConfig.
  v1::ModelConfig& model = *spec->mutable_model();
  if (!model.has_vocab_size()) model.set_vocab_size(256);
  if (!model.has_hidden_size()) model.set_hidden_size(256);
  if (!model.has_num_layers()) model.set_num_layers(4);
  if (!model.has_num_heads()) model.set_num_heads(4);
  if (!model.has_num_kv_heads()) model.set_num_kv_heads(model.num_heads());
  const bool mla = model.attention() == v1::ModelConfig::MLA;
  if (mla) {
    v1::MlaConfig& m = *model.mutable_mla();
    if (!m.has_kv_lora_rank()) m.set_kv_lora_rank(512);
    if (!m.has_qk_nope_head_dim()) m.set_qk_nope_head_dim(128);
    if (!m.has_qk_rope_head_dim()) m.set_qk_rope_head_dim(64);
    if (!m.has_v_head_dim()) m.set_v_head_dim(128);
  }
  if (!model.has_mtp_loss_weight() && model.mtp_depth() > 0) model.set_mtp_loss_weight(0.1f);
  if (!mla && model.head_dim() == 0 && model.num_heads() > 0 &&
      model.hidden_size() % model.num_heads() == 0) {
    model.set_head_dim(model.hidden_size() / model.num_heads());
  }
  if (!model.has_ffn_dim()) model.set_ffn_dim(1024);
  if (!model.has_first_dense_layers()) model.set_first_dense_layers(1);
  if (!model.has_rope_theta()) model.set_rope_theta(10000.0f);
  if (!model.has_rms_norm_eps()) model.set_rms_norm_eps(1e-6f);
  if (!model.has_init_std()) model.set_init_std(0.02f);

  v1::MoeConfig& moe = *model.mutable_moe();
  if (!moe.has_num_experts()) moe.set_num_experts(8);
  if (!moe.has_top_k()) moe.set_top_k(2);
  if (!moe.has_expert_ffn_dim()) moe.set_expert_ffn_dim(1024);
  if (!moe.has_softmax_before_topk()) moe.set_softmax_before_topk(true);
  if (!moe.has_normalize_topk_weights()) moe.set_normalize_topk_weights(true);
  if (!moe.has_routed_scaling_factor()) moe.set_routed_scaling_factor(1.0f);
  if (!moe.has_num_groups()) moe.set_num_groups(1);
  if (!moe.has_group_top_k()) moe.set_group_top_k(1);
  if (!moe.has_expert_bias_update_rate()) moe.set_expert_bias_update_rate(1e-3f);

  // The sequence length: whichever of the two is given sets the other; neither gives 256.
  v1::TrainConfig& train = *spec->mutable_train();
  if (!model.has_max_seq_len()) {
    model.set_max_seq_len(train.has_seq_len() ? train.seq_len() : 256);
  }
  if (!train.has_seq_len()) train.set_seq_len(model.max_seq_len());

  v1::ResourceConfig& resources = *spec->mutable_resources();
  if (!resources.has_workers()) resources.set_workers(1);
  if (!resources.has_devices_per_worker()) resources.set_devices_per_worker(1);

  v1::ParallelConfig& parallel = *spec->mutable_parallel();
  if (!parallel.has_expert_parallel()) parallel.set_expert_parallel(1);
  const bool ranks_computable = resources.workers() >= 1 && resources.workers() <= kMaxWorkers &&
                                resources.devices_per_worker() >= 1 &&
                                resources.devices_per_worker() <= kMaxDevicesPerWorker;
  const int64_t ranks =
      ranks_computable ? resources.workers() * resources.devices_per_worker() : int64_t{0};
  if (parallel.data_parallel() == 0 && ranks > 0 && parallel.expert_parallel() >= 1 &&
      ranks % parallel.expert_parallel() == 0) {
    parallel.set_data_parallel(ranks / parallel.expert_parallel());
  }

  if (!train.has_steps()) train.set_steps(1000);
  if (!train.has_batch_size()) train.set_batch_size(8);
  if (train.micro_batch_size() == 0 && ranks > 0 && train.batch_size() % ranks == 0) {
    train.set_micro_batch_size(train.batch_size() / ranks);
  }
  // Only the recipe's own fields get defaults: the others stay unset, so that ValidateFp8 can
  // tell a field set by hand under a recipe that does not read it.
  v1::Fp8Recipe& fp8 = *train.mutable_fp8();
  if (fp8.recipe() == v1::Fp8Recipe::DELAYED && !fp8.has_amax_history_len()) {
    fp8.set_amax_history_len(1024);
  }
  if (!fp8.has_power_2_scales()) {
    // Transformer Engine's defaults: power-of-two scales for blockwise, exact ones for current.
    if (fp8.recipe() == v1::Fp8Recipe::CURRENT) fp8.set_power_2_scales(false);
    if (fp8.recipe() == v1::Fp8Recipe::BLOCKWISE) fp8.set_power_2_scales(true);
  }
  v1::OptimizerConfig& optimizer = *train.mutable_optimizer();
  if (!optimizer.has_lr()) optimizer.set_lr(3e-4f);
  if (!optimizer.has_beta1()) optimizer.set_beta1(0.9f);
  if (!optimizer.has_beta2()) optimizer.set_beta2(0.95f);
  if (!optimizer.has_eps()) optimizer.set_eps(1e-8f);
  if (!optimizer.has_weight_decay()) optimizer.set_weight_decay(0.1f);
  if (!optimizer.has_grad_clip()) optimizer.set_grad_clip(1.0f);
  if (!train.has_log_every()) train.set_log_every(10);
  if (!train.has_eval_batches()) train.set_eval_batches(8);

  v1::DataConfig& data = *spec->mutable_data();
  if (data.format() == v1::DataConfig::SYNTHETIC && data.synthetic_vocab_size() == 0) {
    data.set_synthetic_vocab_size(model.vocab_size());
  }
  if (!data.has_seed()) data.set_seed(train.seed());

  v1::CheckpointConfig& checkpoint = *spec->mutable_checkpoint();
  if (!checkpoint.has_keep_last()) checkpoint.set_keep_last(3);

  v1::RestartConfig& restart = *spec->mutable_restart();
  if (!restart.has_max_restarts()) restart.set_max_restarts(3);
}

}  // namespace moetrain
