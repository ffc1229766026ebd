// The memory estimate: sizes parse, the parameter count is the model's, the whole estimate is
// within a sane factor of the peak memory a real trainer reaches in two steps, and an oversized
// model is refused naming both figures.
#include "engine/train/memory_estimate.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/core/host_pages.h"
#include "engine/model/transformer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/comm/comm_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ParseByteSizeTest, AcceptsBinaryUnitsAndPlainBytes) {
  const std::pair<const char*, int64_t> cases[] = {
      {"4096", 4096},     {"512MiB", 512ll << 20}, {"8GiB", 8ll << 30}, {"8G", 8ll << 30},
      {"8Gi", 8ll << 30}, {"1.5GiB", 3ll << 29},   {"2TiB", 2ll << 40}, {"64KiB", 64ll << 10},
      {"100B", 100},      {" 1gib ", 1ll << 30}};
  for (const auto& [text, bytes] : cases) {
    absl::StatusOr<int64_t> parsed = ParseByteSize(text, "--memory-limit");
    ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.status();
    EXPECT_EQ(*parsed, bytes) << text;
  }
}

TEST(ParseByteSizeTest, RefusesWhatIsNotASizeNamingTheFlag) {
  for (const char* text : {"", "GiB", "8 parsecs", "-1GiB", "0", "0.1", "1e30", "99999999TiB"}) {
    absl::StatusOr<int64_t> parsed = ParseByteSize(text, "--memory-limit");
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(parsed.status().message(), HasSubstr("--memory-limit")) << text;
  }
}

TEST(FormatBytesTest, PicksTheLargestUnitBelowTheSize) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(3 * 1024), "3.00 KiB");
  EXPECT_EQ(FormatBytes(1.5 * 1024 * 1024 * 1024), "1.50 GiB");
}

TEST(MachineMemoryTest, IsPositive) {
  absl::StatusOr<int64_t> bytes = MachineMemoryBytes();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_GT(*bytes, int64_t{64} << 20);
}

// A model whose memory is mostly parameters and optimizer state (~150 MiB), or mostly
// activations (`activation_heavy`, long sequences).
TrainerConfig MeasuredConfig(bool activation_heavy, DType dtype) {
  TrainerConfig c;
  c.model.vocab_size = 2048;
  c.model.hidden_size = activation_heavy ? 128 : 256;
  c.model.num_layers = 3;
  c.model.num_heads = 4;
  c.model.num_kv_heads = 2;
  c.model.ffn_dim = 512;
  c.model.first_dense_layers = 1;
  c.model.moe.num_experts = activation_heavy ? 4 : 16;
  c.model.moe.top_k = 2;
  c.model.moe.expert_ffn_dim = activation_heavy ? 128 : 512;
  c.model.moe.num_shared_experts = 1;
  c.data.format = DataConfig::Format::kSynthetic;
  c.data.vocab_size = c.data.synthetic_vocab_size = 2048;
  c.data.seq_len = c.model.max_seq_len = activation_heavy ? 512 : 32;
  c.data.batch_size = activation_heavy ? 16 : 2;
  c.compute_dtype = dtype;
  c.steps = 2;
  c.log_every = 1;
  return c;
}

int64_t StatusFieldKiB(const char* field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    long kib = 0;
    if (line.rfind(field, 0) == 0 &&
        std::sscanf(line.c_str() + std::strlen(field), ": %ld", &kib) == 1) {
      return kib;
    }
  }
  return -1;
}

TEST(MemoryEstimateTest, CountsTheModelsParameters) {
  const TrainerConfig config = MeasuredConfig(false, DType::kF32);
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config);
  ASSERT_OK(trainer.status());
  const double elements = static_cast<double>((*trainer)->model().master_buffer().numel());
  const MemoryEstimate estimate = EstimateTrainingMemory(config);
  // The buffer pads each tensor to 16 elements.
  EXPECT_NEAR(estimate.parameters / 4, elements, 0.001 * elements);
  EXPECT_DOUBLE_EQ(estimate.gradients, estimate.parameters);
  EXPECT_NEAR(estimate.optimizer, 2 * estimate.parameters, 0.001 * estimate.parameters);
}

// The moments each rank of a dp × ep job allocates (ranks as threads, Gloo over loopback).
std::vector<double> MomentBytesPerRank(const TrainerConfig& config) {
  const int ranks = config.parallel.world_size();
  testutil::TempDir dir;
  std::vector<std::unique_ptr<GlooCommunicator>> world =
      comm_test::MakeGlooWorld(dir.path(), ranks);
  std::vector<double> bytes(ranks, -1);
  comm_test::RunRanks(ranks, [&](int rank) {
    absl::StatusOr<std::unique_ptr<Trainer>> trainer =
        Trainer::Create(config, std::shared_ptr<Communicator>(std::move(world[rank])));
    ASSERT_OK(trainer.status());
    bytes[rank] = static_cast<double>((*trainer)->optimizer().state_bytes());
  });
  return bytes;
}

// ZeRO-1 keeps about 1/W of the dense moments and 1/dp of the experts' on each rank, bf16 moments
// half the bytes; the estimate says so, within 1 % of what every rank allocates.
TEST(MemoryEstimateTest, ShardedAndBf16MomentsAreWhatTheRanksAllocate) {
  for (const auto& [dp, ep] : {std::pair(4, 1), std::pair(2, 2)}) {
    for (const DType moments : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(
          absl::StrCat("dp ", dp, " ep ", ep, " ", std::string(DTypeName(moments)), " moments"));
      TrainerConfig config = MeasuredConfig(false, DType::kF32);
      config.data.batch_size = 4;
      config.parallel.data_parallel = dp;
      config.parallel.expert_parallel = ep;
      config.optimizer.moment_dtype = moments;
      const std::vector<double> unsharded = MomentBytesPerRank(config);
      config.parallel.sharding = Sharding::kOptimizer;
      const std::vector<double> sharded = MomentBytesPerRank(config);
      const double estimate = EstimateTrainingMemory(config).optimizer;
      for (int rank = 0; rank < dp * ep; ++rank) {
        EXPECT_LE(sharded[rank], (1.0 / dp + 0.05) * unsharded[rank]) << "rank " << rank;
        EXPECT_NEAR(sharded[rank], estimate, 0.01 * estimate) << "rank " << rank;
      }
      config.parallel.sharding = Sharding::kNone;
      EXPECT_NEAR(unsharded[0], EstimateTrainingMemory(config).optimizer, 0.01 * unsharded[0]);
    }
  }
}

// ZeRO-2 keeps about 1/W of the dense gradients and 1/dp of the experts' on each rank, and with
// several micro-batches an accumulator as large: measured after two steps (the gradient buffer's
// resident pages, by mincore, and the accumulator), every rank holds its share (the moments'
// elements, as ZeRO-1 cuts them) within 5 % plus the pages its blocks share with let-go
// neighbours, which is under the estimate's peak (the share and the buckets in flight).
TEST(MemoryEstimateTest, ShardedGradientsHoldTheRanksShare) {
  for (const int64_t micro_batches : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(micro_batches, " micro-batches"));
    TrainerConfig config = MeasuredConfig(false, DType::kF32);
    config.data.batch_size = 8;
    config.micro_batch_size = 8 / micro_batches;
    config.parallel.data_parallel = 4;
    config.parallel.sharding = Sharding::kGradients;
    config.parallel.grad_bucket_bytes = 256 << 10;
    const int ranks = config.parallel.world_size();
    testutil::TempDir dir;
    std::vector<std::unique_ptr<GlooCommunicator>> world =
        comm_test::MakeGlooWorld(dir.path(), ranks);
    std::vector<double> held(ranks, -1), whole(ranks, -1);
    std::vector<int64_t> buckets(ranks);
    comm_test::RunRanks(ranks, [&](int rank) {
      absl::StatusOr<std::unique_ptr<Trainer>> trainer =
          Trainer::Create(config, std::shared_ptr<Communicator>(std::move(world[rank])));
      ASSERT_OK(trainer.status());
      ASSERT_OK((*trainer)->Run(nullptr));
      const TensorView grads = (*trainer)->model().grad_buffer();
      absl::StatusOr<int64_t> resident = ResidentHostBytes(grads.raw(), grads.numel() * 4);
      ASSERT_OK(resident.status());
      held[rank] =
          static_cast<double>(*resident + (*trainer)->grad_sync().accumulator().view().numel() * 4);
      whole[rank] = static_cast<double>(grads.numel() * 4);
      buckets[rank] = (*trainer)->grad_sync().num_buckets();
    });
    const MemoryEstimate estimate = EstimateTrainingMemory(config);
    const double share = estimate.optimizer / 2 * static_cast<double>(micro_batches);
    for (int rank = 0; rank < ranks; ++rank) {
      SCOPED_TRACE(absl::StrCat("rank ", rank));
      const double slack = 3.0 * static_cast<double>(buckets[rank] * sysconf(_SC_PAGESIZE));
      EXPECT_GE(held[rank], 0.95 * share);
      EXPECT_LE(held[rank], 1.05 * share + slack);
      EXPECT_LT(held[rank], estimate.gradients);
      EXPECT_LT(held[rank], (micro_batches == 1 ? 0.35 : 0.6) * whole[rank]);
    }
  }
}

// The activations the estimate counts are what the model's buffers hold after a forward and
// backward, within 10 %, with and without full recompute, which keeps less than half of them here
// (the LM head's chunk of logits is most of what is left); GQA and MLA with MTP, f32 and bf16, one
// rank and two expert-parallel ranks.
TEST(MemoryEstimateTest, ActivationsAreWhatTheModelHoldsWithAndWithoutRecompute) {
  ModelConfig mla = MeasuredConfig(true, DType::kF32).model;
  mla.attention = AttentionType::kMla;
  mla.num_kv_heads = mla.num_heads;
  mla.mla = {.q_lora_rank = 48,
             .kv_lora_rank = 32,
             .qk_nope_head_dim = 32,
             .qk_rope_head_dim = 16,
             .v_head_dim = 32};
  mla.mtp_depth = 1;
  for (const bool is_mla : {false, true}) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      for (const int ep : {1, 2}) {
        if ((ep == 2) != (is_mla == (dtype == DType::kF32))) continue;  // four of the eight
        TrainerConfig config = MeasuredConfig(true, dtype);
        config.model.num_layers = 6;
        config.model.moe.top_k = 4;
        config.data.batch_size = 4;
        if (is_mla) config.model = mla;
        config.parallel.expert_parallel = ep;
        const int64_t window = config.data.seq_len + 1 + config.model.mtp_depth;
        Tensor tokens = Tensor::Empty(DType::kI32, {config.data.batch_size / ep, window});
        for (int64_t i = 0; i < tokens.numel(); ++i) {
          tokens.data<int32_t>()[i] = static_cast<int32_t>((i * 7919 + 13) % 2048);
        }
        std::vector<int64_t> held[3];
        for (const Recompute recompute :
             {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
          config.recompute = recompute;
          SCOPED_TRACE(absl::StrCat(is_mla ? "MLA+MTP " : "GQA ", std::string(DTypeName(dtype)),
                                    " ep ", ep, " recompute ", RecomputeName(recompute)));
          testutil::TempDir dir;
          std::vector<std::unique_ptr<GlooCommunicator>> group =
              comm_test::MakeGlooWorld(dir.path(), ep);
          std::vector<int64_t>& bytes = held[static_cast<int>(recompute)];
          bytes.assign(ep, 0);
          comm_test::RunRanks(ep, [&](int rank) {
            absl::StatusOr<Transformer> model =
                Transformer::Create(config.model, dtype, {.expert_group = group[rank].get()},
                                    ExecContext::Cpu(), std::nullopt, recompute);
            ASSERT_OK(model.status());
            ASSERT_OK(model->Initialize(3));
            ASSERT_OK(model->ForwardBackward(tokens.view()).status());
            bytes[rank] = model->activation_bytes();
          });
          const double estimate = EstimateTrainingMemory(config).activations;
          for (int rank = 0; rank < ep; ++rank) {
            EXPECT_NEAR(static_cast<double>(bytes[rank]), estimate, 0.1 * estimate)
                << "rank " << rank;
          }
        }
        EXPECT_LT(held[1][0], held[0][0]);
        EXPECT_LT(held[2][0], held[1][0]);
        EXPECT_LT(2 * held[2][0], held[0][0]);
      }
    }
  }
}

// The peak resident memory that creating the trainer of `config` and running it adds, and that
// it is within a factor of two of the estimate, either way.
void ExpectEstimateWithinAFactorOfTwoOfTheMeasuredPeak(const TrainerConfig& config) {
  const MemoryEstimate estimate = EstimateTrainingMemory(config);
  // Resets VmHWM to the current RSS, so that earlier tests of this process do not count.
  std::ofstream("/proc/self/clear_refs") << "5";
  const int64_t before_kib = StatusFieldKiB("VmRSS");
  ASSERT_GT(before_kib, 0);
  {
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config);
    ASSERT_OK(trainer.status());
    TrainObserver quiet;
    ASSERT_OK((*trainer)->Run(&quiet));
  }
  const double measured = static_cast<double>(StatusFieldKiB("VmHWM") - before_kib) * 1024;
  std::printf("estimate %s, measured peak growth %s\n", estimate.DebugString().c_str(),
              FormatBytes(measured).c_str());
  EXPECT_GE(estimate.total(), 0.5 * measured) << estimate.DebugString();
  EXPECT_LE(estimate.total(), 2.0 * measured) << estimate.DebugString();
}

class MeasuredPeakTest : public ::testing::TestWithParam<std::tuple<bool, DType>> {};

// Training two steps.
TEST_P(MeasuredPeakTest, EstimateIsWithinAFactorOfTwoOfTheMeasuredPeak) {
  const auto [activation_heavy, dtype] = GetParam();
  ExpectEstimateWithinAFactorOfTwoOfTheMeasuredPeak(MeasuredConfig(activation_heavy, dtype));
}

INSTANTIATE_TEST_SUITE_P(Shapes, MeasuredPeakTest,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const ::testing::TestParamInfo<std::tuple<bool, DType>>& info) {
                           return std::string(std::get<0>(info.param) ? "Activations"
                                                                      : "Parameters") +
                                  (std::get<1>(info.param) == DType::kF32 ? "F32" : "BF16");
                         });

// With an FP8 recipe the largest pair of quantised GEMM operands is added, and nothing else
// changes. The activation-heavy config's largest is its dense FFN's gate_up backward-weight GEMM:
// dy (8192 × 1024) and x (8192 × 128); its routed experts quantise 4096 rows of one expert at a
// time.
TEST(MemoryEstimateTest, CountsTheFp8OperandsOfTheLargestLayer) {
  TrainerConfig config = MeasuredConfig(true, DType::kBF16);
  const MemoryEstimate bf16 = EstimateTrainingMemory(config);
  config.fp8 = Fp8RecipeConfig{};
  const MemoryEstimate fp8 = EstimateTrainingMemory(config);
  EXPECT_DOUBLE_EQ(fp8.parameters, bf16.parameters);
  EXPECT_DOUBLE_EQ(fp8.optimizer, bf16.optimizer);
  const double operands = 8192.0 * (1024 + 128);
  EXPECT_NEAR(fp8.activations - bf16.activations, operands * (1 + 4.0 / 128), 1.0);
}

// The delayed recipe's state as the trainer allocates it: Fp8SlotCount is the slots the model
// registers; per slot 16 bytes on the device, amax_history_len floats of history on the host, and
// the larger of the step's end (host copies, 16 bytes a slot) and the checkpoint's copy, whose
// size is SaveState's tensor, as is what it adds to a checkpoint step.
TEST(MemoryEstimateTest, CountsTheDelayedFp8StateAsTheTrainerAllocatesIt) {
  TrainerConfig config = MeasuredConfig(false, DType::kBF16);
  config.fp8 = Fp8RecipeConfig{};
  config.fp8->amax_history_len = 64;
  ASSERT_OK_AND_ASSIGN(const std::unique_ptr<Trainer> trainer, Trainer::Create(config));
  const Fp8State* state = trainer->model().fp8_state();
  ASSERT_NE(state, nullptr);
  double slots = 0;
  for (const Fp8State::LinearInfo& linear : state->linears()) {
    slots += static_cast<double>(linear.groups * kNumFp8Roles);
  }
  EXPECT_EQ(Fp8SlotCount(config.model), slots);
  ASSERT_OK_AND_ASSIGN(const Tensor saved, state->SaveState());
  const double saved_bytes = static_cast<double>(saved.numel()) * 4;
  EXPECT_EQ(saved_bytes, 4 * slots * (1 + 64));

  const MemoryEstimate estimate = EstimateTrainingMemory(config);
  EXPECT_DOUBLE_EQ(estimate.fp8_state - estimate.fp8_state_host, 16 * slots);
  EXPECT_DOUBLE_EQ(estimate.fp8_state_host, 4 * slots * 64 + saved_bytes);
  EXPECT_DOUBLE_EQ(estimate.total(), estimate.parameters + estimate.gradients + estimate.optimizer +
                                         estimate.activations + estimate.fp8_state);
  EXPECT_THAT(estimate.DebugString(), HasSubstr(", fp8 state "));
  TrainerConfig bf16 = config;
  bf16.fp8.reset();
  EXPECT_DOUBLE_EQ(EstimateCheckpointBytes(config) - EstimateCheckpointBytes(bf16), saved_bytes);
  EXPECT_EQ(EstimateTrainingMemory(bf16).fp8_state, 0.0);
  EXPECT_THAT(EstimateTrainingMemory(bf16).DebugString(), Not(HasSubstr("fp8")));

  // Over several ranks each step's end also all-gathers the slots: 16 bytes a slot per rank.
  config.fp8->amax_history_len = 1;
  config.parallel.data_parallel = 4;
  EXPECT_DOUBLE_EQ(EstimateTrainingMemory(config).fp8_state_host, 4 * slots + 16 * slots * (2 + 4));
  // A device keeps only the slots' own numbers; the rest is host memory.
  config.device = Device::Cuda(0);
  const MemoryEstimate on_gpu = EstimateTrainingMemory(config);
  const MemoryPlacement placed = PlaceTrainingMemory(config, on_gpu);
  EXPECT_DOUBLE_EQ(placed.host, on_gpu.gradients + on_gpu.optimizer + on_gpu.fp8_state_host);
  EXPECT_DOUBLE_EQ(placed.device, on_gpu.total() - on_gpu.fp8_state_host);
}

// A model whose memory is mostly its amax history (256 experts a block, 4,096 steps of history:
// 4,662 slots of 16 KiB, and as much again while the checkpoint copies it): the estimate was a
// few MiB for 150 MiB of use; now it is within a factor of two of the measured peak.
TEST(MemoryEstimateTest, EstimateOfAnFp8HistoryIsWithinAFactorOfTwoOfTheMeasuredPeak) {
  const testutil::TempDir dir("memory_estimate_fp8");
  TrainerConfig config = MeasuredConfig(false, DType::kBF16);
  config.model.hidden_size = 32;
  config.model.ffn_dim = 64;
  config.model.moe.num_experts = 256;
  config.model.moe.expert_ffn_dim = 8;
  config.model.moe.num_shared_experts = 0;
  config.fp8 = Fp8RecipeConfig{};
  config.fp8->amax_history_len = 4096;
  config.checkpoint_dir = dir.path().string();
  const MemoryEstimate estimate = EstimateTrainingMemory(config);
  ASSERT_GT(estimate.fp8_state, 0.5 * estimate.total()) << estimate.DebugString();
  ExpectEstimateWithinAFactorOfTwoOfTheMeasuredPeak(config);
}

// The history of the whole model is bounded where its slots are known: slots × amax_history_len
// floats at most 2^28, refused naming the field and the length this model allows.
TEST(MemoryEstimateTest, TrainerRefusesAnFp8HistoryOverItsBound) {
  TrainerConfig config;
  config.model.num_layers = 2;
  config.model.moe.num_experts = 1 << 16;
  config.model.moe.expert_ffn_dim = 1;
  config.fp8 = Fp8RecipeConfig{};
  config.fp8->amax_history_len = 4096;
  const double slots = Fp8SlotCount(config.model);
  ASSERT_GT(slots * 4096, kMaxFp8HistoryFloats);
  const absl::Status refused = config.Validate();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  const int64_t allowed = static_cast<int64_t>(std::floor(kMaxFp8HistoryFloats / slots));
  EXPECT_THAT(refused.message(),
              HasSubstr(absl::StrCat("train.fp8.amax_history_len = 4096 over the model's ",
                                     static_cast<int64_t>(slots), " FP8 scaling slots")));
  EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("at most ", allowed, " for this model")));
  config.fp8->amax_history_len = allowed;
  EXPECT_OK(config.Validate());
  // Only the delayed recipe keeps a history.
  config.fp8->amax_history_len = 4096;
  config.fp8->recipe = Fp8RecipeKind::kCurrent;
  EXPECT_OK(config.Validate());
}

TEST(MemoryEstimateTest, RefusesTheOversizedModelNamingBothFigures) {
  // The model: 4096 wide, 8 layers, 64 experts of the default width.
  TrainerConfig config;
  config.model.hidden_size = 4096;
  config.model.num_layers = 8;
  config.model.num_heads = 32;
  config.model.num_kv_heads = 32;
  config.model.moe.num_experts = 64;
  const MemoryEstimate estimate = EstimateTrainingMemory(config);
  EXPECT_GT(estimate.total(), 64.0 * (1ll << 30)) << estimate.DebugString();
  const absl::Status refused = CheckMemoryEstimate(estimate, int64_t{16} << 30, "--memory-limit");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr(FormatBytes(estimate.total())));
  EXPECT_THAT(refused.message(), HasSubstr("16.00 GiB"));
  EXPECT_THAT(refused.message(), HasSubstr("--memory-limit"));
  EXPECT_TRUE(CheckMemoryEstimate(estimate, int64_t{1} << 50, "--memory-limit").ok());
}

TEST(MemoryEstimateTest, HostileSizesGiveAHugeFiniteEstimate) {
  TrainerConfig config;
  config.model.vocab_size = (int64_t{1} << 31) - 1;
  config.model.hidden_size = int64_t{1} << 30;
  config.model.num_heads = 1;
  config.model.num_kv_heads = 1;
  config.data.batch_size = int64_t{1} << 30;
  const MemoryEstimate estimate = EstimateTrainingMemory(config);
  EXPECT_TRUE(std::isfinite(estimate.total()));
  EXPECT_EQ(CheckMemoryEstimate(estimate, int64_t{1} << 40, "--memory-limit").code(),
            absl::StatusCode::kResourceExhausted);
}

// A GPU job's parameters, grads, moments and activations are device memory; the host holds only
// a checkpoint's copy of the weights and moments. On the CPU everything is host memory, and the
// check is CheckMemoryEstimate's.
TEST(MemoryEstimateTest, PlacesADeviceJobsMemoryOnTheDevice) {
  TrainerConfig config;
  config.compute_dtype = DType::kBF16;
  const MemoryEstimate estimate = EstimateTrainingMemory(config);
  const MemoryPlacement on_cpu = PlaceTrainingMemory(config, estimate);
  EXPECT_EQ(on_cpu.host, estimate.total());
  EXPECT_EQ(on_cpu.device, 0.0);
  config.device = Device::Cuda(0);
  const MemoryPlacement on_gpu = PlaceTrainingMemory(config, estimate);
  EXPECT_EQ(on_gpu.device, estimate.total());
  EXPECT_EQ(on_gpu.host, estimate.gradients + estimate.optimizer);
  EXPECT_LT(on_gpu.host, estimate.total());

  config.device = Device::Cpu();
  const int64_t too_small = static_cast<int64_t>(estimate.total() / 2);
  EXPECT_EQ(CheckTrainingMemory(config, estimate, too_small, "--memory-limit").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(CheckTrainingMemory(config, estimate, 0, "--memory-limit").ok());
  config.device = Device::Cuda(0);
  const absl::Status on_device = CheckTrainingMemory(config, estimate, 0, "--memory-limit");
  if (absl::StatusOr<ExecContext> gpu = ExecContext::ForDevice(config.device); !gpu.ok()) {
    // No GPU here: the device's own error, not a guess at its memory.
    EXPECT_EQ(on_device.code(), gpu.status().code()) << on_device;
  } else {
    // A host limit that the whole estimate exceeds but the checkpoint copy fits in.
    EXPECT_TRUE(CheckTrainingMemory(config, estimate, static_cast<int64_t>(on_gpu.host) + 1,
                                    "--memory-limit")
                    .ok());
  }
}

}  // namespace
}  // namespace moetrain
