// Which failures of a rank no restart can fix: the codes FailureKindOf maps, and the errors the
// trainer really returns for the cases that must not be retried (data whose token ids exceed the
// vocabulary, a resume over another model's checkpoint, a precision or device the trainer lacks)
// and for some that may be (a missing data file, on this worker).
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"
#include "moetrain/v1/job_spec.h"
#include "tests/testing/testing.h"
#include "worker/job_config.h"
#include "worker/rank_runner.h"

namespace moetrain {
namespace {

namespace fs = std::filesystem;

class FailureKindTest : public ::testing::Test {
 protected:
  // A tiny job; `extra` is appended to the YAML (top-level sections not otherwise written).
  absl::StatusOr<TrainerConfig> Config(const std::string& model, const std::string& extra = "") {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(absl::StrCat(
        "name: kinds\nmodel: {vocab_size: 64, hidden_size: ", model,
        ", num_layers: 2, num_heads: 2, ffn_dim: 32, moe: {num_experts: 4, top_k: 2, "
        "expert_ffn_dim: 16}}\ntrain: {steps: 2, batch_size: 2, seq_len: 16, log_every: 1}\n"
        "checkpoint: {every_steps: 2}\n",
        extra));
    if (!spec.ok()) return spec.status();
    return TrainerConfigFromSpec(*spec, dir_.path().string());
  }

  const testutil::TempDir dir_{"failure_kind_test"};
};

TEST_F(FailureKindTest, CodesThatSayTheJobIsWrongArePermanentAndTheRestTransient) {
  for (absl::StatusCode code :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition,
        absl::StatusCode::kOutOfRange, absl::StatusCode::kUnimplemented}) {
    EXPECT_EQ(FailureKindOf(absl::Status(code, "x")), v1::FAILURE_KIND_PERMANENT) << code;
  }
  for (absl::StatusCode code :
       {absl::StatusCode::kInternal, absl::StatusCode::kUnavailable,
        absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kAborted,
        absl::StatusCode::kResourceExhausted, absl::StatusCode::kDataLoss,
        absl::StatusCode::kUnknown, absl::StatusCode::kNotFound,
        absl::StatusCode::kPermissionDenied, absl::StatusCode::kCancelled}) {
    EXPECT_EQ(FailureKindOf(absl::Status(code, "x")), v1::FAILURE_KIND_TRANSIENT) << code;
  }
}

// A file-system call that fails (a busy or non-empty directory, a rename across devices, a file
// too large, a flaky mount's EINVAL) may succeed on another attempt: IoError never says the job
// is wrong, and keeps the codes that say more (a missing file, no permission, a full disk).
TEST_F(FailureKindTest, IoErrorsAreTransientWhateverTheErrno) {
  for (int error_number : {EBUSY, ENOTEMPTY, EXDEV, EFBIG, EINVAL, EPIPE, EOVERFLOW, ENOTSUP}) {
    const absl::Status status = IoError(error_number, "rename /ckpt/step-1");
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_EQ(FailureKindOf(status), v1::FAILURE_KIND_TRANSIENT) << status;
    EXPECT_NE(status.message().find("rename /ckpt/step-1"), std::string::npos) << status;
    EXPECT_NE(status.message().find(std::strerror(error_number)), std::string::npos) << status;
  }
  EXPECT_EQ(IoError(ENOENT, "open x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(IoError(EACCES, "open x").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(IoError(ENOSPC, "write x").code(), absl::StatusCode::kResourceExhausted);
  for (int error_number : {ENOENT, EACCES, ENOSPC}) {
    EXPECT_EQ(FailureKindOf(IoError(error_number, "x")), v1::FAILURE_KIND_TRANSIENT);
  }
}

// A spec the trainer refuses fails the same way on every worker; a missing GPU is the worker's.
TEST_F(FailureKindTest, ASpecTheTrainerRefusesIsPermanentAMissingGpuIsNot) {
  // Power-of-two scales under DELAYED, which does not read them: parses, but is refused.
  absl::StatusOr<v1::JobSpec> fp8 = ParseJobSpecYaml(
      "name: kinds\ntrain: {precision: FP8, fp8: {recipe: DELAYED, power_2_scales: true}}\n");
  ASSERT_OK(fp8);
  absl::StatusOr<TrainerConfig> config = TrainerConfigFromSpec(*fp8, dir_.path().string());
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("train.fp8.power_2_scales"), std::string::npos)
      << config.status();
  EXPECT_EQ(FailureKindOf(config.status()), v1::FAILURE_KIND_PERMANENT) << config.status();
  // FP8 itself is runnable.
  fp8->mutable_train()->mutable_fp8()->clear_power_2_scales();
  EXPECT_OK(TrainerConfigFromSpec(*fp8, dir_.path().string()));
  // A CUDA job on a machine without a usable GPU: the job is fine, the place is not (a worker
  // whose GPUs vanished after it started; one without any cannot offer CUDA).
  DeviceReport no_gpus;
  no_gpus.no_gpu_reason = "cudaErrorNoDevice";
  const absl::Status no_gpu = CheckUsableGpu(no_gpus);
  EXPECT_EQ(FailureKindOf(no_gpu), v1::FAILURE_KIND_TRANSIENT) << no_gpu;
}

TEST_F(FailureKindTest, TokenIdsPastTheVocabularyArePermanentAMissingFileIsNot) {
  std::vector<uint16_t> tokens(512);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 64);
  tokens[100] = 300;
  const fs::path data = dir_.path() / "tokens.u16";
  std::ofstream(data, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()),
             static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
  absl::StatusOr<TrainerConfig> config =
      Config("32", absl::StrCat("data: {format: U16, path: ", data.string(), "}\n"));
  ASSERT_OK(config);
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config);
  ASSERT_FALSE(trainer.ok());
  EXPECT_NE(trainer.status().message().find("token 300"), std::string::npos) << trainer.status();
  EXPECT_EQ(FailureKindOf(trainer.status()), v1::FAILURE_KIND_PERMANENT) << trainer.status();

  // Another worker may have the file (its mount, its copy): worth another attempt.
  config = Config(
      "32", absl::StrCat("data: {format: U16, path: ", (dir_.path() / "absent").string(), "}\n"));
  ASSERT_OK(config);
  trainer = Trainer::Create(*config);
  ASSERT_FALSE(trainer.ok());
  EXPECT_EQ(FailureKindOf(trainer.status()), v1::FAILURE_KIND_TRANSIENT) << trainer.status();
}

TEST_F(FailureKindTest, ResumeOverAnotherModelsCheckpointIsPermanent) {
  absl::StatusOr<TrainerConfig> first = Config("32");
  ASSERT_OK(first);
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*first);
  ASSERT_OK(trainer);
  ASSERT_OK((*trainer)->Run(nullptr));

  absl::StatusOr<TrainerConfig> other = Config("64");
  ASSERT_OK(other);
  absl::StatusOr<std::unique_ptr<Trainer>> resumed = Trainer::Create(*other);
  ASSERT_OK(resumed);
  const absl::Status status = (*resumed)->Resume(nullptr);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("different model"), std::string::npos) << status;
  EXPECT_EQ(FailureKindOf(status), v1::FAILURE_KIND_PERMANENT) << status;
}

// NaN everywhere in the embedding: the step's loss is NaN.
void Poison(Trainer& trainer) {
  TensorView embed = trainer.model().parameters()[0].value;
  for (int64_t i = 0; i < embed.numel(); ++i) embed.data<float>()[i] = std::nanf("");
  ASSERT_OK(trainer.model().SyncComputeWeights());
}

// The job's first step computes from what every attempt starts with: a NaN there is the spec's
// (its scales, its data, its init_from) and no restart helps. A later one resumes from a
// checkpoint, which may get past it.
TEST_F(FailureKindTest, ANonFiniteLossAtTheFirstStepIsPermanentALaterOneIsNot) {
  absl::StatusOr<TrainerConfig> config = Config("32");
  ASSERT_OK(config);
  config->checkpoint_every = 1;
  absl::StatusOr<std::unique_ptr<Trainer>> first = Trainer::Create(*config);
  ASSERT_OK(first);
  Poison(**first);
  const absl::Status at_first = (*first)->Run(nullptr);
  ASSERT_FALSE(at_first.ok());
  EXPECT_NE(at_first.message().find("step 1: the loss is not finite"), std::string::npos)
      << at_first;
  EXPECT_EQ(FailureKindOf(at_first), v1::FAILURE_KIND_PERMANENT) << at_first;

  config->stop_after_step = 1;
  absl::StatusOr<std::unique_ptr<Trainer>> healthy = Trainer::Create(*config);
  ASSERT_OK(healthy);
  ASSERT_OK((*healthy)->Run(nullptr));
  config->stop_after_step = 0;
  absl::StatusOr<std::unique_ptr<Trainer>> resumed = Trainer::Create(*config);
  ASSERT_OK(resumed);
  ASSERT_OK((*resumed)->Resume(nullptr));
  ASSERT_EQ((*resumed)->step(), 1);
  Poison(**resumed);
  const absl::Status later = (*resumed)->Run(nullptr);
  ASSERT_FALSE(later.ok());
  EXPECT_NE(later.message().find("step 2: the loss is not finite"), std::string::npos) << later;
  EXPECT_EQ(FailureKindOf(later), v1::FAILURE_KIND_TRANSIENT) << later;
}

}  // namespace
}  // namespace moetrain
