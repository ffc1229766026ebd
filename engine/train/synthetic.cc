#include "engine/train/synthetic.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/core/rng.h"

namespace moetrain {
namespace {

// Rng stream ids under the config's seed: the chain (step = row), and the two token streams
// (step = chunk index).
constexpr uint32_t kTransitionStream = 0;
constexpr uint32_t kTrainStream = 1;
constexpr uint32_t kEvalStream = 2;

constexpr int64_t kMaxVocabSize = int64_t{1} << 20;
constexpr int64_t kMaxBranching = 1024;
// Power iteration contracts by at least (1 - noise) per step, so after a step that changes π by
// δ (L1) the error is at most δ (1 - noise) / noise. It runs until that bound is below 1e-15 or
// the change stops shrinking below 1e-13 (round-off), whichever comes first.
constexpr int kMaxPowerIterations = 100000;
constexpr double kPowerErrorBound = 1e-15;
constexpr double kPowerRoundOff = 1e-13;

absl::Status Invalid(absl::string_view field, auto value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("data.synthetic_", field, " = ", value, " ", why));
}

// 53 random bits from two words, as a double in [0, 1).
double UnitDouble(uint32_t high, uint32_t low) {
  return static_cast<double>((uint64_t{high} << 32 | low) >> 11) * 0x1p-53;
}

// An integer uniform in [0, n) from one word (bias below n / 2^32).
uint32_t Below(uint32_t bits, uint64_t n) { return static_cast<uint32_t>((bits * n) >> 32); }

double PlogP(double p) { return p > 0.0 ? p * std::log(p) : 0.0; }

}  // namespace

absl::Status SyntheticConfig::Validate() const {
  if (vocab_size < 2 || vocab_size > kMaxVocabSize) {
    return Invalid("vocab_size", vocab_size, absl::StrCat("must be in [2, ", kMaxVocabSize, "]"));
  }
  const int64_t max_branching = std::min(vocab_size, kMaxBranching);
  if (branching < 1 || branching > max_branching) {
    return Invalid("branching", branching,
                   absl::StrCat("must be in [1, ", max_branching,
                                "] (data.synthetic_vocab_size = ", vocab_size, ")"));
  }
  if (!(noise > 0.0 && noise <= 1.0)) return Invalid("noise", noise, "must be in (0, 1]");
  return absl::OkStatus();
}

absl::StatusOr<SyntheticSource> SyntheticSource::Create(const SyntheticConfig& config) {
  if (absl::Status status = config.Validate(); !status.ok()) return status;
  const int64_t vocab = config.vocab_size;
  const int64_t branching = config.branching;
  const double floor = config.noise / static_cast<double>(vocab);

  SyntheticSource source;
  source.config_ = config;
  source.noise_threshold_ = static_cast<uint64_t>(std::llround(std::ldexp(config.noise, 32)));
  source.successors_.resize(vocab * branching);
  source.weights_.resize(vocab * branching);
  source.cumulative_.resize(vocab * branching);
  source.row_entropy_.resize(vocab);

  std::vector<char> chosen(vocab, 0);
  for (int64_t row = 0; row < vocab; ++row) {
    const Rng rng(config.seed, static_cast<uint64_t>(row), 0, kTransitionStream);
    uint64_t word = 0;
    int32_t* successors = &source.successors_[row * branching];
    // Floyd's sampling: `branching` distinct tokens in O(branching).
    int64_t count = 0;
    for (int64_t j = vocab - branching; j < vocab; ++j) {
      const int64_t t = Below(rng.Bits(word++), static_cast<uint64_t>(j + 1));
      const int64_t pick = chosen[t] ? j : t;
      chosen[pick] = 1;
      successors[count++] = static_cast<int32_t>(pick);
    }
    for (int64_t k = 0; k < branching; ++k) chosen[successors[k]] = 0;

    // Dirichlet(1, …, 1) = normalised Exp(1) draws; the + 0.5 keeps log away from 0 and 1.
    double* weights = &source.weights_[row * branching];
    double total = 0.0;
    for (int64_t k = 0; k < branching; ++k) {
      weights[k] = -std::log((static_cast<double>(rng.Bits(word++)) + 0.5) * 0x1p-32);
      total += weights[k];
    }
    double running = 0.0;
    double entropy = -static_cast<double>(vocab - branching) * PlogP(floor);
    for (int64_t k = 0; k < branching; ++k) {
      weights[k] /= total;
      running += weights[k];
      source.cumulative_[row * branching + k] = running;
      entropy -= PlogP(floor + (1.0 - config.noise) * weights[k]);
    }
    source.cumulative_[row * branching + branching - 1] = 1.0;
    source.row_entropy_[row] = entropy;
  }

  // π P = π by power iteration from uniform. Σ π = 1 makes the floor term noise / V exactly.
  std::vector<double> pi(vocab, 1.0 / static_cast<double>(vocab));
  std::vector<double> next(vocab);
  bool converged = false;
  double previous_change = 2.0;
  for (int iteration = 0; iteration < kMaxPowerIterations && !converged; ++iteration) {
    std::fill(next.begin(), next.end(), floor);
    for (int64_t row = 0; row < vocab; ++row) {
      const double mass = (1.0 - config.noise) * pi[row];
      for (int64_t k = 0; k < branching; ++k) {
        next[source.successors_[row * branching + k]] +=
            mass * source.weights_[row * branching + k];
      }
    }
    double total = 0.0;
    for (double p : next) total += p;
    double change = 0.0;
    for (int64_t j = 0; j < vocab; ++j) {
      next[j] /= total;
      change += std::abs(next[j] - pi[j]);
    }
    std::swap(pi, next);
    converged = change * (1.0 - config.noise) <= kPowerErrorBound * config.noise ||
                (change < kPowerRoundOff && change >= previous_change);
    previous_change = change;
  }
  if (!converged) {
    return Invalid("noise", config.noise,
                   absl::StrCat("is too small: the stationary distribution did not converge in ",
                                kMaxPowerIterations, " power iterations"));
  }

  source.stationary_ = std::move(pi);
  source.stationary_cdf_.resize(vocab);
  double running = 0.0;
  for (int64_t j = 0; j < vocab; ++j) {
    running += source.stationary_[j];
    source.stationary_cdf_[j] = running;
    source.entropy_rate_ += source.stationary_[j] * source.row_entropy_[j];
    source.unigram_entropy_ -= PlogP(source.stationary_[j]);
  }
  source.stationary_cdf_[vocab - 1] = 1.0;
  return source;
}

double SyntheticSource::TransitionProbability(int64_t from, int64_t to) const {
  const int64_t branching = config_.branching;
  double p = config_.noise / static_cast<double>(config_.vocab_size);
  for (int64_t k = 0; k < branching; ++k) {
    if (successors_[from * branching + k] == to) {
      p += (1.0 - config_.noise) * weights_[from * branching + k];
    }
  }
  return p;
}

int32_t SyntheticSource::NextToken(int32_t current, uint32_t choose_bits,
                                   uint32_t value_bits) const {
  // The mixture: with probability noise a uniform token, else one of the row's successors.
  if (choose_bits < noise_threshold_) {
    return static_cast<int32_t>(Below(value_bits, static_cast<uint64_t>(config_.vocab_size)));
  }
  const int64_t branching = config_.branching;
  const double* cumulative = &cumulative_[current * branching];
  const double u = static_cast<double>(value_bits) * 0x1p-32;
  const int64_t k = std::upper_bound(cumulative, cumulative + branching, u) - cumulative;
  return successors_[current * branching + std::min(k, branching - 1)];
}

void SyntheticSource::Read(Split split, int64_t begin, int64_t count, int32_t* out) const {
  const uint32_t stream = split == Split::kTrain ? kTrainStream : kEvalStream;
  const int64_t end = begin + count;
  int64_t position = begin;
  while (position < end) {
    const int64_t chunk = position / kChunkTokens;
    const int64_t chunk_begin = chunk * kChunkTokens;
    const int64_t stop = std::min(end, chunk_begin + kChunkTokens);
    // Token t of a chunk reads words 2t and 2t + 1; token 0 is drawn from π.
    const Rng rng(config_.seed, static_cast<uint64_t>(chunk), 0, stream);
    const double u = UnitDouble(rng.Bits(0), rng.Bits(1));
    const int64_t first = std::upper_bound(stationary_cdf_.begin(), stationary_cdf_.end(), u) -
                          stationary_cdf_.begin();
    int32_t state = static_cast<int32_t>(std::min(first, config_.vocab_size - 1));
    for (int64_t t = 0; chunk_begin + t < stop; ++t) {
      if (t > 0) state = NextToken(state, rng.Bits(2 * t), rng.Bits(2 * t + 1));
      if (chunk_begin + t >= position) out[chunk_begin + t - begin] = state;
    }
    position = stop;
  }
}

}  // namespace moetrain
