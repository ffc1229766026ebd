// A synthetic token source with a known entropy rate: a seeded first-order Markov chain, so a
// test can say how close training gets to the best possible loss.
//
// Transition rows: P_i = noise · Uniform(V) + (1 − noise) · Dirichlet(1, …, 1) over `branching`
// distinct successor tokens drawn at random per row. The uniform floor makes the chain
// irreducible and aperiodic, so its stationary distribution π is unique; with few successors
// the entropy rate H = Σ_i π_i · H(P_i) lies far below log V.
//
// The stream is cut into chunks of kChunkTokens. Chunk c starts from a state drawn from π and
// then follows the chain, using only Rng(seed, c, 0, stream) words, so any window of the stream
// is computed from the start of its chunk alone, never from position 0. The train and eval
// streams use different Rng streams of the same chain.
#ifndef MOETRAIN_ENGINE_TRAIN_SYNTHETIC_H_
#define MOETRAIN_ENGINE_TRAIN_SYNTHETIC_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace moetrain {

struct SyntheticConfig {
  int64_t vocab_size = 256;  // V: token ids are in [0, V); 2 <= V <= 2^20
  int64_t branching = 4;     // likely successors of each token, in [1, min(V, 1024)]
  double noise = 0.05;       // probability mass spread uniformly over all V, in (0, 1]
  uint64_t seed = 0;         // chooses the chain and both streams

  // OK, or InvalidArgument naming the data.synthetic_* field and its value.
  absl::Status Validate() const;
};

class SyntheticSource {
 public:
  // Tokens per chunk. A chunk's first token is drawn from π, not from the chain, so 1 target in
  // kChunkTokens is predictable only to within the unigram entropy instead of the rate.
  static constexpr int64_t kChunkTokens = 4096;

  enum class Split { kTrain, kEval };

  // Draws the chain and computes π (power iteration in double) and the entropy rate.
  static absl::StatusOr<SyntheticSource> Create(const SyntheticConfig& config);

  const SyntheticConfig& config() const { return config_; }
  int64_t vocab_size() const { return config_.vocab_size; }

  // H = Σ_i π_i · H(P_i), in nats per token: the best achievable cross-entropy of a model that
  // sees the previous token (or more; the chain is first-order).
  double entropy_rate() const { return entropy_rate_; }
  // H(π), in nats: the best loss of a model that ignores context.
  double unigram_entropy() const { return unigram_entropy_; }
  // π, the stationary distribution (V entries summing to 1).
  const std::vector<double>& stationary() const { return stationary_; }
  // P(next = to | current = from).
  double TransitionProbability(int64_t from, int64_t to) const;
  // H(P_from), in nats.
  double RowEntropy(int64_t from) const { return row_entropy_[from]; }

  // out[j] = token begin + j of the split's stream, for j < count. Needs begin >= 0.
  void Read(Split split, int64_t begin, int64_t count, int32_t* out) const;

 private:
  SyntheticSource() = default;

  int32_t NextToken(int32_t current, uint32_t choose_bits, uint32_t value_bits) const;

  SyntheticConfig config_;
  uint64_t noise_threshold_ = 0;        // 32-bit words below it take the uniform branch
  std::vector<int32_t> successors_;     // (V, branching) the likely successors of each token
  std::vector<double> weights_;         // (V, branching) their Dirichlet weights, rows sum to 1
  std::vector<double> cumulative_;      // (V, branching) running sums of weights_, last = 1
  std::vector<double> stationary_;      // (V) π
  std::vector<double> stationary_cdf_;  // (V) running sums of π, last = 1
  std::vector<double> row_entropy_;     // (V) H(P_i)
  double entropy_rate_ = 0.0;
  double unigram_entropy_ = 0.0;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_SYNTHETIC_H_
