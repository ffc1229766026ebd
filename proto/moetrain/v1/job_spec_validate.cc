// Validation of a job spec (job_spec.h): every range check names the field the user wrote, with
// its value and the bound. The spec checked is the one ApplyDefaults (job_spec_defaults.cc)
// completes.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "moetrain/v1/job_spec.h"
#include "moetrain/v1/job_spec_internal.h"

namespace moetrain {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using job_spec_internal::EnumNames;
using job_spec_internal::FloatText;
using job_spec_internal::Join;
using job_spec_internal::kMaxDevicesPerWorker;
using job_spec_internal::kMaxWorkers;
using job_spec_internal::Quoted;

// train.fp8's bounds: Fp8RecipeConfig::Validate's (engine/fp8/fp8_recipe.h, which says why).
constexpr int64_t kMaxAmaxHistoryLen = 4096;
constexpr int64_t kMaxFp8Margin = 8;
constexpr float kMaxAmaxEpsilon = 1.0f;
// The largest vocabulary of data.format = SYNTHETIC (kMaxVocabSize of engine/train/synthetic.cc,
// which this library does not link), and the smallest.
constexpr int64_t kMaxSyntheticVocabSize = int64_t{1} << 20;
constexpr int64_t kMinSyntheticVocabSize = 2;
// The deepest multi-token prediction (DeepSeek-V3 trains with 1).
constexpr int64_t kMaxMtpDepth = 8;

std::string Show(int64_t value) { return absl::StrCat(value); }
std::string Show(float value) { return FloatText(value); }
std::string Show(const std::string& value) { return Quoted(value, "\""); }
std::string Show(bool value) { return value ? "true" : "false"; }

template <typename T>
absl::Status Invalid(absl::string_view path, const T& value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(path, " = ", Show(value), " ", why));
}

absl::Status AtLeast(absl::string_view path, int64_t value, int64_t min) {
  if (value >= min) return absl::OkStatus();
  if (min == 0) return Invalid(path, value, "must not be negative");
  return Invalid(path, value, absl::StrCat("must be at least ", min));
}

absl::Status AtMost(absl::string_view path, int64_t value, int64_t max) {
  if (value <= max) return absl::OkStatus();
  return Invalid(path, value, absl::StrCat("must be at most ", max));
}

absl::Status Positive(absl::string_view path, float value) {
  if (value > 0.0f && std::isfinite(value)) return absl::OkStatus();
  return Invalid(path, value, "must be positive and finite");
}

absl::Status NonNegative(absl::string_view path, float value) {
  if (value >= 0.0f && std::isfinite(value)) return absl::OkStatus();
  return Invalid(path, value, "must be non-negative and finite");
}

// [0, 1): Adam betas, the eval fraction.
absl::Status Fraction(absl::string_view path, float value) {
  if (value >= 0.0f && value < 1.0f) return absl::OkStatus();
  return Invalid(path, value, "must be in [0, 1)");
}

#define MOETRAIN_RETURN_IF_INVALID(expr)                              \
  do {                                                                \
    if (absl::Status _status = (expr); !_status.ok()) return _status; \
  } while (false)

// A message built in code (not parsed) can carry enum numbers no value has.
absl::Status ValidateEnums(const Message& message, const std::string& path) {
  const Descriptor* descriptor = message.GetDescriptor();
  const Reflection* reflection = message.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated()) continue;  // none in the spec
    const std::string field_path = Join(path, field->name());
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
      const int number = reflection->GetEnumValue(message, field);
      if (field->enum_type()->FindValueByNumber(number) == nullptr) {
        return Invalid(field_path, int64_t{number},
                       absl::StrCat("is not one of ", EnumNames(field->enum_type())));
      }
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      MOETRAIN_RETURN_IF_INVALID(ValidateEnums(reflection->GetMessage(message, field), field_path));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateName(const std::string& name) {
  constexpr size_t kMaxNameLength = 128;
  if (name.empty()) {
    return absl::InvalidArgumentError(
        "name is required: 1 to 128 characters from [A-Za-z0-9._-], starting with a letter or "
        "digit");
  }
  const bool allowed_chars = std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
  });
  if (name.size() > kMaxNameLength || !allowed_chars || !absl::ascii_isalnum(name[0])) {
    return Invalid("name", name,
                   "must be 1 to 128 characters from [A-Za-z0-9._-], starting with a letter or "
                   "digit");
  }
  return absl::OkStatus();
}

absl::Status ValidateMoe(const v1::MoeConfig& moe) {
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.moe.num_experts", moe.num_experts(), 1));
  // Chosen experts travel as int32 in the engine.
  MOETRAIN_RETURN_IF_INVALID(AtMost("model.moe.num_experts", moe.num_experts(), kInt32Max));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.moe.top_k", moe.top_k(), 1));
  if (moe.top_k() > moe.num_experts()) {
    return Invalid("model.moe.top_k", moe.top_k(),
                   absl::StrCat("exceeds model.moe.num_experts = ", moe.num_experts()));
  }
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.moe.expert_ffn_dim", moe.expert_ffn_dim(), 1));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.moe.num_shared_experts", moe.num_shared_experts(), 0));
  MOETRAIN_RETURN_IF_INVALID(
      Positive("model.moe.routed_scaling_factor", moe.routed_scaling_factor()));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.moe.num_groups", moe.num_groups(), 1));
  if (moe.num_experts() % moe.num_groups() != 0) {
    return Invalid("model.moe.num_groups", moe.num_groups(),
                   absl::StrCat("does not divide model.moe.num_experts = ", moe.num_experts()));
  }
  if (moe.group_top_k() < 1 || moe.group_top_k() > moe.num_groups()) {
    return Invalid("model.moe.group_top_k", moe.group_top_k(),
                   absl::StrCat("must be in [1, model.moe.num_groups = ", moe.num_groups(), "]"));
  }
  const int64_t experts_per_group = moe.num_experts() / moe.num_groups();
  if (moe.num_groups() > 1 && moe.top_k() > moe.group_top_k() * experts_per_group) {
    return Invalid("model.moe.top_k", moe.top_k(),
                   absl::StrCat("exceeds the ", moe.group_top_k() * experts_per_group,
                                " experts of model.moe.group_top_k = ", moe.group_top_k(),
                                " groups of ", experts_per_group));
  }
  MOETRAIN_RETURN_IF_INVALID(
      NonNegative("model.moe.expert_bias_update_rate", moe.expert_bias_update_rate()));
  MOETRAIN_RETURN_IF_INVALID(NonNegative("model.moe.aux_loss_coeff", moe.aux_loss_coeff()));
  // A coefficient with no loss to weigh is a spec that does not say what its author meant.
  if (moe.aux_loss() == v1::MoeConfig::NONE && moe.aux_loss_coeff() != 0.0f) {
    return Invalid("model.moe.aux_loss_coeff", moe.aux_loss_coeff(),
                   "has no effect with model.moe.aux_loss = NONE; set model.moe.aux_loss to "
                   "SWITCH or SEQUENCE");
  }
  MOETRAIN_RETURN_IF_INVALID(NonNegative("model.moe.z_loss_coeff", moe.z_loss_coeff()));
  if (!(moe.capacity_factor() >= 0.0f) || !std::isfinite(moe.capacity_factor())) {
    return Invalid("model.moe.capacity_factor", moe.capacity_factor(),
                   "must be non-negative and finite (0 = dropless)");
  }
  return absl::OkStatus();
}

absl::Status ValidateAttention(const v1::ModelConfig& model, const v1::ModelConfig& written);

// `written` is the model as the user wrote it: a value ApplyDefaults derived is reported by the
// fields it came from.
absl::Status ValidateModel(const v1::ModelConfig& model, const v1::ModelConfig& written) {
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.vocab_size", model.vocab_size(), 1));
  // Tokens are int32 in the engine.
  MOETRAIN_RETURN_IF_INVALID(AtMost("model.vocab_size", model.vocab_size(), kInt32Max));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.hidden_size", model.hidden_size(), 1));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.num_layers", model.num_layers(), 1));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.num_heads", model.num_heads(), 1));
  MOETRAIN_RETURN_IF_INVALID(ValidateAttention(model, written));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.ffn_dim", model.ffn_dim(), 1));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.first_dense_layers", model.first_dense_layers(), 0));
  if (model.first_dense_layers() > model.num_layers()) {
    return Invalid("model.first_dense_layers", model.first_dense_layers(),
                   absl::StrCat("exceeds model.num_layers = ", model.num_layers()));
  }
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.max_seq_len", model.max_seq_len(), 1));
  MOETRAIN_RETURN_IF_INVALID(Positive("model.rope_theta", model.rope_theta()));
  MOETRAIN_RETURN_IF_INVALID(Positive("model.rms_norm_eps", model.rms_norm_eps()));
  MOETRAIN_RETURN_IF_INVALID(Positive("model.init_std", model.init_std()));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.mtp_depth", model.mtp_depth(), 0));
  MOETRAIN_RETURN_IF_INVALID(AtMost("model.mtp_depth", model.mtp_depth(), kMaxMtpDepth));
  if (model.mtp_depth() == 0 && written.has_mtp_loss_weight()) {
    return Invalid("model.mtp_loss_weight", model.mtp_loss_weight(),
                   "has no effect with model.mtp_depth = 0; set model.mtp_depth or remove it");
  }
  if (model.mtp_depth() > 0) {
    MOETRAIN_RETURN_IF_INVALID(NonNegative("model.mtp_loss_weight", model.mtp_loss_weight()));
  }
  return ValidateMoe(model.moe());
}

// Grouped-query attention's num_kv_heads and head_dim, or MLA's fields.
absl::Status ValidateAttention(const v1::ModelConfig& model, const v1::ModelConfig& written) {
  if (model.attention() == v1::ModelConfig::MLA) {
    if (model.num_kv_heads() != model.num_heads()) {
      return Invalid("model.num_kv_heads", model.num_kv_heads(),
                     "applies only to model.attention = GQA (MLA's keys and values have "
                     "model.num_heads heads); remove it");
    }
    if (written.head_dim() != 0) {
      return Invalid("model.head_dim", written.head_dim(),
                     "applies only to model.attention = GQA; MLA's widths are model.mla.*");
    }
    const v1::MlaConfig& m = model.mla();
    MOETRAIN_RETURN_IF_INVALID(AtLeast("model.mla.q_lora_rank", m.q_lora_rank(), 0));
    MOETRAIN_RETURN_IF_INVALID(AtLeast("model.mla.kv_lora_rank", m.kv_lora_rank(), 1));
    MOETRAIN_RETURN_IF_INVALID(AtLeast("model.mla.qk_nope_head_dim", m.qk_nope_head_dim(), 0));
    if (m.qk_nope_head_dim() % 2 != 0) {
      return Invalid("model.mla.qk_nope_head_dim", m.qk_nope_head_dim(),
                     "must be even (the attention core takes an even head width)");
    }
    if (m.qk_rope_head_dim() < 2 || m.qk_rope_head_dim() % 2 != 0) {
      return Invalid("model.mla.qk_rope_head_dim", m.qk_rope_head_dim(),
                     "must be even and at least 2 (RoPE rotates pairs of features)");
    }
    const int64_t qk = m.qk_nope_head_dim() + m.qk_rope_head_dim();
    if (m.v_head_dim() < 1 || m.v_head_dim() > qk) {
      return Invalid("model.mla.v_head_dim", m.v_head_dim(),
                     absl::StrCat("must be in [1, model.mla.qk_nope_head_dim + "
                                  "model.mla.qk_rope_head_dim = ",
                                  qk, "]"));
    }
    return absl::OkStatus();
  }
  if (model.has_mla()) {
    return absl::InvalidArgumentError(
        "model.mla is set but model.attention = GQA; set model.attention: MLA or remove model.mla");
  }
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.num_kv_heads", model.num_kv_heads(), 1));
  if (model.num_heads() % model.num_kv_heads() != 0) {
    return Invalid("model.num_kv_heads", model.num_kv_heads(),
                   absl::StrCat("does not divide model.num_heads = ", model.num_heads()));
  }
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.head_dim", model.head_dim(), 0));
  // ApplyDefaults leaves head_dim 0 only when hidden_size / num_heads is not whole.
  if (model.head_dim() == 0) {
    return Invalid("model.hidden_size", model.hidden_size(),
                   absl::StrCat("is not a multiple of model.num_heads = ", model.num_heads(),
                                "; set model.head_dim"));
  }
  if (model.head_dim() % 2 != 0 && written.head_dim() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.hidden_size = ", model.hidden_size(), " / model.num_heads = ", model.num_heads(),
        " gives model.head_dim = ", model.head_dim(),
        ", which must be even (RoPE rotates pairs of dimensions); set model.head_dim"));
  }
  if (model.head_dim() % 2 != 0) {
    return Invalid("model.head_dim", model.head_dim(),
                   "must be even (RoPE rotates pairs of dimensions)");
  }
  return absl::OkStatus();
}

// data.synthetic_vocab_size when ApplyDefaults derived it from model.vocab_size: reported as
// model.vocab_size, the field the user wrote (or left to its default).
absl::Status ValidateDerivedSyntheticVocab(int64_t vocab_size) {
  if (vocab_size < kMinSyntheticVocabSize) {
    return Invalid("model.vocab_size", vocab_size,
                   absl::StrCat("is below ", kMinSyntheticVocabSize,
                                ", the smallest vocabulary data.format = SYNTHETIC generates"));
  }
  if (vocab_size > kMaxSyntheticVocabSize) {
    return Invalid("model.vocab_size", vocab_size,
                   absl::StrCat("exceeds ", kMaxSyntheticVocabSize,
                                ", the largest vocabulary data.format = SYNTHETIC generates; set "
                                "data.synthetic_vocab_size (default: model.vocab_size) to at most ",
                                kMaxSyntheticVocabSize));
  }
  return absl::OkStatus();
}

absl::Status ValidateData(const v1::JobSpec& spec, const v1::JobSpec& written) {
  const v1::DataConfig& data = spec.data();
  const std::string format = v1::DataConfig::Format_Name(data.format());
  if (data.format() == v1::DataConfig::SYNTHETIC) {
    if (!data.path().empty()) {
      return Invalid(
          "data.path", data.path(),
          "is set but data.format = SYNTHETIC; set data.format to LLMC, U16, U32 or TEXT");
    }
    if (written.data().synthetic_vocab_size() == 0) {
      MOETRAIN_RETURN_IF_INVALID(ValidateDerivedSyntheticVocab(data.synthetic_vocab_size()));
    }
    MOETRAIN_RETURN_IF_INVALID(
        AtLeast("data.synthetic_vocab_size", data.synthetic_vocab_size(), kMinSyntheticVocabSize));
    if (data.synthetic_vocab_size() > kMaxSyntheticVocabSize) {
      return Invalid("data.synthetic_vocab_size", data.synthetic_vocab_size(),
                     absl::StrCat("must be at most ", kMaxSyntheticVocabSize,
                                  " (the synthetic source's largest vocabulary)"));
    }
    if (data.synthetic_vocab_size() > spec.model().vocab_size()) {
      return Invalid("data.synthetic_vocab_size", data.synthetic_vocab_size(),
                     absl::StrCat("exceeds model.vocab_size = ", spec.model().vocab_size()));
    }
  } else {
    if (data.path().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.path is required with data.format = ", format));
    }
    if (data.synthetic_vocab_size() != 0) {
      return Invalid("data.synthetic_vocab_size", data.synthetic_vocab_size(),
                     absl::StrCat("applies only to data.format = SYNTHETIC, not ", format));
    }
  }
  constexpr int64_t kByteVocabSize = 256;
  if (data.format() == v1::DataConfig::TEXT && spec.model().vocab_size() < kByteVocabSize) {
    return Invalid("model.vocab_size", spec.model().vocab_size(),
                   "is below 256, the byte vocabulary of data.format = TEXT");
  }
  MOETRAIN_RETURN_IF_INVALID(Fraction("data.eval_fraction", data.eval_fraction()));
  if (spec.train().eval_every() > 0 && data.format() != v1::DataConfig::SYNTHETIC &&
      data.eval_fraction() == 0.0f) {
    return Invalid("train.eval_every", spec.train().eval_every(),
                   absl::StrCat("needs held-out data: set data.eval_fraction > 0 (data.format = ",
                                format, ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateResources(const v1::JobSpec& spec) {
  const v1::ResourceConfig& resources = spec.resources();
  MOETRAIN_RETURN_IF_INVALID(AtLeast("resources.workers", resources.workers(), 1));
  MOETRAIN_RETURN_IF_INVALID(AtMost("resources.workers", resources.workers(), kMaxWorkers));
  MOETRAIN_RETURN_IF_INVALID(
      AtLeast("resources.devices_per_worker", resources.devices_per_worker(), 1));
  MOETRAIN_RETURN_IF_INVALID(
      AtMost("resources.devices_per_worker", resources.devices_per_worker(), kMaxDevicesPerWorker));
  MOETRAIN_RETURN_IF_INVALID(
      AtLeast("resources.device_memory_bytes", resources.device_memory_bytes(), 0));
  if (resources.device() == v1::ResourceConfig::CPU && resources.devices_per_worker() != 1) {
    return Invalid("resources.devices_per_worker", resources.devices_per_worker(),
                   "must be 1 with resources.device = CPU (a CPU worker runs one rank)");
  }
  const int64_t ranks = resources.workers() * resources.devices_per_worker();
  const v1::ParallelConfig& parallel = spec.parallel();
  const std::string ranks_are =
      absl::StrCat(ranks, " ranks (resources.workers = ", resources.workers(),
                   " x resources.devices_per_worker = ", resources.devices_per_worker(), ")");
  MOETRAIN_RETURN_IF_INVALID(AtLeast("parallel.expert_parallel", parallel.expert_parallel(), 1));
  if (ranks % parallel.expert_parallel() != 0) {
    return Invalid("parallel.expert_parallel", parallel.expert_parallel(),
                   absl::StrCat("does not divide the job's ", ranks_are));
  }
  if (parallel.data_parallel() * parallel.expert_parallel() != ranks) {
    return Invalid("parallel.data_parallel", parallel.data_parallel(),
                   absl::StrCat("x parallel.expert_parallel = ", parallel.expert_parallel(),
                                " does not equal the job's ", ranks_are));
  }
  MOETRAIN_RETURN_IF_INVALID(AtLeast("parallel.overlap_chunks", parallel.overlap_chunks(), 0));
  MOETRAIN_RETURN_IF_INVALID(AtMost("parallel.overlap_chunks", parallel.overlap_chunks(), 64));
  if (spec.model().moe().num_experts() % parallel.expert_parallel() != 0) {
    return Invalid(
        "parallel.expert_parallel", parallel.expert_parallel(),
        absl::StrCat("does not divide model.moe.num_experts = ", spec.model().moe().num_experts()));
  }
  return absl::OkStatus();
}

// A field of train.fp8 the recipe does not read, set anyway: `path` = `value` is refused rather
// than ignored, since its author expected it to change something.
template <typename T>
absl::Status NotReadByRecipe(absl::string_view path, const T& value, absl::string_view readers,
                             v1::Fp8Recipe::Recipe recipe) {
  return Invalid(
      path, value,
      absl::StrCat("is read only by train.fp8.recipe = ", readers,
                   ", not train.fp8.recipe = ", v1::Fp8Recipe::Recipe_Name(recipe), "; remove it"));
}

// train.fp8, checked whatever train.precision says (the block is read only with FP8, but a bad
// one is a mistake either way). A non-optional field counts as set when it is not its default;
// amax_history_len and power_2_scales have presence, and ApplyDefaults fills them only for the
// recipes that read them, so a resolved spec validates again.
absl::Status ValidateFp8(const v1::Fp8Recipe& fp8) {
  const v1::Fp8Recipe::Recipe recipe = fp8.recipe();
  const bool delayed = recipe == v1::Fp8Recipe::DELAYED;
  const bool per_tensor_or_block =
      recipe == v1::Fp8Recipe::CURRENT || recipe == v1::Fp8Recipe::BLOCKWISE;
  if (delayed) {
    // The bounds of Fp8RecipeConfig::Validate (engine/fp8/fp8_recipe.h says why), so that a spec
    // accepted here is one the trainer runs: the history is a host row per slot on every rank,
    // checkpointed; a margin past 8 can make a scale whose inverse is infinite. The history of
    // the whole model (slots × length) is bounded where the model's slots are known, by
    // TrainerConfig::Validate.
    MOETRAIN_RETURN_IF_INVALID(AtLeast("train.fp8.amax_history_len", fp8.amax_history_len(), 1));
    MOETRAIN_RETURN_IF_INVALID(
        AtMost("train.fp8.amax_history_len", fp8.amax_history_len(), kMaxAmaxHistoryLen));
    MOETRAIN_RETURN_IF_INVALID(AtLeast("train.fp8.margin", fp8.margin(), 0));
    MOETRAIN_RETURN_IF_INVALID(AtMost("train.fp8.margin", fp8.margin(), kMaxFp8Margin));
  } else {
    if (fp8.has_amax_history_len()) {
      return NotReadByRecipe("train.fp8.amax_history_len", fp8.amax_history_len(), "DELAYED",
                             recipe);
    }
    if (fp8.margin() != 0) {
      return NotReadByRecipe("train.fp8.margin", fp8.margin(), "DELAYED", recipe);
    }
    if (fp8.amax_compute_algo() != v1::Fp8Recipe::MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("train.fp8.amax_compute_algo = ",
                       v1::Fp8Recipe::AmaxCompute_Name(fp8.amax_compute_algo()),
                       " is read only by train.fp8.recipe = DELAYED, not train.fp8.recipe = ",
                       v1::Fp8Recipe::Recipe_Name(recipe), "; remove it"));
    }
  }
  if (per_tensor_or_block) {
    // A floor for near-zero amaxes; a larger one would dominate every tensor's own.
    if (!(fp8.amax_epsilon() >= 0.0f && fp8.amax_epsilon() <= kMaxAmaxEpsilon)) {
      return Invalid("train.fp8.amax_epsilon", fp8.amax_epsilon(),
                     absl::StrCat("must be in [0, ", FloatText(kMaxAmaxEpsilon), "]"));
    }
    return absl::OkStatus();
  }
  if (fp8.has_power_2_scales()) {
    if (recipe == v1::Fp8Recipe::MXFP8) {
      return Invalid("train.fp8.power_2_scales", fp8.power_2_scales(),
                     "does not apply to train.fp8.recipe = MXFP8, whose E8M0 scales are always "
                     "powers of two; remove it");
    }
    return NotReadByRecipe("train.fp8.power_2_scales", fp8.power_2_scales(), "CURRENT or BLOCKWISE",
                           recipe);
  }
  // != 0 is also true of NaN, which is refused as well.
  if (fp8.amax_epsilon() != 0.0f) {
    return NotReadByRecipe("train.fp8.amax_epsilon", fp8.amax_epsilon(), "CURRENT or BLOCKWISE",
                           recipe);
  }
  return absl::OkStatus();
}

absl::Status ValidateTrain(const v1::JobSpec& spec) {
  const v1::TrainConfig& train = spec.train();
  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.steps", train.steps(), 1));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.batch_size", train.batch_size(), 1));
  const int64_t ranks = spec.resources().workers() * spec.resources().devices_per_worker();
  if (train.batch_size() % ranks != 0) {
    return Invalid("train.batch_size", train.batch_size(),
                   absl::StrCat("is not a multiple of the job's ", ranks,
                                " ranks (each rank reads its own share of every batch)"));
  }
  const int64_t rank_batch = train.batch_size() / ranks;
  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.micro_batch_size", train.micro_batch_size(), 1));
  if (rank_batch % train.micro_batch_size() != 0) {
    return Invalid(
        "train.micro_batch_size", train.micro_batch_size(),
        absl::StrCat("does not divide the per-rank batch train.batch_size / ranks = ", rank_batch));
  }
  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.seq_len", train.seq_len(), 1));
  if (train.seq_len() > spec.model().max_seq_len()) {
    return Invalid("train.seq_len", train.seq_len(),
                   absl::StrCat("exceeds model.max_seq_len = ", spec.model().max_seq_len()));
  }
  MOETRAIN_RETURN_IF_INVALID(ValidateFp8(train.fp8()));

  const v1::OptimizerConfig& optimizer = train.optimizer();
  MOETRAIN_RETURN_IF_INVALID(Positive("train.optimizer.lr", optimizer.lr()));
  MOETRAIN_RETURN_IF_INVALID(NonNegative("train.optimizer.min_lr", optimizer.min_lr()));
  if (optimizer.min_lr() > optimizer.lr()) {
    return Invalid("train.optimizer.min_lr", optimizer.min_lr(),
                   absl::StrCat("exceeds train.optimizer.lr = ", Show(optimizer.lr())));
  }
  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.optimizer.warmup_steps", optimizer.warmup_steps(), 0));
  if (optimizer.warmup_steps() > train.steps()) {
    return Invalid("train.optimizer.warmup_steps", optimizer.warmup_steps(),
                   absl::StrCat("exceeds train.steps = ", train.steps()));
  }
  MOETRAIN_RETURN_IF_INVALID(Fraction("train.optimizer.beta1", optimizer.beta1()));
  MOETRAIN_RETURN_IF_INVALID(Fraction("train.optimizer.beta2", optimizer.beta2()));
  MOETRAIN_RETURN_IF_INVALID(Positive("train.optimizer.eps", optimizer.eps()));
  MOETRAIN_RETURN_IF_INVALID(NonNegative("train.optimizer.weight_decay", optimizer.weight_decay()));
  MOETRAIN_RETURN_IF_INVALID(NonNegative("train.optimizer.grad_clip", optimizer.grad_clip()));

  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.log_every", train.log_every(), 1));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.eval_every", train.eval_every(), 0));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.eval_batches", train.eval_batches(), 1));
  return absl::OkStatus();
}

// `spec` after ApplyDefaults; `written` before, to name the fields a derived value came from.
absl::Status ValidateEffective(const v1::JobSpec& spec, const v1::JobSpec& written) {
  MOETRAIN_RETURN_IF_INVALID(ValidateEnums(spec, ""));
  MOETRAIN_RETURN_IF_INVALID(ValidateName(spec.name()));
  // model.max_seq_len defaults to train.seq_len, and the model is checked first.
  if (!written.model().has_max_seq_len()) {
    MOETRAIN_RETURN_IF_INVALID(AtLeast("train.seq_len", spec.train().seq_len(), 1));
  }
  MOETRAIN_RETURN_IF_INVALID(ValidateModel(spec.model(), written.model()));
  // Resources and parallelism first: the batch checks divide by data_parallel.
  MOETRAIN_RETURN_IF_INVALID(ValidateResources(spec));
  MOETRAIN_RETURN_IF_INVALID(ValidateTrain(spec));
  MOETRAIN_RETURN_IF_INVALID(ValidateData(spec, written));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("checkpoint.every_steps", spec.checkpoint().every_steps(), 0));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("checkpoint.keep_last", spec.checkpoint().keep_last(), 0));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("restart.max_restarts", spec.restart().max_restarts(), 0));
  return absl::OkStatus();
}

#undef MOETRAIN_RETURN_IF_INVALID

}  // namespace

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  v1::JobSpec effective = spec;
  ApplyDefaults(&effective);
  return ValidateEffective(effective, spec);
}

absl::StatusOr<v1::JobSpec> ResolveJobSpec(v1::JobSpec spec) {
  const v1::JobSpec written = spec;
  ApplyDefaults(&spec);
  if (absl::Status status = ValidateEffective(spec, written); !status.ok()) return status;
  return spec;
}

}  // namespace moetrain
