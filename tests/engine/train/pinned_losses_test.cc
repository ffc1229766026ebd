// The per-step losses and gradient norms of a few short runs, pinned bit for bit: any change to
// the engine that moves a single bit of a forward, backward or update shows here. The values
// were recorded with the engine as it was before the op layer (engine/ops) replaced the direct
// CPU calls, so this test is the proof that the refactor changed no result.
//
// oneDNN picks its GEMM kernels and their blocking by the CPU (its instruction set, its caches),
// and kernels for different CPUs round differently (AMX bf16 tiles against AVX-512 bf16 dot
// products, say). So the bits are compared on the CPU model they were recorded on; elsewhere the
// values must agree to a relative 1e-3, which still catches any change of the math.
//
// To record new values (only when a change of results is intended, and said so in its commit):
//   MOETRAIN_PRINT_PINNED_LOSSES=1 build/bin/pinned_losses_test
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/comm/gloo_communicator.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "tests/engine/comm/comm_test_util.h"
#include "tests/engine/train/tiny_trainer_config.h"

namespace moetrain {
namespace {

// oneDNN's instruction set for its GEMMs on this CPU.
std::string GemmIsa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    default:
      return absl::StrCat("isa ", static_cast<int>(dnnl::get_effective_cpu_isa()));
  }
}

// The CPU model (from /proc/cpuinfo) and the instruction set oneDNN runs on it.
std::string CpuSignature() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return absl::StrCat(model, ", oneDNN ", GemmIsa());
}

// What a run reports at every step, as the bits of the doubles the trainer reports.
struct Trace {
  std::vector<uint64_t> loss;
  std::vector<uint64_t> grad_norm;
  uint64_t eval_loss = 0;
};

class TraceRecorder : public TrainObserver {
 public:
  void OnStep(const StepReport& report) override {
    trace.loss.push_back(std::bit_cast<uint64_t>(report.loss));
    trace.grad_norm.push_back(std::bit_cast<uint64_t>(report.grad_norm));
    if (report.eval_loss.has_value()) trace.eval_loss = std::bit_cast<uint64_t>(*report.eval_loss);
  }
  Trace trace;
};

// The trainer tests' tiny job (f32, sigmoid routing with the expert bias, a shared expert, the
// switch aux loss, two micro-batches), with a clip that clips.
TrainerConfig TinyF32() {
  TrainerConfig c = testing_config::TinyTrainerConfig("");
  c.steps = 12;
  c.schedule.total_steps = 12;
  c.grad_clip = 0.25;
  c.eval_every = 12;
  c.eval_batches = 2;
  c.data.synthetic_eval_sequences = 16;
  return c;
}

// DeepSeek-V3-like routing in bf16: group-limited sigmoid top-3 of 8 with the expert bias and a
// routed scale, the sequence aux loss, the z-loss, a capacity that drops, tied embeddings.
TrainerConfig GroupedBf16() {
  TrainerConfig c = TinyF32();
  c.compute_dtype = DType::kBF16;
  c.model.num_layers = 3;
  c.model.tie_embeddings = true;
  c.model.moe.num_experts = 8;
  c.model.moe.top_k = 3;
  c.model.moe.num_groups = 4;
  c.model.moe.group_top_k = 2;
  c.model.moe.routed_scaling_factor = 2.5f;
  c.model.moe.aux_loss = AuxLossType::kSequence;
  c.model.moe.aux_loss_coeff = 1e-2f;
  c.model.moe.z_loss_coeff = 1e-3f;
  c.model.moe.capacity_factor = 1.0f;
  c.model.moe.drop_policy = DropPolicy::kProbability;
  return c;
}

// Softmax after top-k without normalisation, capacity by position, one micro-batch.
TrainerConfig SoftmaxAfterTopK() {
  TrainerConfig c = TinyF32();
  c.model.moe.score_function = ScoreFunction::kSoftmax;
  c.model.moe.softmax_before_topk = false;
  c.model.moe.normalize_topk_weights = false;
  c.model.moe.expert_bias = false;
  c.model.moe.num_shared_experts = 0;
  c.model.moe.capacity_factor = 1.25f;
  c.model.moe.drop_policy = DropPolicy::kPosition;
  c.micro_batch_size = 0;
  return c;
}

// The tiny job on two expert-parallel ranks (Gloo over loopback, overlap in two chunks), with
// the z-loss; every rank reports the global step, and rank 0's trace is kept.
TrainerConfig ExpertParallel() {
  TrainerConfig c = TinyF32();
  c.model.moe.z_loss_coeff = 1e-3f;
  c.parallel.expert_parallel = 2;
  c.parallel.grad_bucket_bytes = 8 << 10;
  return c;
}

Trace RunSingle(const TrainerConfig& config) {
  TraceRecorder recorder;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return {};
  const absl::Status status = (*trainer)->Run(&recorder);
  EXPECT_TRUE(status.ok()) << status;
  return recorder.trace;
}

Trace RunTwoRanks(const TrainerConfig& config) {
  testutil::TempDir dir;
  std::vector<std::unique_ptr<GlooCommunicator>> world = comm_test::MakeGlooWorld(dir.path(), 2);
  if (world.size() != 2) return {};
  std::vector<std::shared_ptr<Communicator>> shared;
  for (auto& comm : world) shared.push_back(std::move(comm));
  Trace traces[2];
  absl::Status statuses[2];
  comm_test::RunRanks(
      2,
      [&](int rank) {
        TraceRecorder recorder;
        absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config, shared[rank]);
        statuses[rank] = trainer.status();
        if (!trainer.ok()) return;
        statuses[rank] = (*trainer)->Run(&recorder);
        traces[rank] = recorder.trace;
      },
      std::chrono::seconds(120));
  for (const absl::Status& status : statuses) EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(traces[0].loss, traces[1].loss) << "the ranks report different global losses";
  return traces[0];
}

void Print(const char* name, const Trace& t) {
  const auto list = [](const std::vector<uint64_t>& bits) {
    std::string out;
    for (uint64_t b : bits) absl::StrAppend(&out, absl::StrFormat("0x%016xu, ", b));
    return out;
  };
  std::printf("  // %s\n  {\"%s\",\n   {%s},\n   {%s},\n   0x%016llxu},\n", name, name,
              list(t.loss).c_str(), list(t.grad_norm).c_str(),
              static_cast<unsigned long long>(t.eval_loss));
}

struct Pinned {
  const char* name;
  std::vector<uint64_t> loss;
  std::vector<uint64_t> grad_norm;
  uint64_t eval_loss;
};

// Recorded on this CPU.
constexpr char kRecordedCpu[] = "AMD EPYC, oneDNN avx512_core_bf16";
const std::vector<Pinned>& PinnedTraces() {
  static const std::vector<Pinned>* traces = new std::vector<Pinned>{
      // tiny_f32
      {"tiny_f32",
       {
           0x400bb6f8f0000000u,
           0x400b56ebe0000000u,
           0x400aba14a0000000u,
           0x400a1e8620000000u,
           0x4009b55a20000000u,
           0x400931f700000000u,
           0x4008b04910000000u,
           0x40084be170000000u,
           0x400837fdf0000000u,
           0x4007cb7720000000u,
           0x4007e9b6b0000000u,
           0x4007a2c300000000u,
       },
       {
           0x3ff08ab2f83a74dfu,
           0x3fed070677837adcu,
           0x3feda907a3ad21afu,
           0x3feea6cc316cbd2cu,
           0x3fecc541e8f65bbeu,
           0x3fee00d7d93a22f0u,
           0x3fed21bad46513c2u,
           0x3fede68a52e7cbe2u,
           0x3febbf5420e7b37eu,
           0x3fec594a93443e83u,
           0x3fec1ee654914b15u,
           0x3feecf94e3a526eau,
       },
       0x40079e58d0000000u},
      // grouped_bf16
      {"grouped_bf16",
       {
           0x400ba8bda0000000u,
           0x400b4fe9b0000000u,
           0x400ac67a90000000u,
           0x400a1fc030000000u,
           0x4009c42e00000000u,
           0x40095cd580000000u,
           0x4008d913d0000000u,
           0x4008b93290000000u,
           0x40087d2f00000000u,
           0x400824aed0000000u,
           0x40082d79c0000000u,
           0x4007e80460000000u,
       },
       {
           0x3ff091972b5ec980u,
           0x3febabc07812019fu,
           0x3fed909366901488u,
           0x3fec60346571bf38u,
           0x3fed9d23f70505f3u,
           0x3fee03e36cbde3e9u,
           0x3feac0f271fd58a0u,
           0x3fec64dc4d20fddeu,
           0x3fe71b54519ebac7u,
           0x3feacb27d3186b8au,
           0x3fea1a60cb47a066u,
           0x3fec6f70509cb262u,
       },
       0x40081a4a60000000u},
      // softmax_after_topk
      {"softmax_after_topk",
       {
           0x400bab09c0000000u,
           0x400b67ea00000000u,
           0x400ab09a80000000u,
           0x4009f980a0000000u,
           0x40097a7980000000u,
           0x4009154bc0000000u,
           0x400865f300000000u,
           0x400844ac40000000u,
           0x4008246060000000u,
           0x4007b83680000000u,
           0x4007b85580000000u,
           0x40076bf940000000u,
       },
       {
           0x3ff12a8a2c744cc9u,
           0x3fee16d3709bdb8fu,
           0x3fef3affcce016cau,
           0x3fef5b7c9803880fu,
           0x3fed5d74ee257358u,
           0x3fee4b4b3d86b1b2u,
           0x3fed90eb8cfe2292u,
           0x3fee18ecdf5b7a00u,
           0x3febf0f1aaa9674cu,
           0x3fed9b2aa3157ad8u,
           0x3fed04a2c97d3391u,
           0x3fef5a54d1aea578u,
       },
       0x400783bae0000000u},
      // expert_parallel_2
      {"expert_parallel_2",
       {
           0x400bb6f8f0000000u,
           0x400b5730f8000000u,
           0x400aba0110000000u,
           0x400a1d3338000000u,
           0x4009b4bfe0000000u,
           0x40093189a8000000u,
           0x4008afb898000000u,
           0x40084c2b80000000u,
           0x40083784a0000000u,
           0x4007cb2230000000u,
           0x4007ea6768000000u,
           0x4007a32408000000u,
       },
       {
           0x3ff08ac7a625858du,
           0x3fed0581f888ca7bu,
           0x3fedae92c4fb39ccu,
           0x3feea15e15178a86u,
           0x3fecba868b591c58u,
           0x3fee048fcd1e3116u,
           0x3fed26b5524ffc2cu,
           0x3feded726d29ef4cu,
           0x3febbff0371e82f5u,
           0x3fec5b63e5f7d6acu,
           0x3fec251a76c0ece1u,
           0x3feed33e6cc1126cu,
       },
       0x40079e0068000000u},
  };
  return *traces;
}

double AsDouble(uint64_t bits) { return std::bit_cast<double>(bits); }

void ExpectMatches(const Pinned& want, const Trace& got) {
  SCOPED_TRACE(want.name);
  ASSERT_EQ(got.loss.size(), want.loss.size());
  ASSERT_EQ(got.grad_norm.size(), want.grad_norm.size());
  const bool exact = CpuSignature() == kRecordedCpu;
  if (!exact) {
    std::printf("%s: this CPU is %s, the values were recorded on %s: compared to 1e-3\n", want.name,
                CpuSignature().c_str(), kRecordedCpu);
  }
  const auto expect = [&](const char* what, size_t step, uint64_t want_bits, uint64_t got_bits) {
    const double w = AsDouble(want_bits), g = AsDouble(got_bits);
    if (exact) {
      EXPECT_EQ(want_bits, got_bits)
          << what << " of step " << step + 1 << ": pinned " << w << ", got " << g;
    } else {
      EXPECT_NEAR(g, w, 1e-3 * std::fabs(w)) << what << " of step " << step + 1;
    }
  };
  for (size_t i = 0; i < want.loss.size(); ++i) {
    expect("loss", i, want.loss[i], got.loss[i]);
    expect("grad norm", i, want.grad_norm[i], got.grad_norm[i]);
  }
  expect("eval loss", want.loss.size() - 1, want.eval_loss, got.eval_loss);
}

TEST(PinnedLossesTest, EveryStepMatchesTheRecordedBits) {
  const struct {
    const char* name;
    TrainerConfig config;
    bool two_ranks;
  } runs[] = {{"tiny_f32", TinyF32(), false},
              {"grouped_bf16", GroupedBf16(), false},
              {"softmax_after_topk", SoftmaxAfterTopK(), false},
              {"expert_parallel_2", ExpertParallel(), true}};
  const bool print = std::getenv("MOETRAIN_PRINT_PINNED_LOSSES") != nullptr;
  if (print) std::printf("constexpr char kRecordedCpu[] = \"%s\";\n", CpuSignature().c_str());
  for (const auto& run : runs) {
    const Trace trace = run.two_ranks ? RunTwoRanks(run.config) : RunSingle(run.config);
    if (print) {
      Print(run.name, trace);
      continue;
    }
    const Pinned* pinned = nullptr;
    for (const Pinned& p : PinnedTraces()) {
      if (std::string(p.name) == run.name) pinned = &p;
    }
    ASSERT_NE(pinned, nullptr) << run.name << " has no pinned trace";
    ExpectMatches(*pinned, trace);
  }
}

// The pinned runs are worth their bits only if they exercise what they claim: the clip clips.
TEST(PinnedLossesTest, TheTinyRunClipsItsGradients) {
  TraceRecorder recorder;
  const TrainerConfig config = TinyF32();
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->Run(&recorder).ok());
  int clipped = 0;
  for (uint64_t bits : recorder.trace.grad_norm) clipped += AsDouble(bits) > config.grad_clip;
  EXPECT_GT(clipped, 0);
}

}  // namespace
}  // namespace moetrain
