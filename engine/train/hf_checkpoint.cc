#include "engine/train/hf_checkpoint.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/backend/exec_context.h"
#include "engine/core/json.h"
#include "engine/core/status.h"
#include "engine/model/transformer.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/optim/optim.h"
#include "engine/train/checkpoint.h"
#include "engine/train/hf_config.h"
#include "engine/train/input_file.h"
#include "engine/train/memory_estimate.h"
#include "engine/train/model_config_json.h"
#include "engine/train/safetensors.h"

namespace moetrain {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr char kConfigName[] = "config.json";
constexpr char kGenerationConfigName[] = "generation_config.json";
// "pt" is the format tag Hugging Face transformers expects when it loads the weights.
const std::map<std::string, std::string> kShardMetadata = {{"format", "pt"}};
// How many offending tensor names an error lists before "and N more".
constexpr size_t kNamesListed = 5;

// The most an import reads of a JSON file before parsing it (parsing takes several times the
// text in memory). config.json: DeepSeek-V3's is under 2 KB, a moetrain export's a few KB. The
// index: about 100 bytes a tensor, so 16 MiB is some 160,000 tensors, three times DeepSeek-V3's.
constexpr int64_t kMaxConfigBytes = int64_t{1} << 20;
constexpr int64_t kMaxIndexBytes = int64_t{16} << 20;

// `name` in `dir` (OpenInputFile, at most `max_bytes`), parsed with its nesting bounded.
absl::StatusOr<Json> ReadJsonFile(const fs::path& dir, const std::string& name, int64_t max_bytes) {
  MOETRAIN_ASSIGN_OR_RETURN(const InputFile file, OpenInputFile(dir.string(), name, max_bytes));
  MOETRAIN_ASSIGN_OR_RETURN(const std::string text, file.ReadAll());
  return ParseJson(text, file.path());
}

std::string JsonText(const Json& json) { return json.dump(2) + "\n"; }

// "a, b, c and 4 more".
std::string ListNames(const std::vector<std::string>& names) {
  std::vector<std::string> shown(names.begin(),
                                 names.begin() + std::min(names.size(), kNamesListed));
  std::string text = absl::StrJoin(shown, ", ");
  if (names.size() > kNamesListed)
    absl::StrAppend(&text, " and ", names.size() - kNamesListed, " more");
  return text;
}

// A copy of the embedding or LM head that DeepSeek-V3's checkpoints keep per MTP layer.
struct MtpCopy {
  std::string name;      // "model.layers.{L+i}.embed_tokens.weight"
  std::string original;  // the parameter it copies: "model.embed_tokens.weight"
  std::string layer;     // its layer's prefix: "model.layers.{L+i}."
};

// The MTP copies of `model` that are not parameters of it.
std::vector<MtpCopy> MtpCopies(const Transformer& model) {
  const ModelConfig& c = model.config();
  std::set<std::string> parameters;
  for (const NamedParameter& p : model.parameters()) parameters.insert(p.name);
  const std::string embed = "model.embed_tokens.weight";
  const std::string head = c.tie_embeddings ? embed : "lm_head.weight";
  std::vector<MtpCopy> copies;
  for (int64_t i = 0; i < c.mtp_depth; ++i) {
    const std::string layer = absl::StrCat("model.layers.", c.num_layers + i, ".");
    for (MtpCopy copy : {MtpCopy{layer + "embed_tokens.weight", embed, layer},
                         MtpCopy{layer + "shared_head.head.weight", head, layer}}) {
      if (!parameters.contains(copy.name)) copies.push_back(std::move(copy));
    }
  }
  return copies;
}

// ---------------------------------------------------------------------------------------------
// Export.

// A tensor to write: its name and the checkpoint's f32 tensor.
struct ExportEntry {
  std::string name;
  const Tensor* source;
};

// The ranks R of the files model-rankR.safetensors the manifest lists: every rank that wrote a
// shard (world_layout's "shards"), and rank 0 alone in a format-1 manifest, which has none.
std::vector<int> ModelRanks(const Json& manifest) {
  std::vector<int> ranks;
  constexpr size_t kDigitsAt = sizeof("model-rank") - 1;
  for (const Json& file : manifest.value("files", Json::array())) {
    const std::string name = file.is_object() ? file.value("name", "") : "";
    if (name.size() != ModelFileName(0).size() || name.rfind("model-rank", 0) != 0) continue;
    const int rank = std::atoi(name.substr(kDigitsAt, 5).c_str());  // checked by formatting back
    if (ModelFileName(rank) == name) ranks.push_back(rank);
  }
  return ranks;
}

// The tensors of `loaded` in checkpoint order (parameters(), each MTP layer's copies after its
// own parameters), checked against the model of `config`: DataLoss names any tensor missing,
// unexpected, or not f32 of the parameter's shape.
absl::StatusOr<std::vector<ExportEntry>> ExportEntries(const ModelConfig& config,
                                                       const LoadedCheckpoint& loaded) {
  // Built for its parameter table only; freed before the shards are written.
  MOETRAIN_ASSIGN_OR_RETURN(const Transformer model, Transformer::Create(config, DType::kF32));
  std::vector<ExportEntry> entries;
  std::set<std::string> expected;
  for (const NamedParameter& p : model.parameters()) {
    const auto it = loaded.model_tensors.find(p.name);
    if (it == loaded.model_tensors.end()) {
      return absl::DataLossError(
          absl::StrCat(loaded.path, ": tensor ", p.name, " is missing from its model files"));
    }
    const TensorView found = it->second.view();
    if (found.dtype() != DType::kF32 || found.shape() != p.value.shape()) {
      return absl::DataLossError(absl::StrCat(loaded.path, ": tensor ", p.name, " is ",
                                              found.DebugString(), ", the model's is ",
                                              p.value.DebugString()));
    }
    entries.push_back({p.name, &it->second});
    expected.insert(p.name);
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, tensor] : loaded.model_tensors) {
    if (!expected.contains(name)) unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    return absl::DataLossError(absl::StrCat(loaded.path, ": tensor(s) ", ListNames(unexpected),
                                            " are not parameters of the manifest's model_config"));
  }
  for (const MtpCopy& copy : MtpCopies(model)) {
    // After the last tensor of its layer, else at the end.
    size_t at = entries.size();
    for (size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].name.rfind(copy.layer, 0) == 0) at = i + 1;
    }
    entries.insert(entries.begin() + static_cast<std::ptrdiff_t>(at),
                   ExportEntry{copy.name, &loaded.model_tensors.at(copy.original)});
  }
  return entries;
}

// Where the export goes: `out_dir`, or when it is a symbolic link the directory it leads to, so
// that the files land there and the link stays (the final rename replaces what it names, and
// would fail on a link). A link that leads nowhere is refused.
absl::StatusOr<fs::path> ResolveOutDir(const fs::path& out_dir) {
  std::error_code ec;
  if (!fs::is_symlink(out_dir, ec)) return out_dir;
  const fs::path target = fs::canonical(out_dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--to-hf ", out_dir.string(), " is a symbolic link to ",
                     fs::read_symlink(out_dir, ec).string(), ", which does not exist"));
  }
  return target;
}

// Refuses an `out_dir` that exists and is not an empty directory.
absl::Status CheckOutDir(const fs::path& out_dir) {
  std::error_code ec;
  if (!fs::exists(out_dir, ec)) return absl::OkStatus();
  if (!fs::is_directory(out_dir, ec) || !fs::is_empty(out_dir, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat(out_dir.string(), " already exists and is not an empty directory"));
  }
  return absl::OkStatus();
}

// Writes the shards, the index and the two JSON files into `dir`.
absl::Status WriteHfFiles(const std::string& dir, const std::vector<ExportEntry>& entries,
                          const HfExportOptions& options, const Json& config, int64_t seq_len,
                          HfExportReport* report) {
  // Greedy shards of at most options.shard_bytes (one tensor may exceed it alone).
  const int64_t element_bytes = static_cast<int64_t>(DTypeSize(options.dtype));
  std::vector<std::vector<const ExportEntry*>> shards;
  int64_t shard_bytes = 0;
  for (const ExportEntry& entry : entries) {
    const int64_t bytes = entry.source->numel() * element_bytes;
    if (shards.empty() || (shard_bytes > 0 && shard_bytes + bytes > options.shard_bytes)) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&entry);
    shard_bytes += bytes;
    report->total_bytes += bytes;
  }
  const int num_shards = static_cast<int>(shards.size());
  Json weight_map = Json::object();
  const ExecContext ctx = ExecContext::Cpu();
  for (int s = 0; s < num_shards; ++s) {
    const std::string file = HfShardFileName(s + 1, num_shards);
    std::vector<Tensor> converted;  // this shard's bf16 copies
    std::vector<std::pair<std::string, TensorView>> tensors;
    for (const ExportEntry* entry : shards[s]) {
      TensorView view = entry->source->view();
      if (options.dtype != DType::kF32) {
        converted.push_back(Tensor::Empty(options.dtype, view.shape()));
        MOETRAIN_RETURN_IF_ERROR(ops::ConvertTensor(ctx, view, converted.back()));
        view = converted.back().view();
      }
      tensors.emplace_back(entry->name, view);
      weight_map[entry->name] = file;
    }
    MOETRAIN_RETURN_IF_ERROR(
        WriteSafetensors(absl::StrCat(dir, "/", file), tensors, kShardMetadata));
  }
  const Json index = {{"metadata", {{"total_size", report->total_bytes}}},
                      {"weight_map", std::move(weight_map)}};
  const Json generation = {{"_from_model_config", true}, {"max_length", seq_len}};
  for (const auto& [name, json] : {std::pair{kHfIndexName, &index}, std::pair{kConfigName, &config},
                                   std::pair{kGenerationConfigName, &generation}}) {
    MOETRAIN_RETURN_IF_ERROR(
        WriteFileSynced(absl::StrCat(dir, "/", name), JsonText(*json)).status());
  }
  report->num_tensors = static_cast<int64_t>(entries.size());
  report->num_shards = num_shards;
  return SyncDirectory(dir);
}

// Refuses, without --force, a model that only the group scoring keeps from DeepSeek-V3's class,
// and notes why config.json names the class it does (HuggingFaceConfig makes the choice).
absl::Status NoteArchitecture(const ModelConfig& config, const HfExportOptions& options,
                              HfExportReport* report) {
  bool group_scoring = false;
  const std::vector<std::string> differences = DeepseekV3Differences(config, &group_scoring);
  if (differences.empty()) return absl::OkStatus();
  const std::string members = absl::StrCat(config.moe.group_score_members());
  if (group_scoring && differences.size() == 1) {
    // Only the group scoring stands between this model and DeepSeek-V3's code: the user most
    // likely wants that class, which would route tokens differently.
    if (!options.force) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model.moe.top_k / model.moe.group_top_k = ", config.moe.top_k, " / ",
          config.moe.group_top_k, " = ", members,
          ": Hugging Face's DeepSeek-V3 code scores a group by the sum of its best 2 experts, "
          "moetrain by its best ",
          members,
          ", so the exported DeepseekV3ForCausalLM would route tokens differently; --force "
          "exports it anyway (config.json keeps the difference under moetrain_differences)"));
    }
    report->notes.push_back(absl::StrCat(
        "--force: config.json names ", kDeepseekV3Architecture,
        ", whose code scores a group by its best 2 experts where this model uses its best ",
        members, ": it will route some tokens differently"));
    return absl::OkStatus();
  }
  report->notes.push_back(absl::StrCat(
      "config.json names ", kMoetrainArchitecture, ", not ", kDeepseekV3Architecture,
      ", whose code would compute another function: ", absl::StrJoin(differences, "; "),
      " (no Hugging Face code has that name, so no tool loads these weights into the wrong "
      "model; config.json lists the differences under moetrain_differences)"));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Import.

// Shard names come from a file: each must be a plain file name in the directory, never a path.
absl::Status CheckShardName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(kHfIndexName, ": weight_map names the file \"", name,
                     "\", which is not a file name in the directory"));
  }
  return absl::OkStatus();
}

// Where the tensors of a Hugging Face directory are.
struct WeightFiles {
  std::map<std::string, std::string> weight_map;  // from the index; empty for a single file
  std::vector<std::string> files;                 // sorted
  bool indexed = false;
};

// Whether `dir` has an entry `name` of any kind (a dangling link too, which OpenInputFile then
// refuses by name).
bool HasEntry(const fs::path& dir, const char* name) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(dir / name, ec));
}

absl::StatusOr<WeightFiles> FindWeightFiles(const fs::path& in_dir) {
  WeightFiles found;
  if (HasEntry(in_dir, kHfIndexName)) {
    MOETRAIN_ASSIGN_OR_RETURN(const Json index, ReadJsonFile(in_dir, kHfIndexName, kMaxIndexBytes));
    const auto map = index.is_object() ? index.find("weight_map") : Json::const_iterator();
    if (!index.is_object() || map == index.end() || !map->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          (in_dir / kHfIndexName).string(), ": \"weight_map\" is missing or not an object"));
    }
    std::set<std::string> files;
    for (const auto& [name, file] : map->items()) {
      if (!file.is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            (in_dir / kHfIndexName).string(), ": weight_map[\"", name, "\"] is not a file name"));
      }
      MOETRAIN_RETURN_IF_ERROR(CheckShardName(file.get<std::string>()));
      found.weight_map[name] = file.get<std::string>();
      files.insert(file.get<std::string>());
    }
    found.files.assign(files.begin(), files.end());
    found.indexed = true;
    return found;
  }
  if (HasEntry(in_dir, kHfSingleFileName)) {
    found.files = {kHfSingleFileName};
    return found;
  }
  return absl::NotFoundError(
      absl::StrCat(in_dir.string(), " has neither ", kHfIndexName, " nor ", kHfSingleFileName));
}

// Copies `src` (f32, or bf16 widened exactly) into the parameter `p`.
absl::Status FillParameter(const std::string& path, const std::string& name, TensorView src,
                           const NamedParameter& p, const ExecContext& ctx) {
  if (src.shape() != p.value.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", name, " is ",
                                                   src.DebugString(), ", the model's is ",
                                                   p.value.DebugString()));
  }
  if (src.dtype() == DType::kF32) {
    MOETRAIN_RETURN_IF_ERROR(ops::CopyTensor(ctx, src, p.value));
  } else if (src.dtype() == DType::kBF16) {
    MOETRAIN_RETURN_IF_ERROR(ops::ConvertTensor(ctx, src, p.value));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": tensor ", name, " is ", std::string(SafetensorsDTypeName(src.dtype())),
        "; moetrain imports BF16 and F32 weights only (quantized checkpoints are not supported)"));
  }
  // A NaN or Inf weight would make every step's loss NaN: refused here, naming it, rather than
  // at the first step of a job that starts from the import.
  MOETRAIN_ASSIGN_OR_RETURN(const bool finite, ops::AllFinite(ctx, {p.value}));
  if (!finite) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor ", name, " holds NaN or infinite values"));
  }
  return absl::OkStatus();
}

// Refuses, before anything is allocated, an import whose memory exceeds `options`' limit: the
// model's f32 weights and their gradient buffer (Transformer::Create), and the largest shard,
// whose tensors are read whole.
absl::Status CheckImportMemory(const std::string& in_dir, const ModelConfig& config,
                               const std::vector<InputFile>& shards,
                               const HfImportOptions& options) {
  if (options.memory_limit_bytes <= 0) return absl::OkStatus();
  const double model_bytes = 2 * 4 * ParameterCount(config);
  const InputFile* largest = nullptr;
  for (const InputFile& shard : shards) {
    if (largest == nullptr || shard.bytes() > largest->bytes()) largest = &shard;
  }
  const double shard_bytes = largest != nullptr ? static_cast<double>(largest->bytes()) : 0.0;
  const double needed = model_bytes + shard_bytes;
  if (needed <= static_cast<double>(options.memory_limit_bytes)) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "importing ", in_dir, " needs about ", FormatBytes(needed), " of memory (",
      FormatBytes(model_bytes), " for the model's f32 weights and their gradient buffer",
      largest != nullptr
          ? absl::StrCat(", ", FormatBytes(shard_bytes), " for its largest file, ", largest->path())
          : "",
      "), more than the ", FormatBytes(static_cast<double>(options.memory_limit_bytes)),
      " available (", options.memory_limit_name, ")"));
}

}  // namespace

std::string HfShardFileName(int shard, int num_shards) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", shard, num_shards);
}

absl::StatusOr<HfExportReport> ExportHuggingFace(const std::string& step_dir,
                                                 const std::string& out_dir,
                                                 const HfExportOptions& options) {
  if (options.dtype != DType::kBF16 && options.dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dtype = ", std::string(DTypeName(options.dtype)), " is not supported: bf16 or f32"));
  }
  if (options.shard_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard size = ", options.shard_bytes, " bytes must be positive"));
  }
  fs::path out_path = fs::path(out_dir).lexically_normal();
  if (!out_path.has_filename()) out_path = out_path.parent_path();  // "a/b/" -> "a/b"
  if (out_path.empty() || out_path.filename() == "." || out_path.filename() == "..") {
    return absl::InvalidArgumentError(absl::StrCat("--to-hf \"", out_dir, "\" names no directory"));
  }
  MOETRAIN_ASSIGN_OR_RETURN(out_path, ResolveOutDir(out_path));
  MOETRAIN_RETURN_IF_ERROR(CheckOutDir(out_path));

  // The model and the refusal first: neither needs the tensors.
  MOETRAIN_ASSIGN_OR_RETURN(const Json manifest, LoadCheckpointManifest(step_dir));
  if (!manifest.contains("model_config")) {
    return absl::FailedPreconditionError(absl::StrCat(
        step_dir, ": the manifest has no model_config (a checkpoint of an older build)"));
  }
  absl::StatusOr<ModelConfig> config = ModelConfigFromJson(manifest["model_config"]);
  if (!config.ok()) {
    return absl::DataLossError(absl::StrCat(step_dir, ": manifest ", config.status().message()));
  }
  HfExportReport report;
  report.out_dir = out_path.string();
  MOETRAIN_RETURN_IF_ERROR(NoteArchitecture(*config, options, &report));

  const std::vector<int> ranks = ModelRanks(manifest);
  if (ranks.empty()) {
    return absl::DataLossError(absl::StrCat(step_dir, ": the manifest lists no model file"));
  }
  MOETRAIN_ASSIGN_OR_RETURN(const LoadedCheckpoint loaded,
                            LoadCheckpoint(step_dir, {.ranks = ranks, .optimizer = false}));
  const auto max_position = loaded.hf_config.find("max_position_embeddings");
  if (max_position == loaded.hf_config.end() || !max_position->is_number_integer() ||
      max_position->get<int64_t>() < 1) {
    return absl::DataLossError(absl::StrCat(
        step_dir, ": config.json has no usable max_position_embeddings (the sequence length)"));
  }
  const int64_t seq_len = max_position->get<int64_t>();
  MOETRAIN_ASSIGN_OR_RETURN(const std::vector<ExportEntry> entries, ExportEntries(*config, loaded));
  Json hf_config = HuggingFaceConfig(*config, seq_len, options.force);
  report.architecture = hf_config["architectures"][0].get<std::string>();  // the one rule's
  hf_config["torch_dtype"] = options.dtype == DType::kF32 ? "float32" : "bfloat16";

  const fs::path parent = out_path.has_parent_path() ? out_path.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) return IoError(ec.value(), absl::StrCat("create ", parent.string()));
  const std::string tmp_dir =
      (parent /
       absl::StrFormat(".tmp-%s-%016x", out_path.filename().string(), NewCheckpointNonce()))
          .string();
  if (!fs::create_directory(tmp_dir, ec)) {
    return IoError(ec ? ec.value() : EEXIST, absl::StrCat("create ", tmp_dir));
  }
  absl::Status status = WriteHfFiles(tmp_dir, entries, options, hf_config, seq_len, &report);
  // rename(2) replaces an empty directory; one that filled up meanwhile fails it (ENOTEMPTY).
  if (status.ok() && std::rename(tmp_dir.c_str(), out_path.c_str()) != 0) {
    const int error_number = errno;
    status =
        error_number == ENOTEMPTY || error_number == EEXIST
            ? absl::AlreadyExistsError(absl::StrCat(out_path.string(), " is not empty"))
            : IoError(error_number, absl::StrCat("rename ", tmp_dir, " to ", out_path.string()));
  }
  if (!status.ok()) {
    fs::remove_all(tmp_dir, ec);  // best effort
    return status;
  }
  MOETRAIN_RETURN_IF_ERROR(SyncDirectory(parent.string()));
  return report;
}

absl::StatusOr<HfImportReport> ImportHuggingFace(const std::string& in_dir,
                                                 const std::string& out_root,
                                                 const HfImportOptions& options) {
  const fs::path in_path(in_dir);
  std::error_code ec;
  if (!fs::is_directory(in_path, ec)) {
    return absl::NotFoundError(absl::StrCat(in_dir, ": no such directory"));
  }
  MOETRAIN_ASSIGN_OR_RETURN(const Json hf_config,
                            ReadJsonFile(in_path, kConfigName, kMaxConfigBytes));
  HfImportReport report;
  absl::StatusOr<ModelConfig> config = ModelConfigFromHuggingFace(hf_config, &report.seq_len);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(in_dir, ": ", config.status().message()));
  }
  report.config = *config;
  const Json architectures = hf_config.value("architectures", Json::array());
  report.architecture =
      architectures.is_array() && !architectures.empty() && architectures[0].is_string()
          ? architectures[0].get<std::string>()
          : "";
  MOETRAIN_ASSIGN_OR_RETURN(const WeightFiles weights, FindWeightFiles(in_path));
  // Every shard opened (and checked to be a regular file) first: their sizes go into the memory
  // check, which comes before the model is allocated.
  std::vector<InputFile> shards;
  for (const std::string& file : weights.files) {
    MOETRAIN_ASSIGN_OR_RETURN(InputFile shard, OpenInputFile(in_dir, file, 0));
    shards.push_back(std::move(shard));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckImportMemory(in_dir, *config, shards, options));
  MOETRAIN_ASSIGN_OR_RETURN(Transformer model, Transformer::Create(*config, DType::kF32));

  std::map<std::string, const NamedParameter*> parameters;
  for (const NamedParameter& p : model.parameters()) parameters[p.name] = &p;
  std::set<std::string> copies;
  for (const MtpCopy& copy : MtpCopies(model)) copies.insert(copy.name);
  std::set<std::string> filled;
  std::vector<std::string> unexpected;
  const ExecContext& ctx = model.context();
  // One shard in memory at a time.
  for (size_t f = 0; f < shards.size(); ++f) {
    const std::string& file = weights.files[f];
    const std::string& path = shards[f].path();
    MOETRAIN_ASSIGN_OR_RETURN(const SafetensorsFile shard, ReadSafetensors(shards[f].fd(), path));
    for (const std::string& name : shard.names()) {
      if (weights.indexed) {
        const auto listed = weights.weight_map.find(name);
        if (listed == weights.weight_map.end() || listed->second != file) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ": tensor ", name, " is here, but ", kHfIndexName,
              listed == weights.weight_map.end() ? " does not list it"
                                                 : absl::StrCat(" puts it in ", listed->second)));
        }
      }
      MOETRAIN_ASSIGN_OR_RETURN(const TensorView view, shard.View(name));
      const auto p = parameters.find(name);
      if (p != parameters.end()) {
        MOETRAIN_RETURN_IF_ERROR(FillParameter(path, name, view, *p->second, ctx));
        filled.insert(name);
      } else if (copies.contains(name)) {
        ++report.ignored_tensors;
      } else {
        unexpected.push_back(absl::StrCat(name, " (", file, ")"));
      }
    }
  }
  if (!unexpected.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        in_dir, ": tensor(s) ", ListNames(unexpected), " are not parameters of the model its ",
        kConfigName,
        " describes: the checkpoint uses a feature moetrain does not have (quantization scales, "
        "biases, another architecture)"));
  }
  for (const NamedParameter& p : model.parameters()) {
    if (filled.contains(p.name)) continue;
    const auto listed = weights.weight_map.find(p.name);
    return absl::InvalidArgumentError(absl::StrCat(
        in_dir, ": tensor ", p.name, " ", p.value.DebugString(), " is missing: ",
        listed != weights.weight_map.end()
            ? absl::StrCat(kHfIndexName, " puts it in ", listed->second, ", which lacks it")
            : absl::StrCat("no file holds it (read ", absl::StrJoin(weights.files, ", "), ")")));
  }
  for (const auto& [name, file] : weights.weight_map) {
    if (!filled.contains(name) && !copies.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat(in_dir, ": ", kHfIndexName, " puts tensor ",
                                                     name, " in ", file, ", which lacks it"));
    }
  }
  MOETRAIN_RETURN_IF_ERROR(model.SyncComputeWeights());
  report.num_tensors = static_cast<int64_t>(filled.size());

  CheckpointContents contents;
  contents.step = 0;
  const int64_t num_experts = config->moe.num_experts;
  contents.sections = {
      {"model_config", ModelConfigToJson(*config)},
      {"world_layout",
       {{"world_size", 1},
        {"data_parallel", 1},
        {"expert_parallel", 1},
        {"shards",
         {{{"rank", 0},
           {"model", ModelFileName(0)},
           {"optim", OptimFileName(0)},
           {"dense", true},
           {"experts", {0, num_experts}}}}}}},
      {"imported_from",
       {{"path", fs::absolute(in_path, ec).lexically_normal().string()},
        {"architecture", report.architecture}}},
  };
  for (const NamedParameter& p : model.parameters())
    contents.model_tensors.push_back({p.name, p.value});
  contents.hf_config = HuggingFaceConfig(*config, report.seq_len);
  MOETRAIN_ASSIGN_OR_RETURN(report.step_dir, WriteCheckpoint(out_root, contents));
  return report;
}

}  // namespace moetrain
