// Hugging Face model directories: `moetrain export` writes one from a checkpoint step,
// `moetrain import` makes a checkpoint step of one (docs/checkpoints.md).
//
//   <dir>/config.json                        HuggingFaceConfig (hf_config.h); "torch_dtype" the
//                                            shards' dtype
//   <dir>/generation_config.json             {"_from_model_config": true, "max_length": S}
//   <dir>/model-00001-of-00003.safetensors   the parameters under their HF names, in checkpoint
//   …                                        order, bf16 or f32; metadata {"format": "pt"}
//   <dir>/model.safetensors.index.json       {"metadata": {"total_size": data bytes},
//                                             "weight_map": {name: shard file}}
//
// Multi-token prediction: DeepSeek-V3's checkpoints hold, for each MTP layer L + i (L =
// num_layers), copies of the shared embedding and LM head, model.layers.{L+i}.embed_tokens.weight
// and model.layers.{L+i}.shared_head.head.weight. Export writes them (the embedding for the
// head when it is tied); import accepts and ignores them, as they are not parameters here.
#ifndef MOETRAIN_ENGINE_TRAIN_HF_CHECKPOINT_H_
#define MOETRAIN_ENGINE_TRAIN_HF_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/core/dtype.h"
#include "engine/model/model_config.h"

namespace moetrain {

inline constexpr char kHfIndexName[] = "model.safetensors.index.json";
inline constexpr char kHfSingleFileName[] = "model.safetensors";

// "model-00002-of-00005.safetensors" (shard 2 of 5; shards count from 1).
std::string HfShardFileName(int shard, int num_shards);

struct HfExportOptions {
  // kBF16 (rounded to nearest even, as torch's .to(torch.bfloat16)) or kF32 (the f32 masters
  // exactly).
  DType dtype = DType::kBF16;
  // A shard holds tensors until the next would take it past this many data bytes; a larger
  // tensor gets a shard of its own. Hugging Face's default max_shard_size, "5GB".
  int64_t shard_bytes = 5'000'000'000;
  // Export a model whose only difference from Hugging Face's DeepSeek-V3 is the group scoring
  // (top_k / group_top_k ≠ 2) anyway, naming DeepseekV3ForCausalLM.
  bool force = false;
};

struct HfExportReport {
  std::string out_dir;
  std::string architecture;  // what config.json names
  int64_t num_tensors = 0;   // written, MTP copies included
  int num_shards = 0;
  int64_t total_bytes = 0;  // tensor data, as the index's total_size
  // For the user: which Hugging Face class would compute another function, and why.
  std::vector<std::string> notes;
};

// Writes the model of the checkpoint step `step_dir` (every rank's model file, verified as
// LoadCheckpoint does) as a Hugging Face directory `out_dir`. Everything is written into a
// temporary directory beside `out_dir`, fsynced and renamed into place: a failure leaves nothing
// half-written. An `out_dir` that is a symbolic link is resolved first (before anything is read):
// the files go into the directory it leads to, and the link stays. Errors: NotFound (no step),
// DataLoss (a damaged step, a tensor missing or unexpected, of the wrong dtype or shape),
// FailedPrecondition (a step without "model_config"; group scoring that Hugging Face's DeepSeek-V3
// code does not do, without options.force), AlreadyExists (`out_dir` exists and is not empty),
// InvalidArgument (bad options, or `out_dir` a link to nothing). Memory: the tensors of the step,
// once, plus one shard in bf16 (and, while the tensors are checked, a model of the same shape:
// Transformer::Create gives the parameter table).
absl::StatusOr<HfExportReport> ExportHuggingFace(const std::string& step_dir,
                                                 const std::string& out_dir,
                                                 const HfExportOptions& options = {});

struct HfImportOptions {
  // The memory the import may use (bytes; 0 = unchecked): the model's f32 weights and their
  // gradient buffer, plus the largest weight file, are refused above it before either is read.
  int64_t memory_limit_bytes = 0;
  // What the limit is, for the refusal: "--memory-limit", "this machine's memory".
  std::string memory_limit_name;
};

struct HfImportReport {
  std::string step_dir;      // the checkpoint step written
  std::string architecture;  // the input's config.json "architectures"[0]
  ModelConfig config;
  int64_t seq_len = 0;          // max_position_embeddings
  int64_t num_tensors = 0;      // parameters read
  int64_t ignored_tensors = 0;  // MTP copies of the embedding and head
};

// Reads the Hugging Face directory `in_dir` (config.json, then model.safetensors.index.json and
// its shards, or a single model.safetensors; tensors in bf16, widened exactly, or f32) and writes
// it as step 0 of the checkpoint root `out_root` (`<dir>/<job id>`, WriteCheckpoint): the
// parameters, a manifest with "model_config" and a one-rank "world_layout", and config.json, so
// that `moetrain eval` and `moetrain export` take it. Every file is read only if it is a regular
// file of `in_dir` itself (no symbolic link, FIFO or device); config.json is read only up to
// 1 MiB and the index up to 16 MiB. Errors: NotFound (no config.json or no weights),
// InvalidArgument naming the key, tensor and file (an unsupported config.json, or a value that is
// not an exact integer in range where one is due; a tensor missing, of the wrong shape or an
// unsupported dtype, or holding NaN or Inf; a tensor that is no parameter, such as a quantization
// scale; an index that disagrees with its shards; a file that is no regular file, or too large),
// ResourceExhausted (the memory over options.memory_limit_bytes, both figures named),
// AlreadyExists (step 0 is there).
absl::StatusOr<HfImportReport> ImportHuggingFace(const std::string& in_dir,
                                                 const std::string& out_root,
                                                 const HfImportOptions& options = {});

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_HF_CHECKPOINT_H_
