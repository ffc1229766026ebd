// The trainer's checkpoints: sharded writing by every rank, agreed resume, and loading a model
// from any checkpoint.
//
// Who writes what (W = dp × ep ranks; the dp replicas of a shard hold the same values):
//   rank 0                       the dense parameters and their optimizer moments
//   ranks 0 … ep-1 (dp_rank 0)   their experts, [j·E/ep, (j+1)·E/ep), and their moments
// in model-rank{j}.safetensors / optim-rank{j}.safetensors; ranks with dp_rank > 0 write nothing.
// The moments of a sharded optimizer (parallel.sharding = OPTIMIZER or GRADIENTS), or bf16 ones,
// are gathered whole and in f32 first (trainer_sharding.cc), so the files do not depend on the
// sharding or the moments' dtype. The manifest's "world_layout" records the layout and the
// shards, so that a loader on any layout knows which file holds which tensors (its "sharding" is
// for people):
//   {"world_size": 4, "data_parallel": 2, "expert_parallel": 2, "sharding": "NONE",
//    "shards": [{"rank": 0, "model": "model-rank00000.safetensors",
//                "optim": "optim-rank00000.safetensors", "dense": true, "experts": [0, 4]}, …]}
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/core/allocator.h"
#include "engine/core/log.h"
#include "engine/core/sha256.h"
#include "engine/core/status.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/train/checkpoint.h"
#include "engine/train/hf_config.h"
#include "engine/train/model_config_json.h"
#include "engine/train/parallel.h"
#include "engine/train/trainer.h"

namespace moetrain {
namespace {

using Json = nlohmann::json;

// The delayed FP8 recipe's state in rank 0's optimizer file (Fp8State::SaveState).
constexpr char kFp8StateTensor[] = "fp8_state";

// A written file as integers for AllGather: [bytes, the sha256's 32 bytes as 4 words].
constexpr int kFileWords = 5;
static_assert(kFileWords == 1 + kSha256Bytes / sizeof(int64_t));
// What each rank tells the others after writing: [ok, number of files, 2 files × kFileWords].
constexpr int kShardWords = 2 + 2 * kFileWords;

void PackFile(const CheckpointFile& file, int64_t* out) {
  out[0] = file.bytes;
  absl::HexStringToBytes(file.sha256).copy(reinterpret_cast<char*>(out + 1), kSha256Bytes);
}

CheckpointFile UnpackFile(const int64_t* in, std::string name) {
  const absl::string_view digest(reinterpret_cast<const char*>(in + 1), kSha256Bytes);
  return CheckpointFile{std::move(name), in[0], absl::BytesToHexString(digest)};
}

// A tensor read from a checkpoint (host) into its place `dst` on ctx's device.
absl::Status RestoreTensor(const ExecContext& ctx, const std::string& path, const Tensor& src,
                           const std::string& name, TensorView dst) {
  if (src.dtype() != DType::kF32 || src.view().shape() != dst.shape()) {
    return absl::DataLossError(absl::StrCat(path, ": tensor ", name, " is ",
                                            src.view().DebugString(), ", expected ",
                                            dst.DebugString()));
  }
  return ops::CopyTensor(ctx, src, dst);
}

absl::Status RestoreNamedTensor(const ExecContext& ctx, const std::string& path,
                                const std::map<std::string, Tensor>& tensors,
                                const std::string& name, TensorView dst) {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    return absl::DataLossError(absl::StrCat(path, ": tensor ", name, " is missing"));
  }
  return RestoreTensor(ctx, path, it->second, name, dst);
}

using NamedViews = std::vector<std::pair<std::string, TensorView>>;

// Copies the tensors of `named` (dense, on ctx's device) into host memory and points each entry
// at its copy, which `keep` holds. Those that lie inside `buffer` (the model's flat master
// buffer) come over in one copy of the span they cover (the shard's tensors are adjacent there,
// with only alignment padding between them); any other tensor in a copy of its own. Each copy
// returns once its bytes are on the host (CopyTensor), so the snapshot is of the state as it is
// now, and the compute stream stalls only for the copies.
absl::Status SnapshotToHost(const ExecContext& ctx, TensorView buffer, NamedViews* named,
                            std::vector<Tensor>* keep) {
  const char* base = static_cast<const char*>(buffer.raw());
  const size_t buffer_bytes = static_cast<size_t>(buffer.numel()) * DTypeSize(buffer.dtype());
  const auto in_buffer = [&](const TensorView& t) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(t.raw());
    const uintptr_t first = reinterpret_cast<uintptr_t>(base);
    const size_t bytes = static_cast<size_t>(t.numel()) * DTypeSize(t.dtype());
    return t.numel() > 0 && t.device() == buffer.device() && begin >= first &&
           begin - first + bytes <= buffer_bytes;
  };
  size_t lo = buffer_bytes, hi = 0;
  for (const auto& [name, view] : *named) {
    if (!in_buffer(view)) continue;
    const size_t begin = static_cast<size_t>(static_cast<const char*>(view.raw()) - base);
    lo = std::min(lo, begin);
    hi = std::max(hi, begin + static_cast<size_t>(view.numel()) * DTypeSize(view.dtype()));
  }
  char* span = nullptr;
  if (lo < hi) {
    // Copied as the buffer's elements: every view in it starts and ends on an element.
    const size_t element = DTypeSize(buffer.dtype());
    lo = lo / element * element;
    hi = (hi + element - 1) / element * element;
    const int64_t elements = static_cast<int64_t>((hi - lo) / element);
    MOETRAIN_ASSIGN_OR_RETURN(Tensor host,
                              Tensor::Allocate(CpuAllocator(), buffer.dtype(), {elements}));
    MOETRAIN_RETURN_IF_ERROR(ops::CopyTensor(
        ctx, TensorView(const_cast<char*>(base) + lo, buffer.dtype(), {elements}, buffer.device()),
        host));
    span = static_cast<char*>(host.view().raw());
    keep->push_back(std::move(host));
  }
  for (auto& [name, view] : *named) {
    if (view.device().is_cpu()) continue;
    if (span != nullptr && in_buffer(view)) {
      const size_t at = static_cast<size_t>(static_cast<const char*>(view.raw()) - base) - lo;
      view = TensorView(span + at, view.dtype(), view.shape());
      continue;
    }
    MOETRAIN_ASSIGN_OR_RETURN(Tensor host,
                              Tensor::Allocate(CpuAllocator(), view.dtype(), view.shape()));
    MOETRAIN_RETURN_IF_ERROR(ops::CopyTensor(ctx, view, host));
    view = host.view();
    keep->push_back(std::move(host));
  }
  return absl::OkStatus();
}

// The ranks R of the files model-rankR.safetensors a manifest lists.
std::vector<int> ModelFileRanks(const Json& manifest) {
  std::vector<int> ranks;
  const auto files = manifest.find("files");
  if (files == manifest.end() || !files->is_array()) return ranks;
  constexpr size_t kDigitsAt = sizeof("model-rank") - 1;
  for (const Json& entry : *files) {
    const std::string name = entry.is_object() ? entry.value("name", "") : "";
    if (name.size() != ModelFileName(0).size() || name.rfind("model-rank", 0) != 0) continue;
    // Parsed, then checked by formatting it back.
    const int rank = std::atoi(name.substr(kDigitsAt, 5).c_str());
    if (ModelFileName(rank) == name) ranks.push_back(rank);
  }
  return ranks;
}

// The world layout a manifest records. Format 1 (single-rank) manifests have only world_size.
absl::StatusOr<ParallelConfig> ManifestLayout(const Json& manifest) {
  const auto layout = manifest.find("world_layout");
  ParallelConfig config;
  if (layout == manifest.end()) return config;
  if (!layout->is_object()) {
    return absl::DataLossError(
        absl::StrCat("manifest world_layout is not an object: ", JsonExcerpt(*layout)));
  }
  // Each count read exactly, as a positive int: a manifest's number is no trusted one.
  auto read = [&](const char* key, int fallback, int* out) -> absl::Status {
    *out = fallback;
    if (!layout->contains(key)) return absl::OkStatus();
    const absl::Status status = ReadJsonKey(*layout, "manifest world_layout.", key, out);
    if (!status.ok()) return absl::DataLossError(status.message());
    if (*out < 1) {
      return absl::DataLossError(
          absl::StrCat("manifest world_layout.", key, " = ", *out, " is below 1"));
    }
    return absl::OkStatus();
  };
  int world_size = 1;
  MOETRAIN_RETURN_IF_ERROR(read("world_size", 1, &world_size));
  MOETRAIN_RETURN_IF_ERROR(read("data_parallel", world_size, &config.data_parallel));
  MOETRAIN_RETURN_IF_ERROR(read("expert_parallel", 1, &config.expert_parallel));
  if (int64_t{config.data_parallel} * config.expert_parallel > kMaxRanks) {
    return absl::DataLossError(absl::StrCat("manifest world_layout: ", config.data_parallel, " × ",
                                            config.expert_parallel, " ranks is more than ",
                                            kMaxRanks));
  }
  return config;
}

// The loader's position, and the file it reads as it found it (none for synthetic data).
Json DataPositionJson(const DataLoader& data) {
  Json json = data.position().ToJson();
  if (const std::optional<DataFileStamp> file = data.file_stamp()) json["file"] = file->ToJson();
  return json;
}

// The data file a manifest's data position records; nullopt when it records none (synthetic data,
// or a checkpoint written before the record). DataLoss when the record is malformed.
absl::StatusOr<std::optional<DataFileStamp>> RecordedDataFile(const Json& manifest) {
  const auto position = manifest.find("data_position");
  if (position == manifest.end() || !position->is_object()) return std::nullopt;
  const auto file = position->find("file");
  if (file == position->end()) return std::nullopt;
  absl::StatusOr<DataFileStamp> stamp = DataFileStamp::FromJson(*file);
  if (!stamp.ok()) return absl::DataLossError(absl::StrCat("manifest ", stamp.status().message()));
  return std::optional<DataFileStamp>(*std::move(stamp));
}

}  // namespace

absl::Status RestoreModelParameters(const LoadedCheckpoint& loaded, Transformer* model) {
  // A sharded checkpoint keeps each expert shard in one rank's model file: read the step's other
  // model files when `loaded` lacks some of this model's tensors.
  std::map<std::string, Tensor> others;
  const bool missing =
      std::any_of(model->parameters().begin(), model->parameters().end(),
                  [&](const NamedParameter& p) { return !loaded.model_tensors.contains(p.name); });
  if (missing) {
    CheckpointReadOptions options{.ranks = {}, .optimizer = false};
    for (int rank : ModelFileRanks(loaded.manifest)) {
      if (std::find(loaded.ranks.begin(), loaded.ranks.end(), rank) == loaded.ranks.end()) {
        options.ranks.push_back(rank);
      }
    }
    if (!options.ranks.empty()) {
      MOETRAIN_ASSIGN_OR_RETURN(LoadedCheckpoint rest, LoadCheckpoint(loaded.path, options));
      others = std::move(rest.model_tensors);
    }
  }
  const ExecContext& ctx = model->context();
  for (const NamedParameter& p : model->parameters()) {
    const auto it = loaded.model_tensors.find(p.name);
    MOETRAIN_RETURN_IF_ERROR(it != loaded.model_tensors.end()
                                 ? RestoreTensor(ctx, loaded.path, it->second, p.name, p.value)
                                 : RestoreNamedTensor(ctx, loaded.path, others, p.name, p.value));
  }
  return model->SyncComputeWeights();
}

absl::Status Trainer::InitializeFrom(const std::string& step_dir) {
  MOETRAIN_ASSIGN_OR_RETURN(const Json manifest, LoadCheckpointManifest(step_dir));
  absl::StatusOr<ModelConfig> theirs = ManifestModelConfig(manifest);
  if (!theirs.ok()) {
    return absl::DataLossError(absl::StrCat(step_dir, ": ", theirs.status().message()));
  }
  // The same function, training-only fields aside; a job without MTP may start from a model with
  // it (the modules' weights are left out).
  if (config_.model.mtp_depth == 0) theirs->mtp_depth = 0;
  const Json want = ModelFunctionJson(config_.model), got = ModelFunctionJson(*theirs);
  if (want != got) {
    std::vector<std::string> differ;
    for (const auto& [key, value] : want.items()) {
      if (key == "moe") {
        for (const auto& [moe_key, moe_value] : value.items()) {
          if (got["moe"].value(moe_key, Json()) != moe_value) differ.push_back("moe." + moe_key);
        }
      } else if (got.value(key, Json()) != value) {
        differ.push_back(key);
      }
    }
    for (const auto& [key, value] : got.items()) {
      if (!want.contains(key)) differ.push_back(key);
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint.init_from = ", step_dir, " holds another model than this job's spec: model.",
        absl::StrJoin(differ, ", model."), " differ"));
  }
  MOETRAIN_ASSIGN_OR_RETURN(const LoadedCheckpoint loaded,
                            LoadCheckpoint(step_dir, {.ranks = {0}, .optimizer = false}));
  return RestoreModelParameters(loaded, model_.get());
}

absl::StatusOr<std::string> Trainer::BeginCheckpointOnRanks() {
  Communicator& world = groups_->world();
  const std::string root = CheckpointRoot();
  int64_t begun[2] = {0, 0};  // [nonce, ok]
  absl::Status status;
  if (groups_->rank() == 0) {
    const uint64_t nonce = NewCheckpointNonce();
    // Only rank 0 may move a damaged step directory aside, before any rank writes into the root.
    std::string moved_aside;
    status = BeginCheckpoint(root, step_, nonce, &moved_aside).status();
    if (!moved_aside.empty()) Log(moved_aside);
    begun[0] = static_cast<int64_t>(nonce);
    begun[1] = status.ok();
  }
  if (world.size() > 1) MOETRAIN_RETURN_IF_ERROR(world.Broadcast(begun, 2, DType::kI64, 0));
  if (!begun[1]) {
    return groups_->rank() == 0
               ? status
               : absl::AbortedError(absl::StrCat("rank 0 could not start the checkpoint of ",
                                                 CheckpointStepDirName(step_)));
  }
  return CheckpointTempDir(root, step_, static_cast<uint64_t>(begun[0]));
}

CheckpointContents Trainer::CheckpointContentsOfRank(const std::vector<Tensor>* moments) const {
  const int rank = groups_->rank(), ep = config_.parallel.expert_parallel;
  const int64_t num_experts = config_.model.moe.num_experts;
  Json shards = Json::array();
  for (int j = 0; j < ep; ++j) {
    shards.push_back({{"rank", j},
                      {"model", ModelFileName(j)},
                      {"optim", OptimFileName(j)},
                      {"dense", j == 0},
                      {"experts", {j * num_experts / ep, (j + 1) * num_experts / ep}}});
  }
  CheckpointContents contents;
  contents.step = step_;
  contents.tokens_seen = tokens_seen_;
  contents.rank = rank;
  contents.sections = {
      {"model_config", ModelConfigToJson(config_.model)},
      {"world_layout",
       {{"world_size", groups_->world_size()},
        {"data_parallel", config_.parallel.data_parallel},
        {"expert_parallel", ep},
        {"sharding", ShardingName(config_.parallel.sharding)},
        {"shards", std::move(shards)}}},
      {"data_position", DataPositionJson(*data_)},
      // The RNG is counter-based: (seed, step, rank, stream) is its whole state.
      {"rng_state", {{"seed", config_.seed}, {"data_seed", config_.data.seed}, {"step", step_}}},
      {"optimizer", {{"step", optimizer_->step()}}},
      {"compute_dtype", std::string(DTypeName(config_.compute_dtype))},
  };
  if (config_.fp8.has_value()) {
    contents.sections["fp8"] = {{"recipe", std::string(Fp8RecipeName(config_.fp8->recipe))}};
  }
  contents.hf_config = HuggingFaceConfig(config_.model, config_.data.seq_len);

  // The first replica of each expert shard writes it, rank 0 the dense part too. The model file
  // holds the f32 master weights themselves, so the optimizer file needs only the moments.
  const bool writes = WritesShard();
  int64_t optim_index = 0;  // the optimizer's parameters are the trainable ones, in this order
  for (const NamedParameter& p : model_->parameters()) {
    const bool mine = p.expert ? writes : rank == 0;
    if (mine) contents.model_tensors.push_back({p.name, p.value});
    if (!p.trainable) continue;
    if (mine && moments != nullptr) {
      // The gathered moments are laid out as the master buffer.
      const int64_t offset = static_cast<const float*>(p.value.raw()) -
                             static_cast<const float*>(model_->master_buffer().raw());
      for (const auto& [moment, suffix] :
           {std::pair(&(*moments)[0], kExpAvgSuffix), std::pair(&(*moments)[1], kExpAvgSqSuffix)}) {
        contents.optim_tensors.push_back(
            {p.name + suffix,
             moment->view().Slice(offset, offset + p.value.numel()).Reshape(p.value.shape())});
      }
    } else if (mine) {
      contents.optim_tensors.push_back({p.name + kExpAvgSuffix, optimizer_->exp_avg(optim_index)});
      contents.optim_tensors.push_back(
          {p.name + kExpAvgSqSuffix, optimizer_->exp_avg_sq(optim_index)});
    }
    ++optim_index;
  }
  return contents;
}

absl::StatusOr<Trainer::ShardReports> Trainer::WriteShard(const std::string& tmp_dir,
                                                          const CheckpointContents& contents) {
  Communicator& world = groups_->world();
  ShardReports reports;
  absl::Status& status = reports.written;
  std::vector<int64_t> shard(kShardWords, 0);
  if (WritesShard()) {
    absl::StatusOr<std::vector<CheckpointFile>> files = WriteCheckpointShard(tmp_dir, contents);
    status = files.status();
    if (status.ok()) {
      shard[1] = static_cast<int64_t>(files->size());
      for (size_t f = 0; f < files->size(); ++f) PackFile((*files)[f], &shard[2 + f * kFileWords]);
    }
  }
  shard[0] = status.ok();
  reports.words.resize(kShardWords * world.size());
  if (world.size() > 1) {
    MOETRAIN_RETURN_IF_ERROR(
        world.AllGather(shard.data(), reports.words.data(), kShardWords, DType::kI64));
  } else {
    reports.words = shard;
  }
  return reports;
}

absl::StatusOr<std::string> Trainer::CommitCheckpointOnRanks(const std::string& tmp_dir,
                                                             const CheckpointContents& contents,
                                                             ShardReports shards) {
  Communicator& world = groups_->world();
  const std::string root = CheckpointRoot();
  const std::string step_name = CheckpointStepDirName(step_);
  std::string path =
      (std::filesystem::path(root).lexically_normal() / step_name).lexically_normal().string();
  // Rank 0's own write error, if any, names the failure best.
  absl::Status status = std::move(shards.written);
  int64_t committed = 0;
  if (groups_->rank() == 0) {
    std::vector<CheckpointFile> files;
    std::vector<int> failed;
    for (int r = 0; r < world.size(); ++r) {
      const int64_t* words = &shards.words[r * kShardWords];
      if (!words[0]) failed.push_back(r);
      for (int64_t f = 0; f < words[1]; ++f) {
        files.push_back(
            UnpackFile(&words[2 + f * kFileWords], f == 0 ? ModelFileName(r) : OptimFileName(r)));
      }
    }
    if (!failed.empty()) {
      AbandonCheckpoint(tmp_dir);
      if (status.ok()) {
        status = absl::AbortedError(absl::StrCat("rank(s) ", absl::StrJoin(failed, ", "),
                                                 " could not write their part of ", step_name));
      }
    } else {
      absl::StatusOr<std::string> committed_path =
          CommitCheckpoint(root, tmp_dir, contents, std::move(files));
      status = committed_path.status();
      if (status.ok()) path = *committed_path;
      if (status.ok() && config_.keep_last > 0) {
        status = PruneCheckpoints(root, config_.keep_last, contents.step);
      }
    }
    committed = status.ok();
  }
  if (world.size() > 1) MOETRAIN_RETURN_IF_ERROR(world.Broadcast(&committed, 1, DType::kI64, 0));
  if (!committed) {
    if (!status.ok()) return status;
    return absl::AbortedError(absl::StrCat(step_name, " was not written (see rank 0)"));
  }
  return path;
}

absl::StatusOr<CheckpointReport> Trainer::SaveCheckpoint() {
  const auto start = std::chrono::steady_clock::now();
  // A sharded optimizer's moments (or bf16 ones) are gathered first (a collective of every rank),
  // whole and in f32, into host memory, before any directory is made.
  std::vector<Tensor> moments;
  if (gathers_moments()) {
    MOETRAIN_ASSIGN_OR_RETURN(moments, GatherMoments());
  }
  MOETRAIN_ASSIGN_OR_RETURN(const std::string tmp_dir, BeginCheckpointOnRanks());
  CheckpointContents contents = CheckpointContentsOfRank(gathers_moments() ? &moments : nullptr);
  // The files are written from host memory: a device's tensors are copied over first, all of
  // them before any file is written. The copies live until this returns.
  std::vector<Tensor> snapshot;
  if (!ctx_.device().is_cpu() && WritesShard()) {
    MOETRAIN_RETURN_IF_ERROR(
        SnapshotToHost(ctx_, model_->master_buffer(), &contents.model_tensors, &snapshot));
    MOETRAIN_RETURN_IF_ERROR(
        SnapshotToHost(ctx_, model_->master_buffer(), &contents.optim_tensors, &snapshot));
  }
  // Delayed FP8 scaling's histories and scales: the same on every rank after each step's
  // reduction, so rank 0 writes them with the dense part. A host tensor already.
  Tensor fp8_state;
  if (const Fp8State* fp8 = model_->fp8_state();
      fp8 != nullptr && fp8->config().has_state() && groups_->rank() == 0) {
    MOETRAIN_ASSIGN_OR_RETURN(fp8_state, fp8->SaveState());
    contents.optim_tensors.push_back({kFp8StateTensor, fp8_state});
  }
  MOETRAIN_ASSIGN_OR_RETURN(ShardReports shards, WriteShard(tmp_dir, contents));
  MOETRAIN_ASSIGN_OR_RETURN(std::string path,
                            CommitCheckpointOnRanks(tmp_dir, contents, std::move(shards)));
  CheckpointReport report;
  report.step = step_;
  report.tokens_seen = tokens_seen_;
  report.path = std::move(path);
  report.write_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

absl::Status Trainer::RestoreFrom(const LoadedCheckpoint& loaded) {
  MOETRAIN_RETURN_IF_ERROR(RestoreModelParameters(loaded, model_.get()));
  MOETRAIN_RETURN_IF_ERROR(RestoreMomentPieces(loaded));
  const Json& manifest = loaded.manifest;
  int64_t optimizer_step = 0;
  try {
    optimizer_step = manifest.at("optimizer").at("step").get<int64_t>();
  } catch (const Json::exception& e) {
    return absl::DataLossError(absl::StrCat(loaded.path, ": manifest optimizer.step: ", e.what()));
  }
  MOETRAIN_RETURN_IF_ERROR(optimizer_->SetStep(optimizer_step));
  if (Fp8State* fp8 = model_->fp8_state(); fp8 != nullptr && fp8->config().has_state()) {
    const auto saved = loaded.optim_tensors.find(kFp8StateTensor);
    if (saved == loaded.optim_tensors.end()) {
      return absl::DataLossError(absl::StrCat(
          loaded.path, ": no ", kFp8StateTensor,
          " tensor, which a job with train.fp8.recipe = DELAYED resumes its scales from (was the "
          "checkpoint written without FP8?)"));
    }
    MOETRAIN_RETURN_IF_ERROR(fp8->LoadState(saved->second));
  }
  MOETRAIN_ASSIGN_OR_RETURN(DataPosition position,
                            DataPosition::FromJson(manifest.value("data_position", Json())));
  MOETRAIN_RETURN_IF_ERROR(data_->Restore(position));
  MOETRAIN_RETURN_IF_ERROR(grad_sync_->ZeroGrads());
  step_ = loaded.step;
  tokens_seen_ = loaded.tokens_seen;
  return absl::OkStatus();
}

absl::Status Trainer::Resume(TrainObserver* observer) {
  if (config_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError("resume needs a checkpoint directory (checkpoint.dir)");
  }
  Communicator& world = groups_->world();
  const std::string root = CheckpointRoot();
  // Rank 0's listing, so that every rank tries the same steps in the same order.
  std::vector<int64_t> steps;
  absl::Status listed;
  if (groups_->rank() == 0) {
    absl::StatusOr<std::vector<int64_t>> listing = ListCheckpointSteps(root);
    listed = listing.status();
    if (listed.ok()) steps = *std::move(listing);
  }
  int64_t count = listed.ok() ? static_cast<int64_t>(steps.size()) : -1;
  if (world.size() > 1) MOETRAIN_RETURN_IF_ERROR(world.Broadcast(&count, 1, DType::kI64, 0));
  if (count < 0) {
    return !listed.ok() ? listed : absl::AbortedError(absl::StrCat("rank 0 could not list ", root));
  }
  steps.resize(count);
  if (world.size() > 1 && count > 0) {
    MOETRAIN_RETURN_IF_ERROR(world.Broadcast(steps.data(), count, DType::kI64, 0));
  }
  if (steps.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint under ", root));

  const Json model_json = ModelConfigToJson(config_.model);
  std::vector<std::string> warnings;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const std::string name = CheckpointStepDirName(*it);
    const std::string dir = absl::StrCat(root, "/", name);
    // Damage falls back to an older step; another model is an error (every older step would be
    // the same job's).
    absl::Status damaged, unusable;
    absl::StatusOr<Json> manifest = LoadCheckpointManifest(dir);
    if (!manifest.ok()) {
      damaged = manifest.status();
    } else if (manifest->value("model_config", Json()) != model_json) {
      unusable = absl::FailedPreconditionError(
          absl::StrCat(dir, " holds a different model than this job's spec"));
    } else if (absl::StatusOr<ParallelConfig> layout = ManifestLayout(*manifest); !layout.ok()) {
      damaged = layout.status();
    } else if (config_.model.moe.num_experts % layout->expert_parallel != 0) {
      damaged = absl::DataLossError(
          absl::StrCat(dir, ": manifest world_layout.expert_parallel = ", layout->expert_parallel,
                       " does not divide the model's ", config_.model.moe.num_experts, " experts"));
    } else if (absl::StatusOr<std::optional<DataFileStamp>> file = RecordedDataFile(*manifest);
               !file.ok()) {
      damaged = file.status();
    } else if (absl::Status same = data_->CheckSameFile(*file); !same.ok()) {
      // Every older step of the job read the same file: no fallback.
      unusable = absl::FailedPreconditionError(absl::StrCat(dir, ": ", same.message()));
    } else if (absl::StatusOr<LoadedCheckpoint> loaded =
                   LoadCheckpoint(dir, FilesToRead(layout->expert_parallel));
               !loaded.ok()) {
      damaged = loaded.status();
    } else {
      // Copied in before the ranks agree: a failure here is damage like any other.
      damaged = RestoreFrom(*loaded);
    }
    int64_t verdicts[2] = {!damaged.ok(), !unusable.ok()};
    MOETRAIN_RETURN_IF_ERROR(SumOverRanks(&world, absl::MakeSpan(verdicts)));
    if (verdicts[1] > 0) {
      return !unusable.ok() ? unusable
                            : absl::FailedPreconditionError(
                                  absl::StrCat(dir, " cannot be resumed by this job (see rank 0)"));
    }
    if (verdicts[0] == 0) {
      if (observer != nullptr) {
        for (const std::string& warning : warnings) observer->OnMessage(warning);
        observer->OnMessage(absl::StrCat("resumed from ", dir, " (step ", step_, ")"));
      }
      return absl::OkStatus();
    }
    std::string why = !damaged.ok() ? std::string(damaged.message())
                                    : absl::StrCat(verdicts[0], " other rank(s) found it damaged");
    // The messages name the directory; the warning names the step once.
    if (why.rfind(dir + ": ", 0) == 0) why = why.substr(dir.size() + 2);
    warnings.push_back(absl::StrCat(name, ": ", why));
  }
  return absl::DataLossError(
      absl::StrCat("no good checkpoint under ", root, ": ", absl::StrJoin(warnings, "; ")));
}

}  // namespace moetrain
