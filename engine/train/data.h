// Training data input: token files or the synthetic Markov source, cut into windows of
// seq_len + 1 tokens and served as batches, deterministically from the seed.
//
// Windows. A file's tokens are split into a training part and, at the end, a held-out part of
// floor(eval_fraction · N) tokens. Each part is cut into non-overlapping windows of S + 1
// tokens from its start (a tail shorter than a window is unused), so no training window shares
// a token with an eval window. The synthetic source has an unbounded training stream and a
// separate eval stream, both cut the same way.
//
// Order. Epoch e visits every training window once, in a permutation computed from (seed, e);
// the epochs follow one another as one sequence of windows, and global batch b is the next
// batch_size windows of it (a batch may span an epoch boundary). The synthetic stream has no
// repeats: its windows are taken in order and the epoch stays 0.
//
// Ranks. Rank r of world_size W takes rows [r·B/W, (r+1)·B/W) of every global batch, so the
// ranks' slices are disjoint and together are the global batch.
#ifndef MOETRAIN_ENGINE_TRAIN_DATA_H_
#define MOETRAIN_ENGINE_TRAIN_DATA_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/core/rng.h"
#include "engine/core/tensor.h"
#include "engine/train/synthetic.h"
#include "engine/train/token_file.h"
#include "nlohmann/json_fwd.hpp"

namespace moetrain {

struct DataConfig {
  enum class Format { kLlmc, kU16, kU32, kText, kSynthetic };

  Format format = Format::kSynthetic;
  std::string path;          // the token file; unused (and may be empty) for kSynthetic
  int64_t vocab_size = 256;  // model.vocab_size: every token id must be below it
  int64_t seq_len = 256;     // S: a sequence has S inputs and S targets (S + 1 tokens)
  // Tokens each window carries past S + 1: model.mtp_depth, whose modules read that far ahead.
  // A window is S + 1 + extra_tokens tokens. The trainer sets it from the model.
  int64_t extra_tokens = 0;
  int64_t batch_size = 8;  // B: sequences per global batch, over all ranks
  uint64_t seed = 0;       // the shuffle of every epoch; for kSynthetic also the chain
  // Files: the last floor(eval_fraction · N) tokens are held out for eval; 0 = no eval set.
  // When positive it must hold at least one window.
  double eval_fraction = 0.05;

  // kSynthetic only (see SyntheticConfig).
  int64_t synthetic_vocab_size = 256;      // V, at most vocab_size
  int64_t synthetic_branching = 4;         // likely successors of each token
  double synthetic_noise = 0.05;           // mass spread uniformly over all V
  int64_t synthetic_eval_sequences = 256;  // windows in the synthetic eval set

  // OK, or InvalidArgument naming the field and its value ("data.seq_len = 0 must be at least
  // 1"). Does not touch the file.
  absl::Status Validate() const;

  SyntheticConfig synthetic_config() const {
    return {synthetic_vocab_size, synthetic_branching, synthetic_noise, seed};
  }
};

// "llmc", "u16", "u32", "text", "synthetic" and back; InvalidArgument naming the value otherwise.
std::string_view DataFormatName(DataConfig::Format format);
absl::StatusOr<DataConfig::Format> ParseDataFormat(std::string_view name);

// Where the loader stands: the next window is number `index` of epoch `epoch`'s order. The same
// on every rank; saved in the checkpoint manifest.
struct DataPosition {
  int64_t epoch = 0;
  int64_t index = 0;

  bool operator==(const DataPosition&) const = default;

  // {"epoch": 1, "index": 120}.
  nlohmann::json ToJson() const;
  // InvalidArgument unless `json` is an object with non-negative integers "epoch" and "index".
  static absl::StatusOr<DataPosition> FromJson(const nlohmann::json& json);
};

// A data file as the loader found it when it opened it. A checkpoint records it beside the data
// position ("data_position": {..., "file": {"path", "bytes", "mtime_ns"}}), so that a resume over a
// file that changed since, whose windows are no longer the ones the position counts, is refused.
struct DataFileStamp {
  std::string path;
  int64_t bytes = 0;
  int64_t mtime_ns = 0;  // st_mtim, in nanoseconds since the Unix epoch

  bool operator==(const DataFileStamp&) const = default;

  // {"path": "/data/tokens.bin", "bytes": 1664, "mtime_ns": 1714000000123456789}.
  nlohmann::json ToJson() const;
  // InvalidArgument unless `json` is an object with a string "path" and non-negative integers
  // "bytes" and "mtime_ns".
  static absl::StatusOr<DataFileStamp> FromJson(const nlohmann::json& json);
};

// A pseudo-random permutation of [0, n) keyed by (seed, epoch), evaluated one element at a time
// in O(1) memory: a balanced Feistel network over the smallest even number of bits that covers
// n, with cycle walking back into [0, n).
class WindowShuffle {
 public:
  WindowShuffle(int64_t n, uint64_t seed, int64_t epoch);
  // The window at place k of the order. Needs 0 <= k < n.
  int64_t operator()(int64_t k) const;

 private:
  uint64_t Feistel(uint64_t x) const;

  int64_t n_;
  Rng rng_;             // the round function: word (round << 32 | half) of it
  int half_bits_;       // h >= 1: the network permutes [0, 2^(2h)), and 2^(2h) <= 4n
  uint64_t half_mask_;  // 2^h - 1
};

class EvalIterator;

class DataLoader {
 public:
  // Opens and validates the data (the whole file is checked here, once) for rank `rank` of
  // `world_size` data-parallel ranks; batch_size must be a multiple of world_size. Starts at
  // epoch 0, index 0.
  static absl::StatusOr<DataLoader> Create(const DataConfig& config, int rank, int world_size);

  // This rank's slice of the next global batch: (batch_size / world_size, window) i32, rows
  // in global batch order. Inputs are columns [0, S), targets columns [1, S + 1). Fails only
  // when the file changed since Create checked it (TokenFile::Read's errors, naming the file).
  absl::StatusOr<Tensor> Next();

  DataPosition position() const { return position_; }
  // Continues from `position` (from position() of a loader with the same config, on any rank):
  // the following batches are the ones that loader would have produced. InvalidArgument if the
  // index is past this data's epoch (another data set) or the epoch is not 0 for synthetic data.
  absl::Status Restore(const DataPosition& position);

  // The data file as Create found it; nullopt for synthetic data.
  std::optional<DataFileStamp> file_stamp() const;
  // OK when `recorded` (a checkpoint's record of its data file; nullopt when it has none, as
  // checkpoints written before the record have not) matches this loader's file in size and
  // modification time; else FailedPrecondition naming the file, both sizes and times, and what
  // to do about it.
  absl::Status CheckSameFile(const std::optional<DataFileStamp>& recorded) const;

  // The held-out windows from the start, split over ranks like the training batches.
  EvalIterator Eval() const;

  const DataConfig& config() const { return config_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int64_t local_batch_size() const { return config_.batch_size / world_size_; }
  // Training windows per epoch; nullopt for the (unbounded) synthetic stream.
  std::optional<int64_t> windows_per_epoch() const;
  int64_t num_eval_windows() const;
  // The synthetic source (its entropy rate is the best possible loss), or null for a file.
  const SyntheticSource* synthetic() const;

  struct Source;  // the data and its window layout (data.cc)

 private:
  DataLoader() = default;

  DataConfig config_;
  int rank_ = 0;
  int world_size_ = 1;
  std::shared_ptr<const Source> source_;
  DataPosition position_;
};

class EvalIterator {
 public:
  // Batches over all ranks: ceil(eval windows / batch_size); the same on every rank.
  int64_t num_batches() const { return num_batches_; }
  // This rank's share of the next global eval batch, (rows, window) i32. Full batches give
  // every rank batch_size / world_size rows; the last may be short, and its windows are split as
  // evenly as possible, so a rank can get 0 rows. nullopt after the last batch. Fails as
  // DataLoader::Next does.
  absl::StatusOr<std::optional<Tensor>> Next();

 private:
  friend class DataLoader;
  EvalIterator() = default;

  std::shared_ptr<const DataLoader::Source> source_;
  int64_t batch_size_ = 0;
  int rank_ = 0;
  int world_size_ = 1;
  int64_t num_batches_ = 0;
  int64_t next_batch_ = 0;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_DATA_H_
