// Every op whose header says its results do not depend on the number of threads gives the same
// bits with 1, 2 and 3 threads in the pool (MOETRAIN_NUM_THREADS). The pool is built once per
// process, so each thread count runs in a child process of this test: the child runs every op on
// fixed inputs, large enough to be split among the threads, and prints a digest of each result;
// the parent compares the digests.
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/backend/exec_context.h"
#include "engine/core/rng.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/ops/attention/attention.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/embedding/embedding.h"
#include "engine/ops/loss/lm_head_loss.h"
#include "engine/ops/norm/rms_norm.h"
#include "engine/ops/optim/optim.h"
#include "engine/ops/permute/permute.h"
#include "engine/ops/rope/rope.h"
#include "engine/ops/router/router.h"
#include "engine/ops/swiglu/swiglu.h"
#include "gtest/gtest.h"

namespace moetrain::ops {
namespace {

constexpr char kDigestFileVariable[] = "MOETRAIN_THREAD_COUNT_DIGESTS";

// FNV-1a over the bytes of tensors.
class Digest {
 public:
  Digest& Add(const TensorView& t) {
    const auto* bytes = static_cast<const uint8_t*>(t.raw());
    for (int64_t i = 0; i < t.numel() * static_cast<int64_t>(DTypeSize(t.dtype())); ++i) {
      hash_ = (hash_ ^ bytes[i]) * 1099511628211ull;
    }
    return *this;
  }
  Digest& Add(double value) {
    for (int i = 0; i < 8; ++i)
      hash_ = (hash_ ^ ((std::bit_cast<uint64_t>(value) >> (8 * i)) & 0xff)) * 1099511628211ull;
    return *this;
  }
  std::string Hex() const { return absl::StrFormat("%016x", hash_); }

 private:
  uint64_t hash_ = 1469598103934665603ull;
};

// A fresh tensor of normal values (f32, or rounded to bf16) from a fixed Philox stream.
Tensor Random(DType dtype, std::initializer_list<int64_t> shape, uint32_t stream,
              float stddev = 1.0f) {
  Tensor f32 = Tensor::Empty(DType::kF32, shape);
  Rng(/*seed=*/99, 0, 0, stream).FillNormal(f32.data<float>(), f32.numel(), 0.0f, stddev);
  if (dtype == DType::kF32) return f32;
  Tensor t = Tensor::Empty(dtype, shape);
  ConvertF32ToBF16(f32.data<float>(), t.data<BF16>(), t.numel());
  return t;
}

Tensor Ids(std::initializer_list<int64_t> shape, int32_t range, uint32_t stream) {
  Tensor t = Tensor::Empty(DType::kI32, shape);
  const Rng rng(7, 0, 0, stream);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = rng.Bits(i) % range;
  return t;
}

void Must(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
    std::abort();
  }
}

// Runs every op and returns its results' digests by name.
std::map<std::string, std::string> RunOps() {
  const ExecContext ctx = ExecContext::Cpu();
  std::map<std::string, std::string> digests;
  for (DType act : {DType::kF32, DType::kBF16}) {
    const std::string suffix = act == DType::kBF16 ? " bf16" : " f32";
    constexpr int64_t kRows = 3001, kF = 96, kD = 80;
    // SwiGLU.
    Tensor gate_up = Random(DType::kF32, {kRows, 2 * kF}, 1);
    Tensor out = Tensor::Empty(act, {kRows, kF});
    Must(SwigluForward(ctx, gate_up, out), "swiglu");
    Tensor d_out = Random(DType::kF32, {kRows, kF}, 2);
    Tensor d_gate_up = Tensor::Empty(act, {kRows, 2 * kF});
    Must(SwigluBackward(ctx, gate_up, d_out, d_gate_up), "swiglu backward");
    digests["swiglu" + suffix] = Digest().Add(out).Add(d_gate_up).Hex();

    // RMSNorm.
    Tensor x = Random(DType::kF32, {kRows, kD}, 3);
    Tensor weight = Random(DType::kF32, {kD}, 4);
    Tensor normed = Tensor::Empty(act, {kRows, kD}), rstd = Tensor::Empty(DType::kF32, {kRows});
    Must(RmsNormForward(ctx, x, weight, 1e-6f, normed, rstd), "rms_norm");
    Tensor d_norm = Random(act, {kRows, kD}, 5);
    Tensor d_x = Random(DType::kF32, {kRows, kD}, 6);
    Tensor d_weight = Random(DType::kF32, {kD}, 7);
    Must(RmsNormBackward(ctx, {.x = x,
                               .weight = weight,
                               .rstd = rstd,
                               .d_out = d_norm,
                               .d_x = d_x,
                               .d_weight = d_weight,
                               .accumulate_d_x = true}),
         "rms_norm backward");
    digests["rms_norm" + suffix] = Digest().Add(normed).Add(rstd).Add(d_x).Add(d_weight).Hex();

    // Dtype conversion and the residual add.
    Tensor converted = Tensor::Empty(act, {kRows, kD});
    Must(ConvertTensor(ctx, x, converted), "convert");
    Tensor sum = Tensor::Empty(DType::kF32, {kRows, kD});
    Must(Add(ctx, x, converted, sum), "add");
    digests["convert and add" + suffix] = Digest().Add(converted).Add(sum).Hex();

    // Permutation, gather, combine and their backward, over the router's choice.
    MoeConfig moe;
    moe.num_experts = 16;
    moe.top_k = 4;
    moe.num_groups = 4;
    moe.group_top_k = 2;
    moe.score_function = ScoreFunction::kSigmoid;
    moe.expert_bias = true;
    moe.aux_loss = AuxLossType::kSequence;
    moe.aux_loss_coeff = 1e-2f;
    moe.z_loss_coeff = 1e-3f;
    moe.capacity_factor = 1.25f;
    constexpr int64_t kTokens = 2048, kSeq = 256;
    Tensor logits = Random(DType::kF32, {kTokens, 16}, 8);
    Tensor bias = Random(DType::kF32, {16}, 9, 0.05f);
    const RouterArgs router_args = {logits, bias, kSeq};
    RouterOutput routing;
    Must(RouterForward(ctx, moe, router_args, &routing), "router");
    Must(RouterAuxLoss(ctx, moe, router_args, &routing), "router aux loss");
    Tensor d_weights = Random(DType::kF32, {kTokens, 4}, 10);
    Tensor d_logits = Tensor::Empty(DType::kF32, {kTokens, 16});
    Must(RouterBackward(ctx, moe, router_args, routing, d_weights, d_logits, 0.5f),
         "router backward");
    digests["router" + suffix] = Digest()
                                     .Add(routing.scores)
                                     .Add(routing.topk_experts)
                                     .Add(routing.topk_weights)
                                     .Add(routing.tokens_per_expert)
                                     .Add(routing.losses)
                                     .Add(d_logits)
                                     .Hex();
    const int64_t* counts_data = routing.tokens_per_expert.data<int64_t>();
    const std::vector<int64_t> offsets =
        PermutedExpertOffsets(moe, kTokens, absl::MakeConstSpan(counts_data, 16));
    Permutation permutation;
    Must(BuildPermutation(ctx, moe,
                          {.topk_experts = routing.topk_experts,
                           .topk_weights = routing.topk_weights,
                           .expert_offsets = offsets},
                          &permutation),
         "permutation");
    const int64_t rows = offsets.back();
    Tensor tokens_x = Random(act, {kTokens, kD}, 11);
    Tensor gathered = Tensor::Empty(act, {rows, kD});
    Must(GatherRows(ctx, tokens_x, permutation.row_token, gathered), "gather");
    Tensor expert_rows = Random(DType::kF32, {rows, kD}, 12);
    Tensor extra = Random(DType::kF32, {kTokens, kD}, 13);
    Tensor combined = Tensor::Empty(act, {kTokens, kD});
    Must(CombineRows(ctx, expert_rows, permutation.pair_row, routing.topk_weights, extra, combined),
         "combine");
    Tensor d_combined = Random(act, {kTokens, kD}, 14);
    Tensor d_rows = Tensor::Empty(act, {rows, kD});
    Tensor d_pair_weights = Tensor::Empty(DType::kF32, {kTokens, 4});
    Must(CombineRowsBackward(ctx, d_combined, expert_rows, permutation.pair_row,
                             routing.topk_weights, d_rows, d_pair_weights),
         "combine backward");
    Tensor summed = Tensor::Empty(act, {kTokens, kD});
    const TensorView addends[] = {extra};
    Must(SumPairRows(ctx, expert_rows, permutation.pair_row, addends, summed), "sum rows");
    digests["permute" + suffix] = Digest()
                                      .Add(permutation.expert_offsets)
                                      .Add(permutation.pair_row)
                                      .Add(gathered)
                                      .Add(combined)
                                      .Add(d_rows)
                                      .Add(d_pair_weights)
                                      .Add(summed)
                                      .Hex();
    Tensor counts = Tensor::Empty(DType::kI64, {16});
    Must(CopyTensor(ctx, routing.tokens_per_expert, counts), "copy");
    Must(UpdateExpertBias(ctx, counts, 1e-3f, bias), "expert bias update");
    digests["expert bias" + suffix] = Digest().Add(bias).Hex();

    // The LM head and cross-entropy, in chunks of 300 tokens.
    constexpr int64_t kVocab = 517;
    Tensor hidden = Random(act, {kRows, kD}, 15);
    Tensor lm_weight = Random(act, {kVocab, kD}, 16, 0.1f);
    Tensor targets = Ids({kRows}, kVocab, 17);
    Tensor d_hidden = Tensor::Empty(DType::kF32, {kRows, kD});
    Tensor d_lm_weight = Tensor::Zeros(DType::kF32, {kVocab, kD});
    absl::StatusOr<float> loss = LmHeadLossForwardBackward(
        ctx, {.hidden = hidden, .weight = lm_weight, .targets = targets, .chunk_tokens = 300},
        {.d_loss = 0.5f, .d_hidden = d_hidden, .d_weight = d_lm_weight}, nullptr);
    Must(loss.status(), "lm_head");
    digests["lm_head loss" + suffix] = Digest().Add(*loss).Add(d_hidden).Add(d_lm_weight).Hex();
  }

  // Embedding, with repeated tokens.
  Tensor windows = Ids({6, 501}, 300, 18);
  Tensor inputs = Tensor::Empty(DType::kI32, {3000}), targets = Tensor::Empty(DType::kI32, {3000});
  Must(SplitTokens(ctx, windows, 300, inputs, targets), "split tokens");
  Tensor table = Random(DType::kF32, {300, 64}, 19);
  Tensor embedded = Tensor::Empty(DType::kF32, {3000, 64});
  Must(EmbeddingForward(ctx, table, inputs, embedded), "embedding");
  Tensor d_table = Random(DType::kF32, {300, 64}, 20);
  Must(EmbeddingBackward(ctx, inputs, Random(DType::kF32, {3000, 64}, 21), d_table),
       "embedding backward");
  digests["embedding"] = Digest().Add(inputs).Add(targets).Add(embedded).Add(d_table).Hex();

  // RoPE and causal attention, GQA, a sequence that is no multiple of the tile.
  const AttentionShape shape = {
      .batch = 2, .seq_len = 300, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32};
  Tensor q = Random(DType::kF32, {600, 128}, 22), k = Random(DType::kF32, {600, 64}, 23);
  Tensor v = Random(DType::kF32, {600, 64}, 24);
  Must(ApplyRope(ctx, shape, 10000.0f, false, q), "rope");
  Must(ApplyRope(ctx, shape, 10000.0f, false, k), "rope");
  Tensor attn = Tensor::Empty(DType::kF32, {600, 128}),
         lse = Tensor::Empty(DType::kF32, {2, 4, 300});
  Must(CausalAttentionForward(ctx, shape, q, k, v, attn, lse), "attention");
  Tensor d_attn = Random(DType::kF32, {600, 128}, 25);
  Tensor d_q = Tensor::Empty(DType::kF32, {600, 128}), d_k = Tensor::Empty(DType::kF32, {600, 64});
  Tensor d_v = Tensor::Empty(DType::kF32, {600, 64});
  Must(CausalAttentionBackward(ctx, shape, q, k, v, attn, lse, d_attn, d_q, d_k, d_v),
       "attention backward");
  Must(ApplyRope(ctx, shape, 10000.0f, true, d_q), "rope");
  digests["rope and attention"] =
      Digest().Add(q).Add(k).Add(attn).Add(lse).Add(d_q).Add(d_k).Add(d_v).Hex();

  // The optimizer's ops over a few tensors that do not end on a chunk boundary.
  std::vector<Tensor> params, grads, m, v_moments;
  std::vector<TensorView> p_views, g_views, m_views, v_views;
  const int64_t sizes[] = {70001, 3, 130000};
  for (int i = 0; i < 3; ++i) {
    params.push_back(Random(DType::kF32, {sizes[i]}, 30 + i));
    grads.push_back(Random(DType::kF32, {sizes[i]}, 40 + i, 0.1f));
    m.push_back(Random(DType::kF32, {sizes[i]}, 50 + i, 0.01f));
    v_moments.push_back(Tensor::Zeros(DType::kF32, {sizes[i]}));
    Must(FillNormal(ctx, v_moments.back(), Rng(3, 0, 0, 60 + i), 1.0f, 0.1f), "fill normal");
  }
  for (int i = 0; i < 3; ++i) {
    p_views.push_back(params[i]);
    g_views.push_back(grads[i]);
    m_views.push_back(m[i]);
    v_views.push_back(v_moments[i]);
  }
  absl::StatusOr<double> norm = SquaredNorm(ctx, g_views);
  Must(norm.status(), "squared norm");
  Must(ScaleTensors(ctx, g_views, 0.75f), "scale");
  absl::StatusOr<bool> finite = AllFinite(ctx, g_views);
  Must(finite.status(), "all finite");
  const std::vector<bool> decay = {true, false, true};
  const AdamWScalars scalars = {0.9f, 0.1f, 0.95f, 0.05f, 1e-3f, 1.2f, 1e-8f, 0.9999f};
  AdamWScalars plain = scalars;
  plain.decay = 1.0f;
  Must(AdamWStep(ctx, {.params = p_views,
                       .grads = g_views,
                       .exp_avg = m_views,
                       .exp_avg_sq = v_views,
                       .weight_decay = &decay,
                       .decaying = scalars,
                       .plain = plain}),
       "adamw");
  Digest optimizer;
  optimizer.Add(*norm).Add(*finite ? 1.0 : 0.0);
  for (int i = 0; i < 3; ++i) optimizer.Add(params[i]).Add(grads[i]).Add(m[i]).Add(v_moments[i]);
  digests["optimizer"] = optimizer.Hex();
  return digests;
}

// Not run by itself: the parent below runs it in a child process per thread count.
TEST(ThreadCountChild, DISABLED_WriteDigests) {
  const char* path = std::getenv(kDigestFileVariable);
  ASSERT_NE(path, nullptr);
  std::ofstream out(path);
  for (const auto& [name, digest] : RunOps()) out << digest << " " << name << "\n";
}

// The digests a child with `threads` pool threads writes.
std::map<std::string, std::string> DigestsWith(int threads) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/thread_count_", getpid(), "_", threads, ".txt");
  const pid_t child = fork();
  if (child == 0) {
    setenv("MOETRAIN_NUM_THREADS", std::to_string(threads).c_str(), 1);
    setenv(kDigestFileVariable, path.c_str(), 1);
    execl("/proc/self/exe", "thread_count_test", "--gtest_also_run_disabled_tests",
          "--gtest_filter=ThreadCountChild.*", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child with " << threads << " threads failed";
  std::map<std::string, std::string> digests;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t space = line.find(' ');
    if (space != std::string::npos) digests[line.substr(space + 1)] = line.substr(0, space);
  }
  std::remove(path.c_str());
  return digests;
}

TEST(ThreadCountTest, OpsGiveTheSameBitsForAnyNumberOfThreads) {
  const std::map<std::string, std::string> one = DigestsWith(1);
  ASSERT_EQ(one.size(), 17u) << "the child wrote no (or too few) digests";
  for (int threads : {2, 3}) {
    const std::map<std::string, std::string> other = DigestsWith(threads);
    for (const auto& [name, digest] : one) {
      EXPECT_EQ(other.count(name) ? other.at(name) : "missing", digest)
          << name << ": 1 thread and " << threads << " threads differ";
    }
  }
  for (const auto& [name, digest] : one) std::printf("%s %s\n", digest.c_str(), name.c_str());
}

}  // namespace
}  // namespace moetrain::ops
