#include "engine/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/core/json.h"
#include "engine/core/log.h"
#include "engine/core/status.h"
#include "engine/train/input_file.h"
#include "engine/train/safetensors.h"

namespace moetrain {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr char kManifestName[] = "manifest.json";
constexpr char kConfigName[] = "config.json";
constexpr char kStepPrefix[] = "step-";
constexpr char kTmpPrefix[] = ".tmp-";
// A damaged step directory moved out of the way of a new write of its step (BeginCheckpoint).
constexpr char kDamagedPrefix[] = ".damaged-";
constexpr int kMaxRankIndex = 99999;  // five digits in the file names
// The manifest's own keys, which the trainer's sections may not reuse.
constexpr const char* kReservedKeys[] = {"format_version", "job_id", "step", "tokens_seen",
                                         "files"};

std::string Join(const fs::path& dir, std::string_view name) { return (dir / name).string(); }

absl::Status FsError(const std::error_code& ec, const std::string& what) {
  return IoError(ec.value(), what);
}

std::string RandomSuffix() { return absl::StrFormat("%016x", NewCheckpointNonce()); }

// The step of a canonical step directory name ("step-00000100"), or -1.
int64_t ParseStepDirName(const std::string& name) {
  const size_t prefix = sizeof(kStepPrefix) - 1;
  if (name.size() < prefix + 8 || name.size() > prefix + 18 || name.rfind(kStepPrefix, 0) != 0) {
    return -1;
  }
  int64_t step = 0;
  for (size_t i = prefix; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return CheckpointStepDirName(step) == name ? step : -1;
}

template <typename AnyJson>
absl::StatusOr<std::string> DumpJson(const AnyJson& value, std::string_view what) {
  try {
    return value.dump(2) + "\n";
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), " cannot be written as JSON: ", e.what()));
  }
}

// The most a checkpoint's manifest.json or config.json may hold: a manifest lists 2 files a rank
// (about 300 KB at 1,024 ranks), a config.json is a few KB.
constexpr int64_t kMaxCheckpointJsonBytes = int64_t{16} << 20;

// `name` of the step directory `dir`, which must be a regular file there (no link, FIFO or
// device: a checkpoint can come from anyone, as init_from does) of bounded size.
absl::StatusOr<std::string> ReadCheckpointJson(const std::string& dir, const char* name) {
  MOETRAIN_ASSIGN_OR_RETURN(const InputFile file,
                            OpenInputFile(dir, name, kMaxCheckpointJsonBytes));
  return file.ReadAll();
}

// The step directories and the leftovers (.tmp-*, .damaged-*) directly under a root.
struct RootListing {
  bool root_exists = false;
  std::vector<int64_t> steps;         // ascending
  std::vector<std::string> tmp_dirs;  // names of the leftovers, sorted
};

absl::StatusOr<RootListing> ListRoot(const std::string& root) {
  RootListing listing;
  std::error_code ec;
  if (!fs::exists(root, ec)) {
    if (ec) return FsError(ec, absl::StrCat("stat ", root));
    return listing;
  }
  listing.root_exists = true;
  fs::directory_iterator it(root, ec);
  if (ec) return FsError(ec, absl::StrCat("list ", root));
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return FsError(ec, absl::StrCat("list ", root));
    if (!it->is_directory(ec)) continue;
    const std::string name = it->path().filename().string();
    if (name.rfind(kTmpPrefix, 0) == 0 || name.rfind(kDamagedPrefix, 0) == 0) {
      listing.tmp_dirs.push_back(name);
    } else if (const int64_t step = ParseStepDirName(name); step >= 0) {
      listing.steps.push_back(step);
    }
  }
  if (ec) return FsError(ec, absl::StrCat("list ", root));
  std::sort(listing.steps.begin(), listing.steps.end());
  std::sort(listing.tmp_dirs.begin(), listing.tmp_dirs.end());
  return listing;
}

// ---------------------------------------------------------------------------------------------
// The manifest. Errors below name the file but not the directory; callers prefix that.

struct ManifestFile {
  std::string name;
  int64_t bytes;
  std::string sha256;
};

struct Manifest {
  Json json;
  int64_t step;
  int64_t tokens_seen;
  std::vector<ManifestFile> files;
};

absl::Status Damaged(absl::string_view what) { return absl::DataLossError(what); }

absl::StatusOr<int64_t> GetInteger(const Json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number_integer() ||
      (it->is_number_unsigned() &&
       it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
    return Damaged(absl::StrCat(where, ": \"", key, "\" is missing or not an integer"));
  }
  return it->get<int64_t>();
}

absl::StatusOr<std::string> GetString(const Json& object, const char* key,
                                      const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_string()) {
    return Damaged(absl::StrCat(where, ": \"", key, "\" is missing or not a string"));
  }
  return it->get<std::string>();
}

bool IsSha256Hex(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// Parses and checks the manifest of `dir`, whose name gives `dir_step` (-1: not a step name).
absl::StatusOr<Manifest> ReadManifest(const std::string& dir, int64_t dir_step) {
  absl::StatusOr<std::string> text = ReadCheckpointJson(dir, kManifestName);
  if (!text.ok()) {
    return Damaged(
        absl::StrCat(kManifestName, " is missing or unreadable: ", text.status().message()));
  }
  Manifest manifest;
  absl::StatusOr<Json> parsed = ParseJson(*text, kManifestName);
  if (!parsed.ok()) return Damaged(parsed.status().message());
  manifest.json = *std::move(parsed);
  if (!manifest.json.is_object()) return Damaged(absl::StrCat(kManifestName, " is no object"));
  MOETRAIN_ASSIGN_OR_RETURN(const int64_t version,
                            GetInteger(manifest.json, "format_version", kManifestName));
  if (version < kOldestCheckpointFormatVersion || version > kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        kManifestName, ": format_version ", version, " is not supported (this build reads ",
        kOldestCheckpointFormatVersion, " to ", kCheckpointFormatVersion, ")"));
  }
  MOETRAIN_ASSIGN_OR_RETURN(manifest.step, GetInteger(manifest.json, "step", kManifestName));
  if (dir_step >= 0 && manifest.step != dir_step) {
    return Damaged(absl::StrCat(kManifestName, " says step ", manifest.step,
                                ", the directory name says ", dir_step));
  }
  MOETRAIN_ASSIGN_OR_RETURN(manifest.tokens_seen,
                            GetInteger(manifest.json, "tokens_seen", kManifestName));
  MOETRAIN_RETURN_IF_ERROR(GetString(manifest.json, "job_id", kManifestName).status());
  const auto files = manifest.json.find("files");
  if (files == manifest.json.end() || !files->is_array()) {
    return Damaged(absl::StrCat(kManifestName, ": \"files\" is missing or not an array"));
  }
  for (const Json& entry : *files) {
    const std::string where = absl::StrCat(kManifestName, ": a \"files\" entry");
    if (!entry.is_object()) return Damaged(absl::StrCat(where, " is not an object"));
    ManifestFile file;
    MOETRAIN_ASSIGN_OR_RETURN(file.name, GetString(entry, "name", where));
    MOETRAIN_ASSIGN_OR_RETURN(file.bytes, GetInteger(entry, "bytes", where));
    MOETRAIN_ASSIGN_OR_RETURN(file.sha256, GetString(entry, "sha256", where));
    // Names come from a file on disk: never let one reach outside the directory.
    if (file.name.empty() || file.name == "." || file.name == ".." ||
        file.name.find('/') != std::string::npos || file.bytes < 0 || !IsSha256Hex(file.sha256)) {
      return Damaged(absl::StrCat(where, " is malformed: ", JsonExcerpt(entry)));
    }
    manifest.files.push_back(std::move(file));
  }
  return manifest;
}

// Every listed file exists with its listed size (no checksums: this is the cheap check).
absl::Status CheckFileSizes(const std::string& dir, const Manifest& manifest) {
  for (const ManifestFile& file : manifest.files) {
    std::error_code ec;
    const uintmax_t bytes = fs::file_size(Join(dir, file.name), ec);
    if (ec) return Damaged(absl::StrCat(file.name, " is missing (", ec.message(), ")"));
    if (static_cast<int64_t>(bytes) != file.bytes) {
      return Damaged(
          absl::StrCat(file.name, " has ", bytes, " bytes, ", kManifestName, " says ", file.bytes));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, Tensor>> ReadTensorFile(const std::string& path) {
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  if (!file.ok()) return Damaged(file.status().message());
  return file->TakeTensors();
}

absl::Status CheckRank(int rank) {
  if (rank < 0 || rank > kMaxRankIndex) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank = ", rank, " must be in [0, ", kMaxRankIndex, "]"));
  }
  return absl::OkStatus();
}

// Hashes `name` and compares it with its manifest entry.
absl::Status VerifyListedFile(const std::string& dir, const Manifest& manifest,
                              const std::string& name) {
  const auto listed = std::find_if(manifest.files.begin(), manifest.files.end(),
                                   [&](const ManifestFile& f) { return f.name == name; });
  if (listed == manifest.files.end()) {
    return Damaged(absl::StrCat(kManifestName, " lists no ", name));
  }
  MOETRAIN_ASSIGN_OR_RETURN(const FileDigest digest, DigestFile(Join(dir, name)));
  if (digest.sha256 != listed->sha256) {
    return Damaged(absl::StrCat(name, " sha256 mismatch (manifest ", listed->sha256.substr(0, 12),
                                "..., file ", digest.sha256.substr(0, 12), "...)"));
  }
  return absl::OkStatus();
}

// Reads a tensor file into `into`; a name already there is damage (two files claim it).
absl::Status MergeTensorFile(const std::string& dir, const std::string& name,
                             std::map<std::string, Tensor>* into) {
  absl::StatusOr<std::map<std::string, Tensor>> tensors = ReadTensorFile(Join(dir, name));
  if (!tensors.ok()) return tensors.status();
  for (auto& [key, tensor] : *tensors) {
    if (!into->emplace(key, std::move(tensor)).second) {
      return Damaged(absl::StrCat(name, ": tensor ", key, " is in another rank file too"));
    }
  }
  return absl::OkStatus();
}

// LoadCheckpoint without the directory in its messages.
absl::StatusOr<LoadedCheckpoint> LoadStep(const std::string& dir,
                                          const CheckpointReadOptions& options) {
  for (int rank : options.ranks) MOETRAIN_RETURN_IF_ERROR(CheckRank(rank));
  MOETRAIN_ASSIGN_OR_RETURN(Manifest manifest,
                            ReadManifest(dir, ParseStepDirName(fs::path(dir).filename().string())));
  MOETRAIN_RETURN_IF_ERROR(CheckFileSizes(dir, manifest));
  // Other ranks' files were size-checked above; each rank hashes only what it reads.
  std::vector<std::string> model_names, optim_names;
  for (int rank : options.ranks) {
    model_names.push_back(ModelFileName(rank));
    if (options.optimizer) optim_names.push_back(OptimFileName(rank));
  }
  for (const std::string& name : model_names)
    MOETRAIN_RETURN_IF_ERROR(VerifyListedFile(dir, manifest, name));
  for (const std::string& name : optim_names)
    MOETRAIN_RETURN_IF_ERROR(VerifyListedFile(dir, manifest, name));
  MOETRAIN_RETURN_IF_ERROR(VerifyListedFile(dir, manifest, kConfigName));

  LoadedCheckpoint loaded;
  loaded.path = dir;
  loaded.step = manifest.step;
  loaded.tokens_seen = manifest.tokens_seen;
  loaded.ranks = options.ranks;
  absl::StatusOr<std::string> config_text = ReadCheckpointJson(dir, kConfigName);
  if (!config_text.ok()) return Damaged(config_text.status().message());
  absl::StatusOr<Json> config = ParseJson(*config_text, kConfigName);
  if (!config.ok()) return Damaged(config.status().message());
  loaded.hf_config = *std::move(config);
  for (const std::string& name : model_names) {
    MOETRAIN_RETURN_IF_ERROR(MergeTensorFile(dir, name, &loaded.model_tensors));
  }
  for (const std::string& name : optim_names) {
    MOETRAIN_RETURN_IF_ERROR(MergeTensorFile(dir, name, &loaded.optim_tensors));
  }
  loaded.manifest = std::move(manifest.json);
  return loaded;
}

// The whole step directory verified, every listed file hashed: what pruning keeps and what a
// new write of the step replaces (rather than refusing) when it fails with DataLoss.
absl::Status VerifyStep(const std::string& dir, int64_t step) {
  MOETRAIN_ASSIGN_OR_RETURN(const Manifest manifest, ReadManifest(dir, step));
  MOETRAIN_RETURN_IF_ERROR(CheckFileSizes(dir, manifest));
  for (const ManifestFile& file : manifest.files) {
    MOETRAIN_RETURN_IF_ERROR(VerifyListedFile(dir, manifest, file.name));
  }
  return absl::OkStatus();
}

// What a step directory holds: each regular file's name, size and modification time, sorted by
// name. Writing any file of the step (or replacing it) changes it.
using StepStamp = std::vector<std::tuple<std::string, uintmax_t, fs::file_time_type>>;

// The step directories this process has verified good, by path, with the stamp they had then:
// pruning hashes each older step once, not at every save, and again once any of its files
// changed.
struct VerifiedSteps {
  std::mutex mutex;
  std::map<std::string, StepStamp> steps;
};
VerifiedSteps& Verified() {
  static VerifiedSteps* const verified = new VerifiedSteps;
  return *verified;
}

// The directory's stamp, or nullopt when it cannot be listed or a file cannot be read.
std::optional<StepStamp> ReadStepStamp(const std::string& dir) {
  std::error_code ec;
  StepStamp stamp;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec) || ec) continue;
    const uintmax_t size = it->file_size(ec);
    if (ec) return std::nullopt;
    const fs::file_time_type mtime = it->last_write_time(ec);
    if (ec) return std::nullopt;
    stamp.emplace_back(it->path().filename().string(), size, mtime);
  }
  if (ec) return std::nullopt;
  std::sort(stamp.begin(), stamp.end());
  return stamp;
}

void RememberVerified(const std::string& dir) {
  std::optional<StepStamp> stamp = ReadStepStamp(dir);
  VerifiedSteps& verified = Verified();
  std::lock_guard<std::mutex> lock(verified.mutex);
  if (stamp.has_value()) {
    verified.steps[dir] = *std::move(stamp);
  } else {
    verified.steps.erase(dir);
  }
}

void ForgetVerified(const std::string& dir) {
  VerifiedSteps& verified = Verified();
  std::lock_guard<std::mutex> lock(verified.mutex);
  verified.steps.erase(dir);
}

// VerifyStep, skipped for a step this process verified good none of whose files changed since.
absl::Status VerifyStepOnce(const std::string& dir, int64_t step) {
  // Taken before hashing, so that a file changed while it is hashed is not vouched for.
  std::optional<StepStamp> stamp = ReadStepStamp(dir);
  VerifiedSteps& verified = Verified();
  if (stamp.has_value()) {
    std::lock_guard<std::mutex> lock(verified.mutex);
    const auto it = verified.steps.find(dir);
    if (it != verified.steps.end() && it->second == *stamp) return absl::OkStatus();
  }
  const absl::Status status = VerifyStep(dir, step);
  std::lock_guard<std::mutex> lock(verified.mutex);
  if (status.ok() && stamp.has_value()) {
    verified.steps[dir] = *std::move(stamp);
  } else {
    verified.steps.erase(dir);
  }
  return status;
}

absl::Status Prefixed(const absl::Status& status, const std::string& prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, ": ", status.message()));
}

absl::Status ValidateContents(const CheckpointContents& contents) {
  if (contents.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step = ", contents.step, " is negative"));
  }
  if (contents.tokens_seen < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens_seen = ", contents.tokens_seen, " is negative"));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckRank(contents.rank));
  if (!contents.sections.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sections must be a JSON object, got ", contents.sections.type_name()));
  }
  for (const char* key : kReservedKeys) {
    if (contents.sections.contains(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sections.", key, " would overwrite the manifest's own \"", key, "\""));
    }
  }
  return absl::OkStatus();
}

// Writes config.json and the manifest (listing `files` and config.json) into `dir`, fsyncing
// each, then `dir`.
absl::Status WriteManifestFiles(const std::string& dir, const std::string& job_id,
                                const CheckpointContents& contents,
                                std::vector<CheckpointFile> files) {
  MOETRAIN_ASSIGN_OR_RETURN(const std::string config, DumpJson(contents.hf_config, "hf_config"));
  MOETRAIN_ASSIGN_OR_RETURN(const FileDigest config_digest,
                            WriteFileSynced(Join(dir, kConfigName), config));
  files.push_back({kConfigName, config_digest.bytes, config_digest.sha256});
  nlohmann::ordered_json listed = nlohmann::ordered_json::array();
  for (const CheckpointFile& file : files) {
    listed.push_back({{"name", file.name}, {"bytes", file.bytes}, {"sha256", file.sha256}});
  }

  // Ordered so that a person reading the manifest sees the identity first and the files last.
  nlohmann::ordered_json manifest = {{"format_version", kCheckpointFormatVersion},
                                     {"job_id", job_id},
                                     {"step", contents.step},
                                     {"tokens_seen", contents.tokens_seen}};
  MOETRAIN_ASSIGN_OR_RETURN(const std::string sections, DumpJson(contents.sections, "sections"));
  const nlohmann::ordered_json ordered_sections = nlohmann::ordered_json::parse(sections);
  for (const auto& [key, value] : ordered_sections.items()) {
    manifest[key] = value;
  }
  manifest["files"] = std::move(listed);
  MOETRAIN_ASSIGN_OR_RETURN(const std::string manifest_text, DumpJson(manifest, "the manifest"));
  MOETRAIN_RETURN_IF_ERROR(WriteFileSynced(Join(dir, kManifestName), manifest_text).status());
  return SyncDirectory(dir);
}

// The root as a path without a trailing slash, and the job id it ends in.
absl::StatusOr<std::pair<fs::path, std::string>> SplitRoot(const std::string& root) {
  fs::path root_path = fs::path(root).lexically_normal();
  if (!root_path.has_filename()) root_path = root_path.parent_path();  // "a/b/" -> "a/b"
  std::string job_id = root_path.filename().string();
  if (job_id.empty() || job_id == "." || job_id == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint root \"", root, "\" does not end in a job id"));
  }
  return std::pair{std::move(root_path), std::move(job_id)};
}

// Renames `dir` out of the step namespace, then deletes it: a crash mid-delete leaves a .tmp-*
// leftover, never a half-deleted step that looks like a checkpoint.
absl::Status RemoveStepDir(const std::string& root, const std::string& name) {
  const std::string doomed = Join(root, absl::StrCat(kTmpPrefix, name, "-pruned-", RandomSuffix()));
  if (std::rename(Join(root, name).c_str(), doomed.c_str()) != 0) {
    return IoError(errno, absl::StrCat("rename ", Join(root, name)));
  }
  std::error_code ec;
  fs::remove_all(doomed, ec);
  if (ec) return FsError(ec, absl::StrCat("remove ", doomed));
  return absl::OkStatus();
}

}  // namespace

std::string CheckpointStepDirName(int64_t step) { return absl::StrFormat("step-%08d", step); }
std::string ModelFileName(int rank) { return absl::StrFormat("model-rank%05d.safetensors", rank); }
std::string OptimFileName(int rank) { return absl::StrFormat("optim-rank%05d.safetensors", rank); }

uint64_t NewCheckpointNonce() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) | device();
}

std::string CheckpointTempDir(const std::string& root, int64_t step, uint64_t nonce) {
  return Join(fs::path(root), absl::StrCat(kTmpPrefix, CheckpointStepDirName(step), "-",
                                           absl::StrFormat("%016x", nonce)));
}

absl::StatusOr<std::string> BeginCheckpoint(const std::string& root, int64_t step, uint64_t nonce,
                                            std::string* moved_aside) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step = ", step, " is negative"));
  MOETRAIN_ASSIGN_OR_RETURN(const auto split, SplitRoot(root));
  const fs::path& root_path = split.first;
  std::error_code ec;
  const bool created = fs::create_directories(root_path, ec);
  if (ec) return FsError(ec, absl::StrCat("create ", root_path.string()));
  if (created) {
    const fs::path parent = root_path.has_parent_path() ? root_path.parent_path() : fs::path(".");
    MOETRAIN_RETURN_IF_ERROR(SyncDirectory(parent.string()));
  }
  const std::string step_name = CheckpointStepDirName(step);
  const std::string final_dir = Join(root_path, step_name);
  if (fs::exists(final_dir, ec)) {
    // A damaged step (which resume passed over) would block this step for good: move it aside,
    // under a name that pruning removes. A good one, or one this build cannot judge, stays.
    const absl::Status verified = VerifyStep(final_dir, step);
    if (verified.code() != absl::StatusCode::kDataLoss) {
      return absl::AlreadyExistsError(absl::StrCat(final_dir, " already exists"));
    }
    const std::string aside =
        Join(root_path, absl::StrCat(kDamagedPrefix, step_name, "-", RandomSuffix()));
    if (std::rename(final_dir.c_str(), aside.c_str()) != 0) {
      return IoError(errno, absl::StrCat("rename damaged ", final_dir, " to ", aside));
    }
    MOETRAIN_RETURN_IF_ERROR(SyncDirectory(root_path.string()));
    if (moved_aside != nullptr) {
      *moved_aside = absl::StrCat(final_dir, " was damaged (", verified.message(), "): moved to ",
                                  aside, " to be pruned");
    }
  }
  const std::string tmp_dir = CheckpointTempDir(root_path.string(), step, nonce);
  if (!fs::create_directory(tmp_dir, ec)) {
    if (ec) return FsError(ec, absl::StrCat("create ", tmp_dir));
    return absl::AlreadyExistsError(absl::StrCat(tmp_dir, " already exists"));
  }
  return tmp_dir;
}

absl::StatusOr<std::vector<CheckpointFile>> WriteCheckpointShard(
    const std::string& tmp_dir, const CheckpointContents& contents) {
  MOETRAIN_RETURN_IF_ERROR(CheckRank(contents.rank));
  std::vector<CheckpointFile> files;
  // "pt" is the format tag Hugging Face transformers expects when it loads the weights.
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  for (const auto& [name, tensors] :
       {std::pair{ModelFileName(contents.rank), &contents.model_tensors},
        std::pair{OptimFileName(contents.rank), &contents.optim_tensors}}) {
    FileDigest digest;
    MOETRAIN_RETURN_IF_ERROR(WriteSafetensors(Join(tmp_dir, name), *tensors, metadata, &digest));
    files.push_back({name, digest.bytes, digest.sha256});
  }
  return files;
}

absl::StatusOr<std::string> CommitCheckpoint(const std::string& root, const std::string& tmp_dir,
                                             const CheckpointContents& contents,
                                             std::vector<CheckpointFile> files) {
  absl::Status status = ValidateContents(contents);
  absl::StatusOr<std::pair<fs::path, std::string>> split = SplitRoot(root);
  if (status.ok()) status = split.status();
  std::string final_dir;
  if (status.ok()) {
    final_dir = Join(split->first, CheckpointStepDirName(contents.step));
    status = WriteManifestFiles(tmp_dir, split->second, contents, std::move(files));
  }
  if (status.ok() && std::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) {
    const int error_number = errno;
    status = error_number == EEXIST || error_number == ENOTEMPTY
                 ? absl::AlreadyExistsError(absl::StrCat(final_dir, " already exists"))
                 : IoError(error_number, absl::StrCat("rename to ", final_dir));
  }
  if (!status.ok()) {
    AbandonCheckpoint(tmp_dir);
    return status;
  }
  MOETRAIN_RETURN_IF_ERROR(SyncDirectory(split->first.string()));
  return final_dir;
}

void AbandonCheckpoint(const std::string& tmp_dir) {
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);  // best effort: a leftover is harmless and pruned later
}

absl::StatusOr<std::string> WriteCheckpoint(const std::string& root,
                                            const CheckpointContents& contents) {
  MOETRAIN_RETURN_IF_ERROR(ValidateContents(contents));
  MOETRAIN_ASSIGN_OR_RETURN(const std::string tmp_dir,
                            BeginCheckpoint(root, contents.step, NewCheckpointNonce()));
  absl::StatusOr<std::vector<CheckpointFile>> files = WriteCheckpointShard(tmp_dir, contents);
  if (!files.ok()) {
    AbandonCheckpoint(tmp_dir);
    return files.status();
  }
  return CommitCheckpoint(root, tmp_dir, contents, *std::move(files));
}

absl::StatusOr<std::vector<int64_t>> ListCheckpointSteps(const std::string& root) {
  MOETRAIN_ASSIGN_OR_RETURN(RootListing listing, ListRoot(root));
  return std::move(listing.steps);
}

absl::Status PruneCheckpoints(const std::string& root, int keep_last, int64_t committed_step) {
  if (keep_last < 1) {
    return absl::InvalidArgumentError(absl::StrCat("keep_last = ", keep_last, " must be >= 1"));
  }
  MOETRAIN_ASSIGN_OR_RETURN(const RootListing listing, ListRoot(root));
  for (const std::string& name : listing.tmp_dirs) {
    std::error_code ec;
    fs::remove_all(Join(root, name), ec);
    if (ec) return FsError(ec, absl::StrCat("remove ", Join(root, name)));
  }
  int kept = 0;
  for (auto it = listing.steps.rbegin(); it != listing.steps.rend(); ++it) {
    const std::string name = CheckpointStepDirName(*it);
    const std::string dir = Join(root, name);
    if (kept < keep_last) {
      if (*it == committed_step) {  // its digests were taken as it was written
        RememberVerified(dir);
        ++kept;
        continue;
      }
      // Checksums too: a bit-flipped step kept here would take the place of a good older one.
      const absl::Status verified = VerifyStepOnce(dir, *it);
      if (verified.ok()) {
        ++kept;
        continue;
      }
      if (verified.code() != absl::StatusCode::kDataLoss) {
        // Not found damaged, only not judged (a newer build's manifest, a failed read): kept,
        // without taking the place of a good step.
        Log(absl::StrCat("checkpoint ", dir, " kept, not verified: ", verified.ToString()));
        continue;
      }
    }
    ForgetVerified(dir);
    MOETRAIN_RETURN_IF_ERROR(RemoveStepDir(root, name));
  }
  return listing.root_exists ? SyncDirectory(root) : absl::OkStatus();
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& step_dir,
                                                const CheckpointReadOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(step_dir, ec)) {
    return absl::NotFoundError(absl::StrCat(step_dir, ": no such checkpoint directory"));
  }
  absl::StatusOr<LoadedCheckpoint> loaded = LoadStep(step_dir, options);
  if (!loaded.ok()) return Prefixed(loaded.status(), step_dir);
  return loaded;
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& step_dir, int rank) {
  return LoadCheckpoint(step_dir, CheckpointReadOptions{.ranks = {rank}});
}

absl::StatusOr<nlohmann::json> LoadCheckpointManifest(const std::string& step_dir) {
  std::error_code ec;
  if (!fs::is_directory(step_dir, ec)) {
    return absl::NotFoundError(absl::StrCat(step_dir, ": no such checkpoint directory"));
  }
  absl::StatusOr<Manifest> manifest =
      ReadManifest(step_dir, ParseStepDirName(fs::path(step_dir).filename().string()));
  absl::Status status = manifest.status();
  if (status.ok()) status = CheckFileSizes(step_dir, *manifest);
  if (!status.ok()) return Prefixed(status, step_dir);
  return std::move(manifest->json);
}

absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& root, int rank) {
  MOETRAIN_ASSIGN_OR_RETURN(const RootListing listing, ListRoot(root));
  std::vector<std::string> warnings;
  for (const std::string& name : listing.tmp_dirs) {
    warnings.push_back(absl::StrCat(name, name.rfind(kDamagedPrefix, 0) == 0
                                              ? ": a damaged step moved aside, ignored"
                                              : ": an unfinished write or removal, ignored"));
  }
  if (listing.steps.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoint under ", root, warnings.empty() ? "" : " (",
                     absl::StrJoin(warnings, "; "), warnings.empty() ? "" : ")"));
  }
  for (auto it = listing.steps.rbegin(); it != listing.steps.rend(); ++it) {
    const std::string name = CheckpointStepDirName(*it);
    absl::StatusOr<LoadedCheckpoint> loaded =
        LoadStep(Join(root, name), CheckpointReadOptions{.ranks = {rank}});
    if (loaded.ok()) {
      loaded->warnings = std::move(warnings);
      return loaded;
    }
    if (loaded.status().code() == absl::StatusCode::kInvalidArgument) return loaded.status();
    warnings.push_back(absl::StrCat(name, ": ", loaded.status().message()));
  }
  return absl::DataLossError(
      absl::StrCat("no good checkpoint under ", root, ": ", absl::StrJoin(warnings, "; ")));
}

}  // namespace moetrain
