// The MoE layer with its experts spread over ranks against the single-process layer holding every
// expert and the union of the ranks' tokens: out, d_x, the router's, the shared experts' and every
// expert's gradients, the losses and the load counts. The trainer's conventions make them
// comparable: each rank's d_out is the single process's times the world size W (each rank's loss
// is a mean over its own tokens), rank gradients are averaged over ranks, and an expert's gradient
// is summed over its data-parallel replicas and divided by W. W is a power of two, so the scaling
// is exact. Every case runs with several overlap_chunks settings that must agree to the bit.
//
// Ranks are processes (this binary again, running DISABLED_RunOneRank), each with its own Gloo
// communicator over TCP loopback: as threads of one process they would run oneDNN GEMMs
// concurrently, and oneDNN's shared scratchpad then corrupts their results.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/comm/file_kv_store.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/moe/moe_layer.h"
#include "gtest/gtest.h"
#include "tests/engine/moe/expert_parallel_test_util.h"
#include "tests/engine/moe/moe_reference.h"
#include "tests/engine/moe/moe_test_util.h"
#include "tests/integration/child_process.h"

namespace moetrain::moe_test {
namespace {

struct ParallelCase {
  std::string name;
  LayerCase layer;  // layer.tokens: per rank
  int dp = 1;
  int ep = 2;
  std::vector<int> overlap_chunks = {1, 2};  // the first is compared with the single process
  DType dtype = DType::kF32;
  float loss_weight = 1.0f;
  double tolerance = 1e-5;  // relative, ‖a − b‖ / ‖b‖
};

void PrintTo(const ParallelCase& c, std::ostream* os) { *os << c.name; }

// One rank's results.
struct RankRun {
  Tensor out, d_x;                     // (T, D) compute dtype
  Tensor router, gate_up, down;        // grads (E, D), (L, 2F, D), (L, D, F) f32
  Tensor shared_gate_up, shared_down;  // grads; empty when S = 0
  MoeStats stats;
};

// One process with every expert and all W·T tokens.
struct SingleRun {
  EngineInputs in;
  Tensor out, d_x;
  EngineGrads grads;
  MoeStats stats;
};

std::vector<double> Rows(const TensorView& t, int64_t begin, int64_t end) {
  return ToDoubles(t.Slice(begin, end));
}

// W · the rows [begin, end) of t: exact for W a power of two.
Tensor ScaledRows(const TensorView& t, int64_t begin, int64_t end, double scale) {
  std::vector<double> v = Rows(t, begin, end);
  std::vector<float> f(v.begin(), v.end());
  for (float& x : f) x = static_cast<float>(x * scale);
  return MakeTensor(t.dtype(), {end - begin, t.dim(1)}, f);
}

// Runs rank `rank` of the case on its groups; the layer is made for `overlap_chunks`.
void RunRank(const ParallelCase& c, const Problem& p, const EngineInputs& in, int rank,
             Communicator* expert_group, Communicator* world, int overlap_chunks, RankRun* run) {
  const int64_t T = c.layer.tokens, D = p.hidden, F = p.ffn(), SF = p.shared_ffn();
  const int world_size = c.dp * c.ep;
  absl::StatusOr<MoeLayer> layer = MoeLayer::Create(
      p.config, D, c.dtype,
      {.expert_group = expert_group, .count_group = world, .overlap_chunks = overlap_chunks});
  ASSERT_TRUE(layer.ok()) << layer.status();
  const int64_t L = p.experts() / c.ep, first = (rank % c.ep) * L;
  ASSERT_EQ(layer->num_local_experts(), L);
  ASSERT_EQ(layer->first_local_expert(), first);

  MoeWeights weights = in.weights();
  weights.expert_gate_up = in.expert_gate_up.view().Slice(first, first + L);
  weights.expert_down = in.expert_down.view().Slice(first, first + L);
  const TensorView x = in.x.view().Slice(rank * T, (rank + 1) * T);
  const Tensor d_out = ScaledRows(in.d_out, rank * T, (rank + 1) * T, world_size);

  run->out = NanTensor(c.dtype, {T, D});
  run->d_x = NanTensor(c.dtype, {T, D});
  run->router = Tensor::Zeros(DType::kF32, {p.experts(), D});
  run->gate_up = Tensor::Zeros(DType::kF32, {L, 2 * F, D});
  run->down = Tensor::Zeros(DType::kF32, {L, D, F});
  if (SF > 0) {
    run->shared_gate_up = Tensor::Zeros(DType::kF32, {2 * SF, D});
    run->shared_down = Tensor::Zeros(DType::kF32, {D, SF});
  }
  MoeGrads grads = {.router = run->router,
                    .expert_gate_up = run->gate_up,
                    .expert_down = run->down,
                    .shared_gate_up = run->shared_gate_up,
                    .shared_down = run->shared_down};
  ASSERT_OK(layer->Forward(weights, x, c.layer.tokens_per_sequence, run->out, &run->stats));
  ASSERT_OK(layer->Backward(weights, d_out, run->d_x, &grads, c.loss_weight));
}

SingleRun RunSingle(const ParallelCase& c, const Problem& p) {
  SingleRun s;
  s.in = ToEngine(p);
  s.out = NanTensor(c.dtype, {p.tokens, p.hidden});
  s.d_x = NanTensor(c.dtype, {p.tokens, p.hidden});
  s.grads = MakeGrads(p, nullptr);
  absl::StatusOr<MoeLayer> layer = MoeLayer::Create(p.config, p.hidden, c.dtype);
  EXPECT_TRUE(layer.ok()) << layer.status();
  if (!layer.ok()) return s;
  MoeGrads g = s.grads.view();
  EXPECT_TRUE(layer->Forward(s.in.weights(), s.in.x, p.tokens_per_sequence, s.out, &s.stats).ok());
  EXPECT_TRUE(layer->Backward(s.in.weights(), s.in.d_out, s.d_x, &g, c.loss_weight).ok());
  return s;
}

// The mean over ranks of one gradient, or the expert gradients summed over replicas / W.
std::vector<double> MeanOverRanks(const std::vector<RankRun>& runs, Tensor RankRun::*grad) {
  std::vector<double> mean = ToDoubles(runs[0].*grad);
  for (size_t r = 1; r < runs.size(); ++r) {
    const std::vector<double> v = ToDoubles(runs[r].*grad);
    for (size_t i = 0; i < v.size(); ++i) mean[i] += v[i];
  }
  for (double& v : mean) v /= static_cast<double>(runs.size());
  return mean;
}

void ExpectMatchesSingle(const ParallelCase& c, const Problem& p, const SingleRun& single,
                         const std::vector<RankRun>& runs) {
  const int world_size = c.dp * c.ep;
  const int64_t L = p.experts() / c.ep;
  const double tol = c.tolerance;
  std::vector<double> out, d_x;
  std::vector<int64_t> tokens_per_expert(p.experts(), 0);
  double aux = 0.0, z = 0.0;
  for (const RankRun& run : runs) {
    const std::vector<double> o = ToDoubles(run.out), dx = ToDoubles(run.d_x);
    out.insert(out.end(), o.begin(), o.end());
    for (double v : dx) d_x.push_back(v / world_size);
    for (int64_t e = 0; e < p.experts(); ++e)
      tokens_per_expert[e] += run.stats.tokens_per_expert[e];
    aux += run.stats.aux_loss / world_size;
    z += run.stats.z_loss / world_size;
  }
  EXPECT_LT(RelativeError(out, ToDoubles(single.out)), tol) << "out";
  EXPECT_LT(RelativeError(d_x, ToDoubles(single.d_x)), tol) << "d_x";
  EXPECT_EQ(tokens_per_expert, single.stats.tokens_per_expert);
  EXPECT_NEAR(aux, single.stats.aux_loss, tol * std::abs(single.stats.aux_loss) + 1e-12);
  EXPECT_NEAR(z, single.stats.z_loss, tol * std::abs(single.stats.z_loss) + 1e-12);
  EXPECT_LT(RelativeError(MeanOverRanks(runs, &RankRun::router), ToDoubles(single.grads.router)),
            tol)
      << "d_router";
  if (p.shared_ffn() > 0) {
    EXPECT_LT(RelativeError(MeanOverRanks(runs, &RankRun::shared_gate_up),
                            ToDoubles(single.grads.shared_gate_up)),
              tol)
        << "d_shared_gate_up";
    EXPECT_LT(RelativeError(MeanOverRanks(runs, &RankRun::shared_down),
                            ToDoubles(single.grads.shared_down)),
              tol)
        << "d_shared_down";
  }
  // Each expert on its own: the sum over its replicas (one per expert group) divided by W.
  for (int64_t e = 0; e < p.experts(); ++e) {
    const int64_t owner = e / L, local = e % L;
    for (auto [grad, name, total] :
         {std::tuple{&RankRun::gate_up, "d_gate_up", &single.grads.expert_gate_up},
          std::tuple{&RankRun::down, "d_down", &single.grads.expert_down}}) {
      const int64_t block = (runs[0].*grad).numel() / L;
      std::vector<double> sum(block, 0.0);
      for (int g = 0; g < c.dp; ++g) {
        const std::vector<double> v =
            ToDoubles((runs[g * c.ep + owner].*grad).view().Select(local));
        for (int64_t i = 0; i < block; ++i) sum[i] += v[i] / world_size;
      }
      EXPECT_LT(RelativeError(sum, ToDoubles(total->view().Select(e))), tol)
          << name << " of expert " << e << " (" << single.stats.tokens_per_expert[e] << " pairs)";
    }
  }
}

void ExpectIdentical(const RankRun& a, const RankRun& b) {
  EXPECT_TRUE(BitIdentical(a.out, b.out));
  EXPECT_TRUE(BitIdentical(a.d_x, b.d_x));
  EXPECT_TRUE(BitIdentical(a.router, b.router));
  EXPECT_TRUE(BitIdentical(a.gate_up, b.gate_up));
  EXPECT_TRUE(BitIdentical(a.down, b.down));
  if (!a.shared_gate_up.empty()) {
    EXPECT_TRUE(BitIdentical(a.shared_gate_up, b.shared_gate_up));
    EXPECT_TRUE(BitIdentical(a.shared_down, b.shared_down));
  }
  EXPECT_EQ(a.stats.aux_loss, b.stats.aux_loss);
  EXPECT_EQ(a.stats.z_loss, b.stats.z_loss);
}

// ---------------------------------------------------------------------------------------------
// Ranks as processes: the parent starts W copies of this binary running DISABLED_RunOneRank, each
// writes its runs to <dir>/rank<r>.bin, and the parent reads them back.

constexpr char kDirEnv[] = "MOETRAIN_EP_TEST_DIR";
constexpr char kCaseEnv[] = "MOETRAIN_EP_TEST_CASE";
constexpr char kRankEnv[] = "MOETRAIN_EP_TEST_RANK";

std::filesystem::path RankFile(const std::filesystem::path& dir, int rank) {
  return dir / ("rank" + std::to_string(rank) + ".bin");
}

// Each tensor as its dtype, rank, dims and bytes; an absent one as rank -1.
void WriteTensor(std::ofstream& out, const Tensor& t) {
  const int32_t dtype = static_cast<int32_t>(t.dtype()), rank = t.empty() ? -1 : t.view().rank();
  out.write(reinterpret_cast<const char*>(&dtype), sizeof(dtype));
  out.write(reinterpret_cast<const char*>(&rank), sizeof(rank));
  if (rank < 0) return;
  for (int64_t d : t.view().shape()) out.write(reinterpret_cast<const char*>(&d), sizeof(d));
  out.write(static_cast<const char*>(t.view().raw()), t.numel() * DTypeSize(t.dtype()));
}

Tensor ReadTensor(std::ifstream& in) {
  int32_t dtype = 0, rank = -1;
  in.read(reinterpret_cast<char*>(&dtype), sizeof(dtype));
  in.read(reinterpret_cast<char*>(&rank), sizeof(rank));
  if (!in || rank < 0 || rank > kMaxRank) return Tensor();
  std::vector<int64_t> shape(rank);
  for (int64_t& d : shape) in.read(reinterpret_cast<char*>(&d), sizeof(d));
  Tensor t = Tensor::Empty(static_cast<DType>(dtype), shape);
  in.read(static_cast<char*>(t.view().raw()), t.numel() * DTypeSize(t.dtype()));
  return t;
}

constexpr Tensor RankRun::*kRankTensors[] = {&RankRun::out,        &RankRun::d_x,
                                             &RankRun::router,     &RankRun::gate_up,
                                             &RankRun::down,       &RankRun::shared_gate_up,
                                             &RankRun::shared_down};

void WriteRuns(const std::filesystem::path& path, const std::vector<RankRun>& runs) {
  std::ofstream out(path, std::ios::binary);
  for (const RankRun& run : runs) {
    for (Tensor RankRun::*t : kRankTensors) WriteTensor(out, run.*t);
    const int64_t experts = static_cast<int64_t>(run.stats.tokens_per_expert.size());
    out.write(reinterpret_cast<const char*>(&experts), sizeof(experts));
    out.write(reinterpret_cast<const char*>(run.stats.tokens_per_expert.data()),
              experts * sizeof(int64_t));
    out.write(reinterpret_cast<const char*>(&run.stats.aux_loss), sizeof(float));
    out.write(reinterpret_cast<const char*>(&run.stats.z_loss), sizeof(float));
  }
}

std::vector<RankRun> ReadRuns(const std::filesystem::path& path, size_t count) {
  std::ifstream in(path, std::ios::binary);
  std::vector<RankRun> runs(count);
  for (RankRun& run : runs) {
    for (Tensor RankRun::*t : kRankTensors) run.*t = ReadTensor(in);
    int64_t experts = 0;
    in.read(reinterpret_cast<char*>(&experts), sizeof(experts));
    run.stats.tokens_per_expert.resize(in ? experts : 0);
    in.read(reinterpret_cast<char*>(run.stats.tokens_per_expert.data()),
            run.stats.tokens_per_expert.size() * sizeof(int64_t));
    in.read(reinterpret_cast<char*>(&run.stats.aux_loss), sizeof(float));
    in.read(reinterpret_cast<char*>(&run.stats.z_loss), sizeof(float));
  }
  EXPECT_TRUE(in.good()) << "short or missing " << path;
  return runs;
}

std::vector<ParallelCase> ParallelCases() {
  using enum ScoreFunction;
  using enum AuxLossType;
  const MoeConfig softmax = {.num_experts = 8,
                             .top_k = 2,
                             .expert_ffn_dim = 20,
                             .num_shared_experts = 1,
                             .aux_loss = kSwitch,
                             .aux_loss_coeff = 0.5f,
                             .z_loss_coeff = 0.05f};
  const MoeConfig sigmoid = {.num_experts = 16,
                             .top_k = 4,
                             .expert_ffn_dim = 20,
                             .score_function = kSigmoid,
                             .routed_scaling_factor = 2.5f,
                             .num_groups = 4,
                             .group_top_k = 2,
                             .expert_bias = true,
                             .aux_loss = kSwitch,
                             .aux_loss_coeff = 0.5f};
  MoeConfig sequence = softmax;
  sequence.aux_loss = kSequence;
  MoeConfig no_shared = softmax;
  no_shared.num_shared_experts = 0;
  const MoeConfig k_equals_e = {.num_experts = 4, .top_k = 4, .expert_ffn_dim = 20};
  // T = 29, 23, ... tokens per rank, D = 24, F = 20: no size is a multiple of a tile.
  auto make = [](std::string name, const MoeConfig& config, int64_t tokens, uint32_t seed) {
    ParallelCase c;
    c.name = name;
    c.layer.name = std::move(name);
    c.layer.config = config;
    c.layer.tokens = tokens;
    c.layer.seed = seed;
    return c;
  };
  std::vector<ParallelCase> cases;
  cases.push_back(make("Ep2SoftmaxSharedSwitchAuxZLoss", softmax, 29, 1));
  cases.back().overlap_chunks = {1, 2, 3, 4, 1};
  cases.push_back(make("Ep4SigmoidBiasGroups", sigmoid, 23, 2));
  cases.back().ep = 4;
  cases.back().overlap_chunks = {1, 2, 4};
  cases.push_back(make("Dp2Ep2CountsOverTheWorld", softmax, 19, 3));
  cases.back().dp = 2;
  cases.back().loss_weight = 0.5f;
  cases.push_back(make("Ep2SequenceAuxLoss", sequence, 24, 4));
  cases.back().layer.tokens_per_sequence = 8;
  // Expert 7 gets no pair and expert 6 one.
  cases.push_back(make("Ep2DeadAndSingleExpert", no_shared, 21, 5));
  cases.back().layer.init = Init::kDeadAndSingleExpert;
  cases.back().overlap_chunks = {1, 2, 4};
  // Every token picks experts 0 and 1: rank 0 computes everything, rank 1 receives nothing.
  cases.push_back(make("Ep2AllTokensToRankZero", softmax, 17, 6));
  cases.back().layer.init = Init::kZeroRouter;
  cases.back().overlap_chunks = {1, 2, 4};
  cases.push_back(make("Ep2TopKEqualsNumExperts", k_equals_e, 13, 7));
  // One expert per rank: one chunk whatever overlap_chunks asks.
  cases.push_back(make("Ep4OneExpertEach", k_equals_e, 11, 8));
  cases.back().ep = 4;
  cases.back().overlap_chunks = {1, 0};
  cases.push_back(make("Ep2OneTokenPerRank", softmax, 1, 9));
  cases.push_back(make("Ep2LargeBf16", sigmoid, 256, 10));
  cases.back().layer.hidden = 64;
  cases.back().dtype = DType::kBF16;
  cases.back().tolerance = 1e-2;
  return cases;
}

// The problem of a case: W·T tokens, every expert.
Problem CaseProblem(const ParallelCase& c) {
  LayerCase all = c.layer;
  all.tokens = c.layer.tokens * c.dp * c.ep;
  return MakeProblem(all, c.dtype);
}

// One rank of the case named in the environment; a no-op in a plain run of the tests.
TEST(MoeLayerExpertParallelRank, DISABLED_RunOneRank) {
  const char* dir = std::getenv(kDirEnv);
  const char* name = std::getenv(kCaseEnv);
  const char* rank_text = std::getenv(kRankEnv);
  if (dir == nullptr || name == nullptr || rank_text == nullptr) GTEST_SKIP() << "a child only";
  const int rank = std::atoi(rank_text);
  const std::vector<ParallelCase> cases = ParallelCases();
  const auto found = std::find_if(cases.begin(), cases.end(),
                                  [&](const ParallelCase& c) { return c.name == name; });
  ASSERT_NE(found, cases.end()) << name;
  const ParallelCase& c = *found;
  const int world_size = c.dp * c.ep;
  const Problem p = CaseProblem(c);
  const EngineInputs in = ToEngine(p);

  absl::StatusOr<std::shared_ptr<FileKeyValueStore>> store =
      FileKeyValueStore::Open(std::filesystem::path(dir) / "kv");
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> world =
      GlooCommunicator::Create(comm_test::Gloo(*store, rank, world_size));
  ASSERT_TRUE(world.ok()) << world.status();
  std::vector<int> members;
  for (int i = 0; i < c.ep; ++i) members.push_back(rank / c.ep * c.ep + i);
  absl::StatusOr<std::unique_ptr<Communicator>> expert_group = (*world)->Subgroup(members);
  ASSERT_TRUE(expert_group.ok()) << expert_group.status();

  std::vector<RankRun> runs(c.overlap_chunks.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    RunRank(c, p, in, rank, expert_group->get(), world->get(), c.overlap_chunks[i], &runs[i]);
    if (HasFatalFailure()) return;
  }
  WriteRuns(RankFile(dir, rank), runs);
}

class MoeLayerExpertParallelTest : public ::testing::TestWithParam<ParallelCase> {};

TEST_P(MoeLayerExpertParallelTest, MatchesOneProcessWithEveryExpert) {
  const ParallelCase& c = GetParam();
  const int world_size = c.dp * c.ep;
  const Problem p = CaseProblem(c);
  if (c.layer.init != Init::kZeroRouter) {
    // Rank and single process compute the router's logits in GEMMs of different heights, which
    // may differ in the last bit: no routing decision may be that close.
    const reference::Routing routing =
        reference::Route(p.config, ToReference(p), ToDoubles(p.x), p.tokens, p.tokens_per_sequence);
    ASSERT_GT(routing.selection_margin, 1e-5) << "seed " << c.layer.seed << " has a near-tie";
  }

  TempDir dir;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  std::vector<std::unique_ptr<testutil::Child>> ranks;
  for (int rank = 0; rank < world_size; ++rank) {
    ranks.push_back(std::make_unique<testutil::Child>(self));
    ASSERT_EQ(ranks.back()->Start(
                  {"--gtest_filter=MoeLayerExpertParallelRank.DISABLED_RunOneRank",
                   "--gtest_also_run_disabled_tests"},
                  dir.path(),
                  {{kDirEnv, dir.path().string()},
                   {kCaseEnv, c.name},
                   {kRankEnv, std::to_string(rank)},
                   // Up to 4 ranks share the cores: idle OpenMP threads sleep instead of spinning.
                   {"OMP_WAIT_POLICY", "passive"}}),
              "");
  }
  const SingleRun single = RunSingle(c, p);
  std::vector<std::vector<RankRun>> runs(c.overlap_chunks.size());
  for (std::vector<RankRun>& by_rank : runs) by_rank.resize(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    const testutil::Finished finished = ranks[rank]->Wait(std::chrono::seconds(60));
    ASSERT_EQ(finished.exit_code, 0) << "rank " << rank << ":\n" << finished.out << finished.err;
    std::vector<RankRun> by_setting = ReadRuns(RankFile(dir.path(), rank), runs.size());
    for (size_t i = 0; i < runs.size(); ++i) runs[i][rank] = std::move(by_setting[i]);
  }
  if (HasFailure()) return;
  ExpectMatchesSingle(c, p, single, runs[0]);
  for (size_t i = 1; i < runs.size(); ++i) {
    for (int rank = 0; rank < world_size; ++rank) {
      SCOPED_TRACE(::testing::Message() << "overlap_chunks " << c.overlap_chunks[i] << " vs "
                                        << c.overlap_chunks[0] << ", rank " << rank);
      ExpectIdentical(runs[i][rank], runs[0][rank]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, MoeLayerExpertParallelTest, ::testing::ValuesIn(ParallelCases()),
                         [](const ::testing::TestParamInfo<ParallelCase>& info) {
                           return info.param.name;
                         });

// ---------------------------------------------------------------------------------------------
// Construction.

TEST(MoeLayerExpertParallelCreateTest, ValidatesTheLayoutAndNamesTheLocalExperts) {
  TempDir dir;
  RankGroups groups = MakeRankGroups(dir.path(), 1, 4);
  ASSERT_EQ(groups.expert.size(), 4u);
  const MoeConfig config = {.num_experts = 6, .top_k = 2, .expert_ffn_dim = 8};
  absl::StatusOr<MoeLayer> bad =
      MoeLayer::Create(config, 16, DType::kF32, {.expert_group = groups.expert[0].get()});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find(
                "model.moe.num_experts = 6 is not divisible by parallel.expert_parallel = 4"),
            std::string::npos)
      << bad.status();
  EXPECT_EQ(MoeLayer::Create(config, 16, DType::kF32, {.overlap_chunks = -1}).status().code(),
            absl::StatusCode::kInvalidArgument);

  MoeConfig eight = config;
  eight.num_experts = 8;
  for (int rank = 0; rank < 4; ++rank) {
    absl::StatusOr<MoeLayer> layer =
        MoeLayer::Create(eight, 16, DType::kF32, {.expert_group = groups.expert[rank].get()});
    ASSERT_TRUE(layer.ok()) << layer.status();
    EXPECT_EQ(layer->num_local_experts(), 2);
    EXPECT_EQ(layer->first_local_expert(), 2 * rank);
  }
  absl::StatusOr<MoeLayer> whole = MoeLayer::Create(eight, 16, DType::kF32);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->num_local_experts(), 8);
  EXPECT_EQ(whole->first_local_expert(), 0);

  // Weights must hold the local experts only; the check fails before any collective.
  absl::StatusOr<MoeLayer> layer =
      MoeLayer::Create(eight, 16, DType::kF32, {.expert_group = groups.expert[0].get()});
  ASSERT_TRUE(layer.ok());
  const Tensor router = Tensor::Zeros(DType::kF32, {8, 16});
  const Tensor all_gate_up = Tensor::Zeros(DType::kF32, {8, 16, 16});
  const Tensor down = Tensor::Zeros(DType::kF32, {2, 16, 8});
  const Tensor x = Tensor::Zeros(DType::kF32, {3, 16});
  Tensor out = Tensor::Zeros(DType::kF32, {3, 16});
  const absl::Status status = layer->Forward({.router = router,
                                              .expert_bias = {},
                                              .expert_gate_up = all_gate_up,
                                              .expert_down = down,
                                              .shared_gate_up = {},
                                              .shared_down = {}},
                                             x, 0, out, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("weights.expert_gate_up"), std::string::npos) << status;
}

}  // namespace
}  // namespace moetrain::moe_test
