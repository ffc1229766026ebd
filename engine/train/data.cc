#include "engine/train/data.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/core/json.h"
#include "engine/core/status.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

// The shuffle's Rng stream under the config's seed (step = epoch). Synthetic data uses other
// stream ids of the same seed (synthetic.cc), so the two never share words.
constexpr uint32_t kShuffleStream = 16;
constexpr int kFeistelRounds = 6;
// A batch is one i32 tensor; beyond this it is surely a typo.
constexpr int64_t kMaxBatchTokens = int64_t{1} << 31;

absl::Status Invalid(absl::string_view field, auto value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("data.", field, " = ", value, " ", why));
}

absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

TokenFileFormat FileFormat(DataConfig::Format format) {
  switch (format) {
    case DataConfig::Format::kLlmc:
      return TokenFileFormat::kLlmc;
    case DataConfig::Format::kU16:
      return TokenFileFormat::kU16;
    case DataConfig::Format::kU32:
      return TokenFileFormat::kU32;
    default:
      return TokenFileFormat::kText;
  }
}

// json[key] as an int64_t >= 0; InvalidArgument naming `what` ("data position") and the key.
absl::StatusOr<int64_t> NonNegativeInteger(const nlohmann::json& json, absl::string_view what,
                                           const char* key) {
  const auto it = json.find(key);
  if (it == json.end()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": missing \"", key, "\""));
  }
  const bool fits = it->is_number_unsigned()
                        ? it->get<uint64_t>() <= uint64_t{std::numeric_limits<int64_t>::max()}
                        : it->is_number_integer() && it->get<int64_t>() >= 0;
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": \"", key, "\" = ", JsonExcerpt(*it),
                                                   " is not a non-negative 64-bit integer"));
  }
  return it->get<int64_t>();
}

// "1664 bytes, modified 2024-04-25T00:53:20.123456789Z".
std::string DescribeFile(const DataFileStamp& stamp) {
  return absl::StrCat(stamp.bytes, " bytes, modified ",
                      absl::FormatTime("%Y-%m-%dT%H:%M:%E9SZ", absl::FromUnixNanos(stamp.mtime_ns),
                                       absl::UTCTimeZone()));
}

}  // namespace

// The data and how it is cut into windows; shared by a loader and its eval iterators.
struct DataLoader::Source {
  std::optional<TokenFile> file;
  std::optional<SyntheticSource> synthetic;
  int64_t window_tokens = 0;  // S + 1
  int64_t train_windows = 0;  // per epoch; unused for synthetic data (unbounded)
  int64_t eval_begin = 0;     // first held-out token of the file
  int64_t eval_windows = 0;

  absl::Status ReadTrain(int64_t window, int32_t* out) const {
    if (!synthetic) return file->Read(window * window_tokens, window_tokens, out);
    synthetic->Read(SyntheticSource::Split::kTrain, window * window_tokens, window_tokens, out);
    return absl::OkStatus();
  }
  absl::Status ReadEval(int64_t window, int32_t* out) const {
    if (!synthetic) return file->Read(eval_begin + window * window_tokens, window_tokens, out);
    synthetic->Read(SyntheticSource::Split::kEval, window * window_tokens, window_tokens, out);
    return absl::OkStatus();
  }
};

absl::Status DataConfig::Validate() const {
  if (format != Format::kLlmc && format != Format::kU16 && format != Format::kU32 &&
      format != Format::kText && format != Format::kSynthetic) {
    return Invalid("format", static_cast<int>(format), "is not a data format");
  }
  if (vocab_size < 1 || vocab_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.vocab_size = ", vocab_size, " must be in [1, 2147483647]"));
  }
  if (seq_len < 1) return Invalid("seq_len", seq_len, "must be at least 1");
  if (batch_size < 1) return Invalid("batch_size", batch_size, "must be at least 1");
  if (extra_tokens < 0) return Invalid("extra_tokens", extra_tokens, "must not be negative");
  const int64_t window = seq_len + 1 + std::max<int64_t>(extra_tokens, 0);
  if (window >= kMaxBatchTokens || window * batch_size > kMaxBatchTokens) {
    return Invalid("batch_size", batch_size,
                   absl::StrCat("of data.seq_len + 1 = ", window,
                                " tokens is more than 2^31 tokens per batch"));
  }
  if (!(eval_fraction >= 0.0 && eval_fraction < 1.0)) {
    return Invalid("eval_fraction", eval_fraction, "must be in [0, 1)");
  }
  if (format == Format::kSynthetic) {
    MOETRAIN_RETURN_IF_ERROR(synthetic_config().Validate());
    if (synthetic_vocab_size > vocab_size) {
      return Invalid("synthetic_vocab_size", synthetic_vocab_size,
                     absl::StrCat("exceeds model.vocab_size = ", vocab_size));
    }
    if (synthetic_eval_sequences < 0) {
      return Invalid("synthetic_eval_sequences", synthetic_eval_sequences, "must not be negative");
    }
    return absl::OkStatus();
  }
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.path is empty; data.format = ", ToAbsl(DataFormatName(format)), " reads a file"));
  }
  if (format == Format::kText && vocab_size < kByteVocabSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.vocab_size = ", vocab_size, " is below ", kByteVocabSize,
                     ", the byte-level vocabulary of data.format = text"));
  }
  return absl::OkStatus();
}

std::string_view DataFormatName(DataConfig::Format format) {
  switch (format) {
    case DataConfig::Format::kLlmc:
      return "llmc";
    case DataConfig::Format::kU16:
      return "u16";
    case DataConfig::Format::kU32:
      return "u32";
    case DataConfig::Format::kText:
      return "text";
    case DataConfig::Format::kSynthetic:
      return "synthetic";
  }
  return "unknown";
}

absl::StatusOr<DataConfig::Format> ParseDataFormat(std::string_view name) {
  for (DataConfig::Format format :
       {DataConfig::Format::kLlmc, DataConfig::Format::kU16, DataConfig::Format::kU32,
        DataConfig::Format::kText, DataConfig::Format::kSynthetic}) {
    if (DataFormatName(format) == name) return format;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "data.format = \"", ToAbsl(name), "\" is not one of llmc, u16, u32, text, synthetic"));
}

nlohmann::json DataPosition::ToJson() const { return {{"epoch", epoch}, {"index", index}}; }

absl::StatusOr<DataPosition> DataPosition::FromJson(const nlohmann::json& json) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data position: expected an object, got ", JsonExcerpt(json)));
  }
  DataPosition position;
  MOETRAIN_ASSIGN_OR_RETURN(position.epoch, NonNegativeInteger(json, "data position", "epoch"));
  MOETRAIN_ASSIGN_OR_RETURN(position.index, NonNegativeInteger(json, "data position", "index"));
  return position;
}

nlohmann::json DataFileStamp::ToJson() const {
  return {{"path", path}, {"bytes", bytes}, {"mtime_ns", mtime_ns}};
}

absl::StatusOr<DataFileStamp> DataFileStamp::FromJson(const nlohmann::json& json) {
  constexpr absl::string_view kWhat = "data position file";
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": expected an object, got ", JsonExcerpt(json)));
  }
  DataFileStamp stamp;
  const auto path = json.find("path");
  if (path == json.end() || !path->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": \"path\" is missing or not a string"));
  }
  stamp.path = path->get<std::string>();
  MOETRAIN_ASSIGN_OR_RETURN(stamp.bytes, NonNegativeInteger(json, kWhat, "bytes"));
  MOETRAIN_ASSIGN_OR_RETURN(stamp.mtime_ns, NonNegativeInteger(json, kWhat, "mtime_ns"));
  return stamp;
}

WindowShuffle::WindowShuffle(int64_t n, uint64_t seed, int64_t epoch)
    : n_(n), rng_(seed, static_cast<uint64_t>(epoch), 0, kShuffleStream) {
  half_bits_ = 1;
  while (half_bits_ < 31 && (uint64_t{1} << (2 * half_bits_)) < static_cast<uint64_t>(n)) {
    ++half_bits_;
  }
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
}

uint64_t WindowShuffle::Feistel(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & half_mask_;
  for (int round = 0; round < kFeistelRounds; ++round) {
    const uint64_t mixed = left ^ (rng_.Bits(uint64_t(round) << 32 | right) & half_mask_);
    left = right;
    right = mixed;
  }
  return left << half_bits_ | right;
}

int64_t WindowShuffle::operator()(int64_t k) const {
  // A permutation of the larger domain maps k's cycle back into [0, n) after at most a few
  // steps on average (the domain is at most 4n).
  uint64_t x = Feistel(static_cast<uint64_t>(k));
  while (x >= static_cast<uint64_t>(n_)) x = Feistel(x);
  return static_cast<int64_t>(x);
}

absl::StatusOr<DataLoader> DataLoader::Create(const DataConfig& config, int rank, int world_size) {
  MOETRAIN_RETURN_IF_ERROR(config.Validate());
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world_size = ", world_size, " must be >= 1"));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank = ", rank, " must be in [0, world_size = ", world_size, ")"));
  }
  if (config.batch_size % world_size != 0) {
    return Invalid("batch_size", config.batch_size,
                   absl::StrCat("is not a multiple of world_size = ", world_size));
  }

  auto source = std::make_shared<Source>();
  const int64_t window = config.seq_len + 1 + config.extra_tokens;
  const std::string window_name =
      config.extra_tokens > 0 ? "seq_len + 1 + model.mtp_depth = " : "seq_len + 1 = ";
  source->window_tokens = window;
  if (config.format == DataConfig::Format::kSynthetic) {
    MOETRAIN_ASSIGN_OR_RETURN(SyntheticSource synthetic,
                              SyntheticSource::Create(config.synthetic_config()));
    source->synthetic = std::move(synthetic);
    source->eval_windows = config.synthetic_eval_sequences;
  } else {
    MOETRAIN_ASSIGN_OR_RETURN(
        TokenFile file,
        TokenFile::Open(config.path, FileFormat(config.format), config.vocab_size, window));
    const int64_t total = file.num_tokens();
    const auto held_out =
        static_cast<int64_t>(std::floor(config.eval_fraction * static_cast<double>(total)));
    const int64_t train_tokens = total - held_out;
    const std::string split =
        absl::StrCat("data.eval_fraction = ", config.eval_fraction, " holds out ", held_out,
                     " of the ", total, " tokens of data.path ", config.path);
    if (train_tokens < window) {
      return absl::InvalidArgumentError(absl::StrCat(split, ", leaving ", train_tokens,
                                                     " for training, fewer than one sequence of ",
                                                     window_name, window));
    }
    if (config.eval_fraction > 0.0 && held_out < window) {
      return absl::InvalidArgumentError(absl::StrCat(split, ", fewer than one sequence of ",
                                                     window_name, window,
                                                     " (0 turns the eval set off)"));
    }
    source->train_windows = train_tokens / window;
    source->eval_begin = train_tokens;
    source->eval_windows = held_out / window;
    source->file = std::move(file);
  }

  DataLoader loader;
  loader.config_ = config;
  loader.rank_ = rank;
  loader.world_size_ = world_size;
  loader.source_ = std::move(source);
  return loader;
}

absl::StatusOr<Tensor> DataLoader::Next() {
  const int64_t rows = local_batch_size();
  const int64_t window = source_->window_tokens;
  Tensor batch = Tensor::Empty(DType::kI32, {rows, window});
  int32_t* out = batch.data<int32_t>();
  const int64_t first = position_.index + rank_ * rows;  // place of row 0 in the window order
  if (source_->synthetic) {
    for (int64_t j = 0; j < rows; ++j) {
      MOETRAIN_RETURN_IF_ERROR(source_->ReadTrain(first + j, out + j * window));
    }
    position_.index += config_.batch_size;
    return batch;
  }
  const int64_t per_epoch = source_->train_windows;
  // Rows past the epoch's end come from the following epochs' orders.
  for (int64_t j = 0; j < rows; ++j) {
    const int64_t place = first + j;
    const WindowShuffle shuffle(per_epoch, config_.seed, position_.epoch + place / per_epoch);
    MOETRAIN_RETURN_IF_ERROR(source_->ReadTrain(shuffle(place % per_epoch), out + j * window));
  }
  const int64_t next = position_.index + config_.batch_size;
  position_ = {position_.epoch + next / per_epoch, next % per_epoch};
  return batch;
}

absl::Status DataLoader::Restore(const DataPosition& position) {
  if (position.epoch < 0 || position.index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("data position (epoch ", position.epoch,
                                                   ", index ", position.index,
                                                   ") must not be negative"));
  }
  if (source_->synthetic && position.epoch != 0) {
    return absl::InvalidArgumentError(absl::StrCat("data position epoch ", position.epoch,
                                                   " is not 0: synthetic data has a single epoch"));
  }
  if (!source_->synthetic && position.index >= source_->train_windows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data position index ", position.index, " is past the ", source_->train_windows,
        " training windows per epoch of data.path ", config_.path, " (another data set?)"));
  }
  position_ = position;
  return absl::OkStatus();
}

std::optional<DataFileStamp> DataLoader::file_stamp() const {
  if (!source_->file) return std::nullopt;
  return DataFileStamp{config_.path, source_->file->file_bytes(), source_->file->mtime_ns()};
}

absl::Status DataLoader::CheckSameFile(const std::optional<DataFileStamp>& recorded) const {
  const std::optional<DataFileStamp> now = file_stamp();
  if (!recorded.has_value()) return absl::OkStatus();
  if (!now.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint was trained on data.path ",
                                                      recorded->path, " (", recorded->bytes,
                                                      " bytes), and this job's data is synthetic"));
  }
  if (now->bytes == recorded->bytes && now->mtime_ns == recorded->mtime_ns) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "data.path ", now->path, " has changed since the checkpoint was written: it had ",
      DescribeFile(*recorded),
      recorded->path == now->path ? "" : absl::StrCat(" (as ", recorded->path, ")"), "; it has ",
      DescribeFile(*now),
      " now. Resuming would read other windows than the checkpoint's data position counts: "
      "restore the file (cp -p keeps its modification time), or train on the new data in a new "
      "job"));
}

EvalIterator DataLoader::Eval() const {
  EvalIterator eval;
  eval.source_ = source_;
  eval.batch_size_ = config_.batch_size;
  eval.rank_ = rank_;
  eval.world_size_ = world_size_;
  eval.num_batches_ = (source_->eval_windows + config_.batch_size - 1) / config_.batch_size;
  return eval;
}

std::optional<int64_t> DataLoader::windows_per_epoch() const {
  if (source_->synthetic) return std::nullopt;
  return source_->train_windows;
}

int64_t DataLoader::num_eval_windows() const { return source_->eval_windows; }

const SyntheticSource* DataLoader::synthetic() const {
  return source_->synthetic ? &*source_->synthetic : nullptr;
}

absl::StatusOr<std::optional<Tensor>> EvalIterator::Next() {
  if (next_batch_ >= num_batches_) return std::nullopt;
  const int64_t begin = next_batch_ * batch_size_;
  const int64_t count = std::min(batch_size_, source_->eval_windows - begin);
  const int64_t row_begin = begin + rank_ * count / world_size_;
  const int64_t row_end = begin + (rank_ + 1) * count / world_size_;
  const int64_t window = source_->window_tokens;
  Tensor batch = Tensor::Empty(DType::kI32, {row_end - row_begin, window});
  for (int64_t w = row_begin; w < row_end; ++w) {
    MOETRAIN_RETURN_IF_ERROR(
        source_->ReadEval(w, batch.data<int32_t>() + (w - row_begin) * window));
  }
  ++next_batch_;
  return std::optional<Tensor>(std::move(batch));
}

}  // namespace moetrain
