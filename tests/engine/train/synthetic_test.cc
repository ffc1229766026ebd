#include "engine/train/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

constexpr int64_t kChunk = SyntheticSource::kChunkTokens;

SyntheticSource Make(int64_t vocab, int64_t branching = 4, double noise = 0.05,
                     uint64_t seed = 1234) {
  absl::StatusOr<SyntheticSource> source = SyntheticSource::Create({vocab, branching, noise, seed});
  EXPECT_TRUE(source.ok()) << source.status();
  return *std::move(source);
}

std::vector<int32_t> Read(const SyntheticSource& source, SyntheticSource::Split split,
                          int64_t begin, int64_t count) {
  std::vector<int32_t> out(count);
  source.Read(split, begin, count, out.data());
  return out;
}

TEST(SyntheticConfigTest, RejectsBadFieldsByName) {
  struct Case {
    SyntheticConfig config;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{1, 1, 0.05, 0}, "data.synthetic_vocab_size = 1 must be in [2, 1048576]"},
      {{(1 << 20) + 1, 4, 0.05, 0}, "data.synthetic_vocab_size = 1048577"},
      {{16, 0, 0.05, 0}, "data.synthetic_branching = 0 must be in [1, 16]"},
      {{16, 17, 0.05, 0}, "data.synthetic_branching = 17 must be in [1, 16]"},
      {{4096, 1025, 0.05, 0}, "data.synthetic_branching = 1025 must be in [1, 1024]"},
      {{16, 4, 0.0, 0}, "data.synthetic_noise = 0 must be in (0, 1]"},
      {{16, 4, 1.5, 0}, "data.synthetic_noise = 1.5 must be in (0, 1]"},
      {{16, 4, std::nan(""), 0}, "data.synthetic_noise = nan"},
  };
  for (const Case& c : cases) {
    const absl::Status status = c.config.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.expected;
    EXPECT_NE(std::string(status.message()).find(c.expected), std::string::npos)
        << status.message();
    EXPECT_EQ(SyntheticSource::Create(c.config).status(), status);
  }
  EXPECT_TRUE(SyntheticConfig{}.Validate().ok());
}

// Float64 reference from the dense matrix: rows are distributions, π from many more power
// iterations agrees with the source's, and Σ π_i P_ij log P_ij is its entropy rate.
TEST(SyntheticSourceTest, StationaryDistributionAndEntropyRateMatchDenseReference) {
  for (const auto& [vocab, branching, noise] : std::vector<std::tuple<int64_t, int64_t, double>>{
           {64, 4, 0.05}, {2, 1, 0.3}, {17, 17, 0.01}, {256, 1, 0.02}, {100, 8, 1.0}}) {
    const SyntheticSource source = Make(vocab, branching, noise, 77);
    std::vector<double> p(vocab * vocab);
    for (int64_t i = 0; i < vocab; ++i) {
      double row_sum = 0.0, row_entropy = 0.0;
      int likely = 0;
      for (int64_t j = 0; j < vocab; ++j) {
        p[i * vocab + j] = source.TransitionProbability(i, j);
        row_sum += p[i * vocab + j];
        row_entropy -= p[i * vocab + j] * std::log(p[i * vocab + j]);
        if (p[i * vocab + j] > noise / vocab * (1 + 1e-12)) ++likely;
      }
      ASSERT_NEAR(row_sum, 1.0, 1e-12) << "row " << i;
      ASSERT_NEAR(source.RowEntropy(i), row_entropy, 1e-12) << "row " << i;
      if (noise < 1.0) {
        ASSERT_EQ(likely, branching) << "row " << i;
      }
    }
    std::vector<double> pi(vocab, 1.0 / vocab), next(vocab);
    // Iterates to round-off: the change stops shrinking or falls below 1e-17.
    for (int iteration = 0; iteration < 20000; ++iteration) {
      std::fill(next.begin(), next.end(), 0.0);
      for (int64_t i = 0; i < vocab; ++i) {
        for (int64_t j = 0; j < vocab; ++j) next[j] += pi[i] * p[i * vocab + j];
      }
      // Rows sum to 1 only to round-off, which would otherwise drift the total mass.
      double mass = 0.0;
      for (double x : next) mass += x;
      double change = 0.0;
      for (int64_t j = 0; j < vocab; ++j) {
        next[j] /= mass;
        change = std::max(change, std::abs(next[j] - pi[j]));
      }
      std::swap(pi, next);
      if (change < 1e-17) break;
    }
    double rate = 0.0, total = 0.0;
    for (int64_t i = 0; i < vocab; ++i) {
      EXPECT_NEAR(source.stationary()[i], pi[i], 1e-12 * pi[i] * vocab)
          << "V " << vocab << " token " << i;
      total += source.stationary()[i];
      for (int64_t j = 0; j < vocab; ++j)
        rate -= pi[i] * p[i * vocab + j] * std::log(p[i * vocab + j]);
    }
    EXPECT_NEAR(total, 1.0, 1e-12);
    EXPECT_NEAR(source.entropy_rate(), rate, 1e-12 * rate) << "V " << vocab;
    EXPECT_LE(source.entropy_rate(), source.unigram_entropy() + 1e-12);
    EXPECT_LE(source.unigram_entropy(), std::log(static_cast<double>(vocab)) + 1e-12);
  }
}

TEST(SyntheticSourceTest, EntropyRateIsFarBelowLogV) {
  const SyntheticSource source = Make(256);
  std::printf(
      "V = 256, branching 4, noise 0.05: entropy rate %.6f nats/token, unigram %.6f, "
      "log V %.6f\n",
      source.entropy_rate(), source.unigram_entropy(), std::log(256.0));
  EXPECT_GT(source.entropy_rate(), 0.5);
  EXPECT_LT(source.entropy_rate(), 0.5 * std::log(256.0));
}

// The independent check: entropy and unigram frequencies measured on 2^20 generated tokens.
TEST(SyntheticSourceTest, EmpiricalEntropyAndFrequenciesMatchAnalytic) {
  // The plug-in estimate is biased low by cells the sample never saw (the uniform floor spreads
  // noise / V over all V² cells), which the correction only partly undoes at V = 256.
  for (const auto& [vocab, tolerance] :
       std::vector<std::pair<int64_t, double>>{{64, 0.01}, {256, 0.02}}) {
    const SyntheticSource source = Make(vocab, 4, 0.05, 2024);
    const int64_t n = int64_t{1} << 20;
    const std::vector<int32_t> tokens = Read(source, SyntheticSource::Split::kTrain, 0, n);
    std::vector<int64_t> pairs(vocab * vocab, 0), unigrams(vocab, 0), rows(vocab, 0);
    int64_t transitions = 0;
    for (int64_t t = 0; t < n; ++t) {
      ASSERT_GE(tokens[t], 0);
      ASSERT_LT(tokens[t], vocab);
      ++unigrams[tokens[t]];
      // A chunk's first token is drawn from π, not from the chain.
      if (t % kChunk == 0) continue;
      ++pairs[tokens[t - 1] * vocab + tokens[t]];
      ++rows[tokens[t - 1]];
      ++transitions;
    }
    // Plug-in conditional entropy with the Miller–Madow correction (its bias is about
    // (cells seen − rows) / 2N, about 0.1% of H for V = 256 here).
    double entropy = 0.0;
    int64_t cells = 0, rows_seen = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (rows[i] == 0) continue;
      ++rows_seen;
      for (int64_t j = 0; j < vocab; ++j) {
        const int64_t c = pairs[i * vocab + j];
        if (c == 0) continue;
        ++cells;
        entropy -= static_cast<double>(c) / transitions *
                   std::log(static_cast<double>(c) / static_cast<double>(rows[i]));
      }
    }
    const double corrected = entropy + static_cast<double>(cells - rows_seen) / (2.0 * transitions);
    double distance = 0.0;  // total variation between the frequencies and π
    for (int64_t j = 0; j < vocab; ++j) {
      distance += 0.5 * std::abs(static_cast<double>(unigrams[j]) / n - source.stationary()[j]);
    }
    std::printf(
        "V = %ld: analytic %.5f nats/token, empirical %.5f (plug-in %.5f), "
        "relative error %.3f%%; TV(frequencies, pi) = %.5f\n",
        static_cast<long>(vocab), source.entropy_rate(), corrected, entropy,
        100.0 * (corrected - source.entropy_rate()) / source.entropy_rate(), distance);
    EXPECT_NEAR(corrected, source.entropy_rate(), tolerance * source.entropy_rate())
        << "V " << vocab;
    EXPECT_LT(distance, 0.01) << "V " << vocab;
  }
}

TEST(SyntheticSourceTest, WindowsAreReproducibleInAnyOrder) {
  const SyntheticSource source = Make(300, 3, 0.1, 5);
  const int64_t n = 3 * kChunk + 100;
  const std::vector<int32_t> all = Read(source, SyntheticSource::Split::kTrain, 0, n);
  // Windows inside a chunk, across one and two chunk boundaries, at the very start; read
  // backwards so no window can lean on a previous read.
  const std::vector<std::pair<int64_t, int64_t>> windows = {{3 * kChunk + 1, 99},
                                                            {kChunk - 5, 2 * kChunk + 10},
                                                            {2 * kChunk - 1, 2},
                                                            {kChunk, kChunk},
                                                            {17, 257},
                                                            {0, 1}};
  for (const auto& [begin, count] : windows) {
    const std::vector<int32_t> window = Read(source, SyntheticSource::Split::kTrain, begin, count);
    ASSERT_TRUE(std::equal(window.begin(), window.end(), all.begin() + begin))
        << begin << " +" << count;
  }
  // Far out, without generating the stream before it.
  const int64_t far = int64_t{1} << 40;
  const std::vector<int32_t> far_window = Read(source, SyntheticSource::Split::kTrain, far, 60);
  EXPECT_EQ(Read(source, SyntheticSource::Split::kTrain, far + 10, 50),
            std::vector<int32_t>(far_window.begin() + 10, far_window.end()));
}

TEST(SyntheticSourceTest, DeterministicFromSeedWithSeparateEvalStream) {
  const SyntheticSource a = Make(128, 4, 0.05, 9);
  const SyntheticSource b = Make(128, 4, 0.05, 9);
  const SyntheticSource other = Make(128, 4, 0.05, 10);
  const int64_t n = 2 * kChunk;
  const std::vector<int32_t> train = Read(a, SyntheticSource::Split::kTrain, 0, n);
  const std::vector<int32_t> eval = Read(a, SyntheticSource::Split::kEval, 0, n);
  EXPECT_EQ(train, Read(b, SyntheticSource::Split::kTrain, 0, n));
  EXPECT_EQ(eval, Read(b, SyntheticSource::Split::kEval, 0, n));
  EXPECT_EQ(a.stationary(), b.stationary());
  EXPECT_EQ(a.entropy_rate(), b.entropy_rate());
  EXPECT_NE(a.entropy_rate(), other.entropy_rate());
  int same_as_other = 0, same_as_eval = 0;
  const std::vector<int32_t> other_train = Read(other, SyntheticSource::Split::kTrain, 0, n);
  for (int64_t t = 0; t < n; ++t) {
    same_as_other += train[t] == other_train[t];
    same_as_eval += train[t] == eval[t];
  }
  // Independent streams agree only by chance (about Σ π² of the time).
  EXPECT_LT(same_as_other, n / 10);
  EXPECT_LT(same_as_eval, n / 10);
}

TEST(SyntheticSourceTest, LargeVocabularyIsQuick) {
  const SyntheticSource source = Make(50257, 4, 0.05, 3);
  EXPECT_LT(source.entropy_rate(), 0.5 * std::log(50257.0));
  const std::vector<int32_t> tokens = Read(source, SyntheticSource::Split::kTrain, 12345, 5000);
  for (int32_t t : tokens) ASSERT_TRUE(t >= 0 && t < 50257) << t;
}

}  // namespace
}  // namespace moetrain
