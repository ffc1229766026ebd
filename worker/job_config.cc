#include "worker/job_config.h"

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/backend/device_query.h"
#include "engine/core/status.h"
#include "engine/fp8/fp8_recipe.h"
#include "moetrain/v1/job_spec.h"
#include "moetrain/v1/trainer_support.h"

namespace moetrain {
namespace {

MoeConfig MoeFromSpec(const v1::MoeConfig& s) {
  MoeConfig m;
  m.num_experts = s.num_experts();
  m.top_k = s.top_k();
  m.expert_ffn_dim = s.expert_ffn_dim();
  m.num_shared_experts = s.num_shared_experts();
  m.score_function = s.score_function() == v1::MoeConfig::SIGMOID ? ScoreFunction::kSigmoid
                                                                  : ScoreFunction::kSoftmax;
  m.softmax_before_topk = s.softmax_before_topk();
  m.normalize_topk_weights = s.normalize_topk_weights();
  m.routed_scaling_factor = s.routed_scaling_factor();
  m.num_groups = s.num_groups();
  m.group_top_k = s.group_top_k();
  m.expert_bias = s.expert_bias();
  m.expert_bias_update_rate = s.expert_bias_update_rate();
  m.aux_loss = s.aux_loss() == v1::MoeConfig::SWITCH     ? AuxLossType::kSwitch
               : s.aux_loss() == v1::MoeConfig::SEQUENCE ? AuxLossType::kSequence
                                                         : AuxLossType::kNone;
  m.aux_loss_coeff = s.aux_loss_coeff();
  m.z_loss_coeff = s.z_loss_coeff();
  m.capacity_factor = s.capacity_factor();
  m.drop_policy =
      s.drop_policy() == v1::MoeConfig::POSITION ? DropPolicy::kPosition : DropPolicy::kProbability;
  return m;
}

Fp8RecipeKind RecipeFromSpec(v1::Fp8Recipe::Recipe recipe) {
  switch (recipe) {
    case v1::Fp8Recipe::CURRENT:
      return Fp8RecipeKind::kCurrent;
    case v1::Fp8Recipe::BLOCKWISE:
      return Fp8RecipeKind::kBlockwise;
    case v1::Fp8Recipe::MXFP8:
      return Fp8RecipeKind::kMxfp8;
    default:
      return Fp8RecipeKind::kDelayed;
  }
}

// `s` as resolved: power_2_scales holds its recipe's default; amax_history_len is set only for
// DELAYED (the other recipes keep the engine's default, which they do not read).
Fp8RecipeConfig Fp8FromSpec(const v1::Fp8Recipe& s) {
  Fp8RecipeConfig f;
  f.recipe = RecipeFromSpec(s.recipe());
  f.hybrid = s.format() == v1::Fp8Recipe::HYBRID;
  if (s.has_amax_history_len()) f.amax_history_len = s.amax_history_len();
  // ValidateJobSpec bounds it to [0, 64].
  f.margin = static_cast<int>(s.margin());
  f.amax_most_recent = s.amax_compute_algo() == v1::Fp8Recipe::MOST_RECENT;
  // MXFP8's E8M0 scales are powers of two by construction; the flag is read by current and
  // blockwise only.
  f.pow2_scales = s.power_2_scales();
  f.amax_epsilon = s.amax_epsilon();
  f.fp8_dispatch = s.fp8_dispatch();
  return f;
}

DataConfig::Format FormatFromSpec(v1::DataConfig::Format f) {
  switch (f) {
    case v1::DataConfig::LLMC:
      return DataConfig::Format::kLlmc;
    case v1::DataConfig::U16:
      return DataConfig::Format::kU16;
    case v1::DataConfig::U32:
      return DataConfig::Format::kU32;
    case v1::DataConfig::TEXT:
      return DataConfig::Format::kText;
    default:
      return DataConfig::Format::kSynthetic;
  }
}

}  // namespace

absl::Status CheckUsableGpu(const DeviceReport& report) {
  if (!report.gpus.empty()) return absl::OkStatus();
  // UNAVAILABLE: the job is fine, this machine is not (another worker's GPUs may run it). Only a
  // worker whose GPUs vanished after it started sees this: one without any GPU cannot offer CUDA.
  return absl::UnavailableError(
      absl::StrCat("resources.device = CUDA: no usable GPU on this machine (",
                   report.no_gpu_reason.empty() ? "no reason given" : report.no_gpu_reason, ")"));
}

namespace {

// Where the converted config trains: the spec's device, or the CPU for a plan.
enum class ConfigDevice { kSpecs, kCpu };

absl::StatusOr<TrainerConfig> ConvertSpec(const v1::JobSpec& raw_spec,
                                          const std::string& checkpoint_dir, int cuda_device,
                                          ConfigDevice device) {
  MOETRAIN_ASSIGN_OR_RETURN(v1::JobSpec spec, ResolveJobSpec(raw_spec));
  const v1::ModelConfig& model = spec.model();
  const v1::TrainConfig& train = spec.train();
  MOETRAIN_RETURN_IF_ERROR(v1::CheckTrainerSupports(spec));
  const int64_t ranks = spec.resources().workers() * spec.resources().devices_per_worker();

  TrainerConfig c;
  if (device == ConfigDevice::kSpecs && spec.resources().device() == v1::ResourceConfig::CUDA) {
    // Said here, naming the field, before TrainerConfig::Validate opens the device (whose error
    // would name only "device cuda:0").
    MOETRAIN_RETURN_IF_ERROR(CheckUsableGpu(QueryDevices()));
    c.device = Device::Cuda(cuda_device);
  }
  c.job_id = spec.name();
  c.model.vocab_size = model.vocab_size();
  c.model.hidden_size = model.hidden_size();
  c.model.num_layers = model.num_layers();
  c.model.num_heads = model.num_heads();
  c.model.num_kv_heads = model.num_kv_heads();
  c.model.head_dim = model.head_dim();
  c.model.ffn_dim = model.ffn_dim();
  c.model.first_dense_layers = model.first_dense_layers();
  c.model.max_seq_len = model.max_seq_len();
  c.model.rope_theta = model.rope_theta();
  c.model.rms_norm_eps = model.rms_norm_eps();
  c.model.tie_embeddings = model.tie_embeddings();
  c.model.init_std = model.init_std();
  c.model.moe = MoeFromSpec(model.moe());
  if (model.attention() == v1::ModelConfig::MLA) {
    c.model.attention = AttentionType::kMla;
    c.model.head_dim = 0;
    c.model.mla = {.q_lora_rank = model.mla().q_lora_rank(),
                   .kv_lora_rank = model.mla().kv_lora_rank(),
                   .qk_nope_head_dim = model.mla().qk_nope_head_dim(),
                   .qk_rope_head_dim = model.mla().qk_rope_head_dim(),
                   .v_head_dim = model.mla().v_head_dim()};
  }
  c.model.mtp_depth = model.mtp_depth();
  if (model.has_mtp_loss_weight()) c.model.mtp_loss_weight = model.mtp_loss_weight();

  const v1::DataConfig& data = spec.data();
  c.data.format = FormatFromSpec(data.format());
  c.data.path = data.path();
  c.data.vocab_size = model.vocab_size();
  c.data.seq_len = train.seq_len();
  c.data.batch_size = train.batch_size();
  c.data.seed = data.seed();
  c.data.eval_fraction = data.eval_fraction();
  c.data.synthetic_vocab_size = data.synthetic_vocab_size();

  // FP8 quantises the linear layers' GEMM operands from bf16; everything else computes in bf16.
  c.compute_dtype = train.precision() == v1::TrainConfig::FP32 ? DType::kF32 : DType::kBF16;
  if (train.precision() == v1::TrainConfig::FP8) c.fp8 = Fp8FromSpec(train.fp8());
  switch (train.recompute()) {
    case v1::TrainConfig::FULL:
      c.recompute = Recompute::kFull;
      break;
    case v1::TrainConfig::SELECTIVE:
      c.recompute = Recompute::kSelective;
      break;
    default:
      c.recompute = Recompute::kNone;
  }
  c.steps = train.steps();
  // The spec counts a micro-batch per rank, the trainer over all ranks.
  c.micro_batch_size = train.micro_batch_size() * ranks;
  c.parallel.expert_parallel = static_cast<int>(spec.parallel().expert_parallel());
  c.parallel.data_parallel = static_cast<int>(spec.parallel().data_parallel());
  c.parallel.overlap_chunks = static_cast<int>(spec.parallel().overlap_chunks());
  switch (spec.parallel().sharding()) {
    case v1::ParallelConfig::OPTIMIZER:
      c.parallel.sharding = Sharding::kOptimizer;
      break;
    case v1::ParallelConfig::GRADIENTS:
      c.parallel.sharding = Sharding::kGradients;
      break;
    default:
      c.parallel.sharding = Sharding::kNone;
  }
  c.parallel.grad_reduce_dtype =
      spec.parallel().grad_reduce_dtype() == v1::ParallelConfig::BF16 ? DType::kBF16 : DType::kF32;
  const v1::OptimizerConfig& opt = train.optimizer();
  c.optimizer.beta1 = opt.beta1();
  c.optimizer.beta2 = opt.beta2();
  c.optimizer.eps = opt.eps();
  c.optimizer.weight_decay = opt.weight_decay();
  c.optimizer.moment_dtype =
      opt.moment_dtype() == v1::OptimizerConfig::BF16 ? DType::kBF16 : DType::kF32;
  c.schedule.lr = opt.lr();
  c.schedule.min_lr = opt.min_lr();
  c.schedule.warmup_steps = opt.warmup_steps();
  c.schedule.decay = opt.decay() == v1::OptimizerConfig::LINEAR     ? DecayType::kLinear
                     : opt.decay() == v1::OptimizerConfig::CONSTANT ? DecayType::kConstant
                                                                    : DecayType::kCosine;
  c.schedule.total_steps = train.steps();
  c.grad_clip = opt.grad_clip();
  c.seed = train.seed();
  c.log_every = train.log_every();
  c.eval_every = train.eval_every();
  c.eval_batches = train.eval_batches();
  c.skip_nonfinite_steps = train.skip_nonfinite_steps();
  c.checkpoint_dir = !checkpoint_dir.empty() ? checkpoint_dir : spec.checkpoint().dir();
  c.init_from = spec.checkpoint().init_from();
  c.checkpoint_every = spec.checkpoint().every_steps();
  c.keep_last = static_cast<int>(spec.checkpoint().keep_last());
  MOETRAIN_RETURN_IF_ERROR(c.Validate());
  return c;
}

}  // namespace

absl::StatusOr<TrainerConfig> TrainerConfigFromSpec(const v1::JobSpec& spec,
                                                    const std::string& checkpoint_dir,
                                                    int cuda_device) {
  return ConvertSpec(spec, checkpoint_dir, cuda_device, ConfigDevice::kSpecs);
}

absl::StatusOr<TrainerConfig> TrainerConfigFromSpecOnCpu(const v1::JobSpec& spec) {
  return ConvertSpec(spec, "", 0, ConfigDevice::kCpu);
}

absl::StatusOr<DeviceFlag> ParseDeviceFlag(const std::string& text) {
  DeviceFlag flag;
  if (text == "cpu") return flag;
  flag.device = v1::ResourceConfig::CUDA;
  if (text == "cuda") return flag;
  const std::string prefix = "cuda:";
  if (text.rfind(prefix, 0) != 0 || text.size() == prefix.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--devices = '", text, "' is neither 'cpu', 'cuda' (every GPU) nor 'cuda:I,J,...'"));
  }
  std::set<int> seen;
  for (absl::string_view index : absl::StrSplit(text.substr(prefix.size()), ',')) {
    int value = 0;
    if (!absl::SimpleAtoi(index, &value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--devices = '", text, "': '", index, "' is not a device index"));
    }
    if (!seen.insert(value).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--devices = '", text, "': GPU ", value, " is listed twice"));
    }
    flag.indexes.push_back(value);
  }
  return flag;
}

absl::StatusOr<OfferedDevices> DevicesOffered(const std::string& text, const DeviceFlag& flag,
                                              const DeviceReport& report) {
  OfferedDevices offered;
  if (flag.device != v1::ResourceConfig::CUDA) return offered;
  if (report.gpus.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--devices = '", text, "': no usable GPU on this machine (",
                     report.no_gpu_reason.empty() ? "no reason given" : report.no_gpu_reason, ")"));
  }
  if (!flag.indexes.empty() && report.gpus.size() < flag.indexes.size()) {
    // CUDA shows the listed GPUs up to the first that does not exist: that one is the culprit.
    return absl::FailedPreconditionError(
        absl::StrCat("--devices = '", text, "': GPU ", flag.indexes[report.gpus.size()],
                     " does not exist on this machine or is not usable (CUDA sees only the first ",
                     report.gpus.size(), " of the listed GPUs: ", DescribeDevices(report), ")"));
  }
  offered.device = v1::ResourceConfig::CUDA;
  offered.count = static_cast<int>(flag.indexes.empty() ? report.gpus.size() : flag.indexes.size());
  offered.memory_bytes = report.gpus.front().memory_bytes;
  for (int i = 0; i < offered.count; ++i) {
    offered.memory_bytes = std::min(offered.memory_bytes, report.gpus[i].memory_bytes);
  }
  return offered;
}

}  // namespace moetrain
