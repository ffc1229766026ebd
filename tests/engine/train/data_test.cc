#include "engine/train/data.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

using testutil::Must;

// The position-coded file: token i is i, so a row's first token says where its window starts.
// S = 7 (windows of 8 tokens); 810 tokens with eval_fraction 0.1 hold out floor(81) tokens:
// training tokens [0, 729) give 91 windows (token 728 unused), eval tokens [729, 810) give 10.
constexpr int64_t kSeqLen = 7;
constexpr int64_t kWindow = kSeqLen + 1;
constexpr int64_t kTokens = 810;
constexpr int64_t kTrainWindows = 91;
constexpr int64_t kEvalBegin = 729;
constexpr int64_t kEvalWindows = 10;

::testing::AssertionResult MessageHas(const absl::Status& status, const std::string& part) {
  const std::string message(status.message());
  if (message.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << message << "\" lacks \"" << part << "\"";
}

// Tokens first, first + 1, ..., first + n - 1, each `width` bytes little-endian.
std::string TokenBytes(int64_t n, int width, int64_t first = 0) {
  std::string bytes;
  for (int64_t i = 0; i < n; ++i) {
    for (int b = 0; b < width; ++b)
      bytes.push_back(static_cast<char>(((first + i) >> (8 * b)) & 0xFF));
  }
  return bytes;
}

std::string U16Bytes(int64_t n) { return TokenBytes(n, 2); }

// An llm.c shard of tokens first, ..., first + n - 1: version 1 holds uint16s, version 2 uint32s.
std::string LlmcBytes(int64_t n, int32_t version = kLlmcVersionU16, int64_t first = 0) {
  std::string header(kLlmcHeaderBytes, '\0');
  const int32_t fields[3] = {kLlmcMagic, version, static_cast<int32_t>(n)};
  for (int f = 0; f < 3; ++f) {
    for (int b = 0; b < 4; ++b)
      header[4 * f + b] = static_cast<char>((fields[f] >> (8 * b)) & 0xFF);
  }
  return header + TokenBytes(n, version == kLlmcVersionU32 ? 4 : 2, first);
}

std::vector<int32_t> Row(const Tensor& batch, int64_t r) {
  const int32_t* p = batch.data<int32_t>() + r * batch.dim(1);
  return std::vector<int32_t>(p, p + batch.dim(1));
}

std::vector<std::vector<int32_t>> Rows(const Tensor& batch) {
  std::vector<std::vector<int32_t>> rows;
  for (int64_t r = 0; r < batch.dim(0); ++r) rows.push_back(Row(batch, r));
  return rows;
}

// The training window of each row of a batch from the position-coded file; checks the row is
// that window's consecutive tokens (so targets are the inputs shifted by one).
std::vector<int64_t> TrainWindowIds(const Tensor& batch) {
  EXPECT_EQ(batch.dtype(), DType::kI32);
  EXPECT_EQ(batch.dim(1), kWindow);
  std::vector<int64_t> ids;
  for (int64_t r = 0; r < batch.dim(0); ++r) {
    const std::vector<int32_t> row = Row(batch, r);
    EXPECT_EQ(row[0] % kWindow, 0) << "row " << r;
    for (int64_t c = 1; c < kWindow; ++c) EXPECT_EQ(row[c], row[0] + c) << "row " << r;
    ids.push_back(row[0] / kWindow);
  }
  return ids;
}

DataLoader MustCreate(const DataConfig& config, int rank = 0, int world_size = 1) {
  absl::StatusOr<DataLoader> loader = DataLoader::Create(config, rank, world_size);
  EXPECT_TRUE(loader.ok()) << loader.status();
  return *std::move(loader);
}

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override { u16_path_ = Write("tokens.u16", U16Bytes(kTokens)); }

  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
    return path;
  }

  DataConfig FileConfig() const {
    DataConfig config;
    config.format = DataConfig::Format::kU16;
    config.path = u16_path_;
    config.vocab_size = 65536;
    config.seq_len = kSeqLen;
    config.batch_size = 6;
    config.seed = 42;
    config.eval_fraction = 0.1;
    return config;
  }

  static DataConfig SyntheticConfig() {
    DataConfig config;
    config.format = DataConfig::Format::kSynthetic;
    config.vocab_size = 100;
    config.synthetic_vocab_size = 64;
    config.seq_len = 31;
    config.batch_size = 6;
    config.seed = 7;
    config.synthetic_eval_sequences = 20;
    return config;
  }

  const testutil::TempDir temp_dir_{"moetrain_data"};
  const std::string dir_ = temp_dir_.path().string();
  std::string u16_path_;
};

TEST_F(DataTest, ConfigRejectsBadFieldsByName) {
  struct Case {
    void (*edit)(DataConfig&);
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](DataConfig& c) { c.seq_len = 0; }, "data.seq_len = 0 must be at least 1"},
      {[](DataConfig& c) { c.batch_size = 0; }, "data.batch_size = 0 must be at least 1"},
      {[](DataConfig& c) { c.batch_size = int64_t{1} << 30; }, "more than 2^31 tokens"},
      {[](DataConfig& c) { c.vocab_size = 0; }, "model.vocab_size = 0 must be in"},
      {[](DataConfig& c) { c.eval_fraction = 1.0; }, "data.eval_fraction = 1 must be in [0, 1)"},
      {[](DataConfig& c) { c.eval_fraction = -0.1; }, "data.eval_fraction = -0.1"},
      {[](DataConfig& c) { c.path.clear(); }, "data.path is empty; data.format = u16"},
      {[](DataConfig& c) { c.format = static_cast<DataConfig::Format>(9); },
       "data.format = 9 is not a data format"},
      {[](DataConfig& c) {
         c.format = DataConfig::Format::kText;
         c.vocab_size = 200;
       },
       "model.vocab_size = 200 is below 256, the byte-level vocabulary of data.format = text"},
      {[](DataConfig& c) {
         c.format = DataConfig::Format::kSynthetic;
         c.vocab_size = 100;
         c.synthetic_vocab_size = 101;
       },
       "data.synthetic_vocab_size = 101 exceeds model.vocab_size = 100"},
      {[](DataConfig& c) {
         c.format = DataConfig::Format::kSynthetic;
         c.synthetic_noise = 0;
       },
       "data.synthetic_noise = 0"},
      {[](DataConfig& c) {
         c.format = DataConfig::Format::kSynthetic;
         c.synthetic_eval_sequences = -1;
       },
       "data.synthetic_eval_sequences = -1 must not be negative"},
  };
  for (const Case& c : cases) {
    DataConfig config = FileConfig();
    c.edit(config);
    const absl::Status status = config.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.expected;
    EXPECT_TRUE(MessageHas(status, c.expected));
    EXPECT_EQ(DataLoader::Create(config, 0, 1).status(), status);
  }
  EXPECT_TRUE(FileConfig().Validate().ok());
  EXPECT_TRUE(DataConfig().Validate().ok());  // the defaults: synthetic, no file
}

TEST(DataFormatTest, NamesRoundTrip) {
  for (DataConfig::Format format :
       {DataConfig::Format::kLlmc, DataConfig::Format::kU16, DataConfig::Format::kU32,
        DataConfig::Format::kText, DataConfig::Format::kSynthetic}) {
    absl::StatusOr<DataConfig::Format> parsed = ParseDataFormat(DataFormatName(format));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, format);
  }
  EXPECT_TRUE(MessageHas(ParseDataFormat("bin").status(),
                         "data.format = \"bin\" is not one of llmc, u16, u32, text, synthetic"));
  EXPECT_EQ(DataFormatName(DataConfig::Format::kU32), "u32");
}

TEST_F(DataTest, CreateRejectsBadLayoutAndFiles) {
  const DataConfig config = FileConfig();
  EXPECT_TRUE(MessageHas(DataLoader::Create(config, 0, 0).status(), "world_size = 0"));
  EXPECT_TRUE(MessageHas(DataLoader::Create(config, 3, 3).status(), "rank = 3 must be in [0, "));
  EXPECT_TRUE(MessageHas(DataLoader::Create(config, -1, 2).status(), "rank = -1"));
  EXPECT_TRUE(MessageHas(DataLoader::Create(config, 0, 4).status(),
                         "data.batch_size = 6 is not a multiple of world_size = 4"));

  DataConfig greedy = config;
  greedy.eval_fraction = 0.995;  // holds out 805 of 810, leaving 5 < 8
  absl::Status status = DataLoader::Create(greedy, 0, 1).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageHas(status,
                         "data.eval_fraction = 0.995 holds out 805 of the 810 tokens of "
                         "data.path " +
                             u16_path_ + ", leaving 5 for training"));
  DataConfig stingy = config;
  stingy.eval_fraction = 0.005;  // 4 tokens, less than a window
  status = DataLoader::Create(stingy, 0, 1).status();
  EXPECT_TRUE(MessageHas(status, "holds out 4 of the 810 tokens"));
  EXPECT_TRUE(MessageHas(status, "fewer than one sequence of seq_len + 1 = 8"));

  DataConfig missing = config;
  missing.path = dir_ + "/nope.u16";
  EXPECT_EQ(DataLoader::Create(missing, 0, 1).status().code(), absl::StatusCode::kNotFound);
  DataConfig small_vocab = config;
  small_vocab.vocab_size = 500;
  EXPECT_TRUE(MessageHas(DataLoader::Create(small_vocab, 0, 1).status(),
                         "data.path " + u16_path_ +
                             ": token 500 at byte offset 1000 is >= "
                             "model.vocab_size = 500"));
  DataConfig long_seq = config;
  long_seq.seq_len = 1000;
  EXPECT_TRUE(MessageHas(DataLoader::Create(long_seq, 0, 1).status(),
                         "has 810 tokens, fewer than one sequence of seq_len + 1 = 1001"));
}

TEST_F(DataTest, EachEpochVisitsEveryTrainingWindowOnce) {
  DataLoader loader = MustCreate(FileConfig());
  EXPECT_EQ(loader.windows_per_epoch(), kTrainWindows);
  EXPECT_EQ(loader.num_eval_windows(), kEvalWindows);
  EXPECT_EQ(loader.synthetic(), nullptr);
  // 91 windows in batches of 6: batch 15 holds the last window of epoch 0 and 5 of epoch 1.
  std::vector<int64_t> order;
  for (int b = 0; b < 46; ++b) {  // 276 places: three whole epochs and 3 more
    const Tensor batch = Must(loader.Next());
    ASSERT_EQ(batch.dim(0), 6);
    for (int64_t id : TrainWindowIds(batch)) order.push_back(id);
    if (b == 14) {
      EXPECT_EQ(loader.position(), (DataPosition{0, 90}));
    }
    if (b == 15) {
      EXPECT_EQ(loader.position(), (DataPosition{1, 5}));
    }
  }
  EXPECT_EQ(loader.position(), (DataPosition{3, 3}));
  std::vector<std::vector<int64_t>> epochs;
  for (int e = 0; e < 3; ++e) {
    std::vector<int64_t> epoch(order.begin() + e * kTrainWindows,
                               order.begin() + (e + 1) * kTrainWindows);
    const std::set<int64_t> seen(epoch.begin(), epoch.end());
    EXPECT_EQ(seen.size(), static_cast<size_t>(kTrainWindows)) << "epoch " << e;
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), kTrainWindows - 1);  // never a held-out token
    epochs.push_back(epoch);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  std::vector<int64_t> sorted = epochs[0];
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(epochs[0], sorted);  // shuffled
}

TEST_F(DataTest, SameSeedSameBatchesOtherSeedOthers) {
  DataLoader a = MustCreate(FileConfig());
  DataLoader b = MustCreate(FileConfig());
  DataConfig other_config = FileConfig();
  other_config.seed = 43;
  DataLoader other = MustCreate(other_config);
  std::vector<int64_t> from_a, from_other;
  for (int step = 0; step < 20; ++step) {
    const std::vector<int64_t> ids = TrainWindowIds(Must(a.Next()));
    EXPECT_EQ(ids, TrainWindowIds(Must(b.Next()))) << "step " << step;
    from_a.insert(from_a.end(), ids.begin(), ids.end());
    const std::vector<int64_t> other_ids = TrainWindowIds(Must(other.Next()));
    from_other.insert(from_other.end(), other_ids.begin(), other_ids.end());
  }
  EXPECT_NE(from_a, from_other);
}

TEST_F(DataTest, RestoreContinuesWithTheSameBatches) {
  const DataConfig config = FileConfig();
  DataLoader reference = MustCreate(config);
  std::vector<std::vector<std::vector<int32_t>>> batches;
  for (int step = 0; step < 40; ++step) batches.push_back(Rows(Must(reference.Next())));
  // Mid-epoch, just before a batch that spans the epoch boundary, right after it, at the next
  // boundary's neighbourhood.
  for (int resume_at : {0, 3, 15, 16, 30, 31}) {
    DataLoader first = MustCreate(config);
    for (int step = 0; step < resume_at; ++step) Must(first.Next());
    const std::string saved = first.position().ToJson().dump();
    absl::StatusOr<DataPosition> position = DataPosition::FromJson(nlohmann::json::parse(saved));
    ASSERT_TRUE(position.ok()) << position.status();
    EXPECT_EQ(*position, first.position());
    DataLoader resumed = MustCreate(config);
    ASSERT_TRUE(resumed.Restore(*position).ok());
    for (int step = resume_at; step < 40; ++step) {
      ASSERT_EQ(Rows(Must(resumed.Next())), batches[step])
          << "resumed at " << resume_at << ", step " << step;
    }
    EXPECT_EQ(resumed.position(), reference.position());
  }
}

TEST_F(DataTest, RestoreRejectsPositionsOfOtherData) {
  DataLoader loader = MustCreate(FileConfig());
  EXPECT_TRUE(MessageHas(loader.Restore({0, kTrainWindows}),
                         "data position index 91 is past the 91 training windows per epoch"));
  EXPECT_TRUE(MessageHas(loader.Restore({-1, 0}), "must not be negative"));
  EXPECT_TRUE(loader.Restore({5, kTrainWindows - 1}).ok());
  EXPECT_EQ(loader.position(), (DataPosition{5, kTrainWindows - 1}));
}

TEST_F(DataTest, RankSlicesAreDisjointAndMakeUpTheGlobalBatch) {
  for (int64_t batch_size : {6, 12}) {
    DataConfig config = FileConfig();
    config.batch_size = batch_size;
    DataLoader global = MustCreate(config);
    for (int world_size : {1, 2, 3}) {
      std::vector<DataLoader> ranks;
      for (int r = 0; r < world_size; ++r) ranks.push_back(MustCreate(config, r, world_size));
      DataLoader reference = MustCreate(config);
      for (int step = 0; step < 20; ++step) {  // past an epoch boundary
        std::vector<std::vector<int32_t>> joined;
        std::set<int64_t> ids;
        for (DataLoader& rank : ranks) {
          EXPECT_EQ(rank.local_batch_size(), batch_size / world_size);
          const Tensor slice = Must(rank.Next());
          ASSERT_EQ(slice.dim(0), batch_size / world_size);
          for (int64_t id : TrainWindowIds(slice)) ids.insert(id);
          for (auto& row : Rows(slice)) joined.push_back(row);
        }
        EXPECT_EQ(ids.size(), static_cast<size_t>(batch_size))
            << "W " << world_size << " step " << step;
        ASSERT_EQ(joined, Rows(Must(reference.Next()))) << "W " << world_size << " step " << step;
        for (DataLoader& rank : ranks) EXPECT_EQ(rank.position(), reference.position());
      }
    }
  }
}

TEST_F(DataTest, EvalCoversTheHeldOutWindowsFromTheStart) {
  const DataConfig config = FileConfig();
  std::vector<std::vector<std::vector<int32_t>>> global;  // per batch, W = 1
  {
    DataLoader loader = MustCreate(config);
    for (int step = 0; step < 3; ++step) Must(loader.Next());  // eval does not depend on training
    EvalIterator eval = loader.Eval();
    EXPECT_EQ(eval.num_batches(), 2);  // 10 windows: 6 + 4
    int64_t next_window = 0;
    while (std::optional<Tensor> batch = Must(eval.Next())) {
      for (const auto& row : Rows(*batch)) {
        EXPECT_EQ(row[0], kEvalBegin + next_window * kWindow);
        for (int64_t c = 1; c < kWindow; ++c) EXPECT_EQ(row[c], row[0] + c);
        ++next_window;
      }
      global.push_back(Rows(*batch));
    }
    EXPECT_EQ(next_window, kEvalWindows);
    EXPECT_FALSE(Must(eval.Next()).has_value());
    // A fresh iterator starts over.
    EXPECT_EQ(Rows(*Must(loader.Eval().Next())), global[0]);
  }
  ASSERT_EQ(global.size(), 2u);
  // Every eval token is past every training token: windows [0, 91) end at token 728 < 729.
  EXPECT_GE(global[0][0][0], kTrainWindows * kWindow);

  for (int world_size : {2, 3}) {
    std::vector<EvalIterator> evals;
    for (int r = 0; r < world_size; ++r) {
      evals.push_back(MustCreate(config, r, world_size).Eval());  // outlives its loader
      EXPECT_EQ(evals.back().num_batches(), 2);
    }
    for (size_t b = 0; b < global.size(); ++b) {
      std::vector<std::vector<int32_t>> joined;
      for (int r = 0; r < world_size; ++r) {
        std::optional<Tensor> slice = Must(evals[r].Next());
        ASSERT_TRUE(slice.has_value());
        // The short last batch (4 windows) splits 2 + 2 over two ranks, 1 + 1 + 2 over three.
        if (b == 1 && world_size == 3) {
          EXPECT_EQ(slice->dim(0), r == 2 ? 2 : 1);
        }
        for (auto& row : Rows(*slice)) joined.push_back(row);
      }
      EXPECT_EQ(joined, global[b]) << "W " << world_size << " batch " << b;
    }
    for (EvalIterator& eval : evals) EXPECT_FALSE(Must(eval.Next()).has_value());
  }

  DataConfig no_eval = config;
  no_eval.eval_fraction = 0.0;
  DataLoader loader = MustCreate(no_eval);
  EXPECT_EQ(loader.windows_per_epoch(), kTokens / kWindow);
  EvalIterator eval = loader.Eval();
  EXPECT_EQ(eval.num_batches(), 0);
  EXPECT_FALSE(Must(eval.Next()).has_value());
}

TEST_F(DataTest, ReadsLlmcShardsAndText) {
  DataConfig llmc = FileConfig();
  llmc.format = DataConfig::Format::kLlmc;
  llmc.path = Write("shard.bin", LlmcBytes(kTokens));
  DataLoader from_llmc = MustCreate(llmc);
  DataLoader from_u16 = MustCreate(FileConfig());
  EXPECT_EQ(from_llmc.windows_per_epoch(), kTrainWindows);
  for (int step = 0; step < 5; ++step) {
    EXPECT_EQ(Rows(Must(from_llmc.Next())), Rows(Must(from_u16.Next())));
  }

  // Text: bytes are tokens, UTF-8 or not.
  std::string text = "Grüße, 世界! ";
  text += std::string("\xFF\xFE\x00\x80", 4);
  while (text.size() < 400) text += text;
  DataConfig text_config = FileConfig();
  text_config.format = DataConfig::Format::kText;
  text_config.path = Write("corpus.txt", text);
  text_config.vocab_size = 256;
  text_config.seq_len = 3;
  text_config.batch_size = 4;
  text_config.eval_fraction = 0.0;
  DataLoader loader = MustCreate(text_config);
  const int64_t windows = static_cast<int64_t>(text.size()) / 4;
  EXPECT_EQ(loader.windows_per_epoch(), windows);
  std::multiset<std::vector<int32_t>> seen, expected;
  for (int64_t w = 0; w < windows; ++w) {
    std::vector<int32_t> window;
    for (int64_t c = 0; c < 4; ++c) window.push_back(static_cast<unsigned char>(text[4 * w + c]));
    expected.insert(window);
  }
  for (int64_t step = 0; step < windows / 4; ++step) {
    for (auto& row : Rows(Must(loader.Next()))) seen.insert(row);
  }
  EXPECT_EQ(seen, expected);
}

// DeepSeek-V3's vocabulary of 129,280 needs uint32 tokens: the position-coded file shifted past
// 65,535 reads the same windows, as raw uint32 and as an llm.c version 2 shard.
TEST_F(DataTest, ReadsUint32FilesAboveTheUint16Range) {
  constexpr int64_t kFirst = 100000;
  DataConfig u32 = FileConfig();
  u32.format = DataConfig::Format::kU32;
  u32.path = Write("tokens.u32", TokenBytes(kTokens, 4, kFirst));
  u32.vocab_size = 129280;
  DataConfig llmc = u32;
  llmc.format = DataConfig::Format::kLlmc;
  llmc.path = Write("shard_v2.bin", LlmcBytes(kTokens, kLlmcVersionU32, kFirst));
  DataLoader from_u32 = MustCreate(u32);
  DataLoader from_llmc = MustCreate(llmc);
  DataLoader from_u16 = MustCreate(FileConfig());
  EXPECT_EQ(from_u32.windows_per_epoch(), kTrainWindows);
  EXPECT_EQ(from_u32.num_eval_windows(), kEvalWindows);
  for (int step = 0; step < 5; ++step) {
    std::vector<std::vector<int32_t>> expected = Rows(Must(from_u16.Next()));
    for (auto& row : expected) {
      for (int32_t& token : row) token += static_cast<int32_t>(kFirst);
    }
    EXPECT_EQ(Rows(Must(from_u32.Next())), expected);
    EXPECT_EQ(Rows(Must(from_llmc.Next())), expected);
  }

  DataConfig small_vocab = u32;
  small_vocab.vocab_size = kFirst + 500;
  EXPECT_TRUE(MessageHas(DataLoader::Create(small_vocab, 0, 1).status(),
                         "data.path " + u32.path +
                             ": token 100500 at byte offset 2000 is >= model.vocab_size = 100500"));
  DataConfig ragged = u32;
  ragged.path = Write("ragged.u32", TokenBytes(kTokens, 4, kFirst) + "xy");
  EXPECT_TRUE(MessageHas(DataLoader::Create(ragged, 0, 1).status(), "not a multiple of 4"));
}

TEST_F(DataTest, SyntheticBatchesComeFromTheSourceStreams) {
  const DataConfig config = SyntheticConfig();
  DataLoader loader = MustCreate(config);
  ASSERT_NE(loader.synthetic(), nullptr);
  const SyntheticSource& source = *loader.synthetic();
  EXPECT_EQ(loader.windows_per_epoch(), std::nullopt);
  EXPECT_GT(source.entropy_rate(), 0.0);
  EXPECT_LT(source.entropy_rate(), 0.5 * std::log(64.0));
  const int64_t window = config.seq_len + 1;
  for (int step = 0; step < 4; ++step) {
    const Tensor batch = Must(loader.Next());
    ASSERT_EQ(batch.dim(0), 6);
    ASSERT_EQ(batch.dim(1), window);
    for (int64_t r = 0; r < 6; ++r) {
      std::vector<int32_t> expected(window);
      source.Read(SyntheticSource::Split::kTrain, (6 * step + r) * window, window, expected.data());
      ASSERT_EQ(Row(batch, r), expected) << "step " << step << " row " << r;
      for (int32_t t : expected) ASSERT_LT(t, 64);
    }
  }
  EXPECT_EQ(loader.position(), (DataPosition{0, 24}));

  // Resume far out; ranks split it like file data.
  DataLoader reference = MustCreate(config);
  ASSERT_TRUE(reference.Restore({0, 1000000}).ok());
  const std::vector<std::vector<int32_t>> global = Rows(Must(reference.Next()));
  std::vector<std::vector<int32_t>> joined;
  for (int r = 0; r < 3; ++r) {
    DataLoader rank = MustCreate(config, r, 3);
    ASSERT_TRUE(rank.Restore({0, 1000000}).ok());
    for (auto& row : Rows(Must(rank.Next()))) joined.push_back(row);
  }
  EXPECT_EQ(joined, global);
  EXPECT_TRUE(MessageHas(reference.Restore({1, 0}), "synthetic data has a single epoch"));

  // Same seed, same stream; another seed, another chain.
  DataLoader again = MustCreate(config);
  DataConfig reseeded = config;
  reseeded.seed = 8;
  DataLoader other = MustCreate(reseeded);
  const std::vector<std::vector<int32_t>> first = Rows(Must(again.Next()));
  EXPECT_EQ(first, Rows(Must(MustCreate(config).Next())));
  EXPECT_NE(first, Rows(Must(other.Next())));

  // Eval: its own stream, synthetic_eval_sequences windows from the start.
  EvalIterator eval = loader.Eval();
  EXPECT_EQ(eval.num_batches(), 4);  // 20 windows: 6 + 6 + 6 + 2
  int64_t windows = 0;
  while (std::optional<Tensor> batch = Must(eval.Next())) {
    for (int64_t r = 0; r < batch->dim(0); ++r, ++windows) {
      std::vector<int32_t> expected(window);
      source.Read(SyntheticSource::Split::kEval, windows * window, window, expected.data());
      ASSERT_EQ(Row(*batch, r), expected) << "eval window " << windows;
    }
  }
  EXPECT_EQ(windows, 20);
}

// What a checkpoint records of the file (size, modification time), and the resume check on it.
TEST_F(DataTest, FileStampIsComparedBySizeAndModificationTime) {
  const DataLoader loader = MustCreate(FileConfig());
  const std::optional<DataFileStamp> stamp = loader.file_stamp();
  ASSERT_TRUE(stamp.has_value());
  EXPECT_EQ(stamp->path, u16_path_);
  EXPECT_EQ(stamp->bytes, 2 * kTokens);
  struct stat info;
  ASSERT_EQ(stat(u16_path_.c_str(), &info), 0);
  EXPECT_EQ(stamp->mtime_ns, int64_t{info.st_mtim.tv_sec} * 1'000'000'000 + info.st_mtim.tv_nsec);
  EXPECT_EQ(*DataFileStamp::FromJson(stamp->ToJson()), *stamp);
  EXPECT_OK(loader.CheckSameFile(stamp));
  EXPECT_OK(loader.CheckSameFile(std::nullopt));  // a checkpoint from before the record
  DataFileStamp longer = *stamp, touched = *stamp;
  longer.bytes += 2;
  touched.mtime_ns -= 1;
  for (const DataFileStamp& recorded : {longer, touched}) {
    const absl::Status status = loader.CheckSameFile(recorded);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(MessageHas(status, "data.path " + u16_path_ + " has changed since the checkpoint"));
    EXPECT_TRUE(MessageHas(status, "restore the file"));
  }
  EXPECT_TRUE(MessageHas(loader.CheckSameFile(longer), "it had 1622 bytes, modified "));
  EXPECT_EQ(MustCreate(SyntheticConfig()).file_stamp(), std::nullopt);
  EXPECT_TRUE(
      MessageHas(DataFileStamp::FromJson(nlohmann::json::parse(R"({"path": "x"})")).status(),
                 "data position file: missing \"bytes\""));
}

TEST(DataPositionTest, JsonRoundTripAndErrors) {
  const DataPosition position{3, 1234567890123};
  const nlohmann::json json = position.ToJson();
  EXPECT_EQ(json, nlohmann::json::parse(R"({"epoch": 3, "index": 1234567890123})"));
  absl::StatusOr<DataPosition> parsed = DataPosition::FromJson(nlohmann::json::parse(json.dump()));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, position);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"[1, 2]", "expected an object"},
      {R"({"epoch": 1})", "missing \"index\""},
      {R"({"index": 1})", "missing \"epoch\""},
      {R"({"epoch": -1, "index": 0})", "\"epoch\" = -1 is not a non-negative 64-bit integer"},
      {R"({"epoch": 0, "index": "7"})", "\"index\" = \"7\""},
      {R"({"epoch": 0, "index": 1.5})", "\"index\" = 1.5"},
      {R"({"epoch": 18446744073709551615, "index": 0})", "\"epoch\" = 18446744073709551615"},
  };
  for (const auto& [text, expected] : bad) {
    const absl::Status status = DataPosition::FromJson(nlohmann::json::parse(text)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(MessageHas(status, expected)) << text;
  }
}

TEST(WindowShuffleTest, IsAPermutationThatDependsOnSeedAndEpoch) {
  for (int64_t n : {1, 2, 3, 4, 5, 17, 64, 65, 1000, 4097}) {
    const WindowShuffle shuffle(n, 11, 0);
    std::vector<char> hit(n, 0);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t w = shuffle(k);
      ASSERT_TRUE(w >= 0 && w < n) << "n " << n << " k " << k;
      ASSERT_FALSE(hit[w]) << "n " << n << ": " << w << " twice";
      hit[w] = 1;
      ASSERT_EQ(WindowShuffle(n, 11, 0)(k), w);
    }
  }
  auto order = [](uint64_t seed, int64_t epoch) {
    std::vector<int64_t> out;
    const WindowShuffle shuffle(1000, seed, epoch);
    for (int64_t k = 0; k < 1000; ++k) out.push_back(shuffle(k));
    return out;
  };
  EXPECT_NE(order(11, 0), order(11, 1));
  EXPECT_NE(order(11, 0), order(12, 0));
  // Far from the identity: few fixed points, as for a random permutation (about 1 expected).
  int fixed = 0;
  const std::vector<int64_t> o = order(11, 0);
  for (int64_t k = 0; k < 1000; ++k) fixed += o[k] == k;
  EXPECT_LT(fixed, 10);
}

}  // namespace
}  // namespace moetrain
