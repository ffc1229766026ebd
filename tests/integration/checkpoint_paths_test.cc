// Checkpoints on disk and the paths a job may touch, with the real binaries (issue 13, items 7
// and 10): `moetrain run --resume` past a damaged newest checkpoint; a spec's checkpoint.dir
// outside the coordinator's root refused at submit (what the text shows) or by the worker (what
// only its file system shows); data.path confined by --data-root, symbolic links followed.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "tests/engine/train/checkpoint_files.h"
#include "tests/integration/service_test_util.h"

namespace moetrain::testutil {
namespace {

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string StepDirName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

// `job`'s YAML with `checkpoint.dir: dir`.
std::string WithCheckpointDir(const TinySpec& job, const std::string& dir) {
  return absl::StrReplaceAll(
      job.Yaml(), {{"\ncheckpoint:\n", absl::StrCat("\ncheckpoint:\n  dir: \"", dir, "\"\n")}});
}

// `job`'s YAML reading raw uint16 tokens from `path` instead of the synthetic source.
std::string WithDataPath(const TinySpec& job, const std::string& path) {
  return absl::StrReplaceAll(job.Yaml(),
                             {{"  format: SYNTHETIC\n  synthetic_vocab_size: 32\n",
                               absl::StrCat("  format: U16\n  path: \"", path, "\"\n")}});
}

// 16,384 tokens below the tiny model's vocabulary (64), as raw little-endian uint16.
void WriteTokens(const fs::path& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (int i = 0; i < 16384; ++i) {
    const uint16_t token = static_cast<uint16_t>((i * 7 + i / 64) % 64);
    out.write(reinterpret_cast<const char*>(&token), sizeof(token));
  }
  ASSERT_TRUE(out.good()) << path;
}

class CheckpointPathsTest : public ServiceTest {
 protected:
  // Writes `yaml` as <dir>/<file> and submits it with the CLI.
  Finished SubmitYaml(const std::string& yaml, const std::string& file) {
    const fs::path path = dir_ / file;
    std::ofstream(path) << yaml;
    return Moetrain({"submit", path.string(), "--json"});
  }

  // The id of a job submitted with `yaml`, which must be accepted.
  std::string SubmitOk(const std::string& yaml, const std::string& file) {
    const Finished submitted = SubmitYaml(yaml, file);
    EXPECT_EQ(submitted.exit_code, 0) << submitted.err;
    const nlohmann::json job = nlohmann::json::parse(submitted.out, nullptr, false);
    return job.is_object() ? job.value("id", "") : "";
  }

  // Waits for the job to end; the job as it ended (state UNSPECIFIED when it cannot be read).
  v1::Job WaitForEnd(const std::string& job_id) {
    std::optional<v1::Job> job;
    const bool ended = WaitUntil(
        [&] {
          job = GetJob(job_id);
          return job.has_value() &&
                 (job->state() == v1::JOB_STATE_SUCCEEDED || job->state() == v1::JOB_STATE_FAILED ||
                  job->state() == v1::JOB_STATE_CANCELLED);
        },
        std::chrono::seconds(180));
    EXPECT_TRUE(ended) << "job " << job_id << " did not end";
    return job.value_or(v1::Job());
  }
};

// `moetrain run --resume` with a bit-flipped newest checkpoint: resume passes over it, training
// reaches its step again and writes it anew (today: "step-00000030 already exists", exit 1).
TEST_F(CheckpointPathsTest, RunResumesPastADamagedNewestCheckpoint) {
  TinySpec job;
  job.steps = 40;
  job.eval_every = 0;
  const fs::path spec = WriteSpec(job);
  const fs::path checkpoints = dir_ / "ckpt";
  const EnvChanges one_thread = {{"MOETRAIN_NUM_THREADS", "1"}, {"OMP_NUM_THREADS", "1"}};
  {
    Child run(Binary("moetrain"));
    ASSERT_EQ(run.Start({"run", spec.string(), "--checkpoint-dir", checkpoints.string(), "--steps",
                         "30", "--json"},
                        dir_, one_thread),
              "");
    const Finished finished = run.Wait(std::chrono::seconds(300));
    ASSERT_EQ(finished.exit_code, 0) << finished.err;
  }
  const fs::path root = checkpoints / "tiny";
  ASSERT_EQ(Entries(root),
            (std::set<std::string>{StepDirName(10), StepDirName(20), StepDirName(30)}));
  FlipMiddleByte(root / StepDirName(30) / "model-rank00000.safetensors");

  Child resumed(Binary("moetrain"));
  ASSERT_EQ(resumed.Start({"run", spec.string(), "--checkpoint-dir", checkpoints.string(),
                           "--resume", "--json"},
                          dir_, one_thread),
            "");
  const Finished finished = resumed.Wait(std::chrono::seconds(300));
  EXPECT_EQ(finished.exit_code, 0) << finished.err;
  EXPECT_TRUE(Contains(finished.out + finished.err, StepDirName(30))) << "the damage is not shown";
  // Steps 30 and 40 written anew; the damaged copy pruned.
  EXPECT_EQ(Entries(root),
            (std::set<std::string>{StepDirName(20), StepDirName(30), StepDirName(40)}));
}

TEST_F(CheckpointPathsTest, SubmitRefusesACheckpointDirOutsideTheRoot) {
  StartCoordinator();
  TinySpec job = ServiceSpec();
  for (const std::string& dir : {std::string("/tmp/elsewhere"), std::string("../.."),
                                 (dir_ / "checkpoints" / ".." / "elsewhere").string()}) {
    const Finished refused = SubmitYaml(WithCheckpointDir(job, dir), "outside.yaml");
    EXPECT_EQ(refused.exit_code, 2) << dir << ": " << refused.err;
    EXPECT_TRUE(Contains(refused.err, absl::StrCat("checkpoint.dir = '", dir, "'"))) << refused.err;
  }
  // Under the root: accepted (and written there, <dir>/<job id>).
  StartWorker("w1");
  const fs::path team = dir_ / "checkpoints" / "team";
  const std::string job_id = SubmitOk(WithCheckpointDir(job, team.string()), "team.yaml");
  ASSERT_FALSE(job_id.empty());
  EXPECT_EQ(WaitForEnd(job_id).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(fs::exists(team / job_id / StepDirName(60)));
}

// Issue 31, item 3: a `..` after a directory that does not exist passed the checks, which
// normalized it away, and then failed the job after training, whose writes took the path as
// written. The worker resolves the path once and the trainer writes where it was checked.
TEST_F(CheckpointPathsTest, ACheckpointDirThroughAMissingDirectoryIsWrittenWhereChecked) {
  StartCoordinator();
  StartWorker("w1");
  TinySpec job = ServiceSpec();
  job.max_restarts = 0;
  const std::string dir = (dir_ / "checkpoints" / "missing" / ".." / "team").string();
  const std::string job_id = SubmitOk(WithCheckpointDir(job, dir), "dotdot.yaml");
  ASSERT_FALSE(job_id.empty());
  const v1::Job ended = WaitForEnd(job_id);
  EXPECT_EQ(ended.state(), v1::JOB_STATE_SUCCEEDED) << ended.state_reason();
  EXPECT_TRUE(fs::exists(dir_ / "checkpoints" / "team" / job_id / StepDirName(job.steps)));
  EXPECT_FALSE(fs::exists(dir_ / "checkpoints" / "missing"));
}

// A link inside the root that leads out of it: only the worker's file system shows it. The
// attempt fails for good (no restart), nothing is written through the link.
TEST_F(CheckpointPathsTest, TheWorkerRefusesACheckpointDirLinkedOutOfTheRoot) {
  StartCoordinator();
  StartWorker("w1");
  fs::create_directories(dir_ / "checkpoints");
  fs::create_directories(dir_ / "elsewhere");
  fs::create_directory_symlink(dir_ / "elsewhere", dir_ / "checkpoints" / "escape");
  TinySpec job = ServiceSpec();
  job.max_restarts = 2;
  const std::string dir = (dir_ / "checkpoints" / "escape").string();
  const std::string job_id = SubmitOk(WithCheckpointDir(job, dir), "escape.yaml");
  ASSERT_FALSE(job_id.empty());
  const v1::Job ended = WaitForEnd(job_id);
  EXPECT_EQ(ended.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ended.restarts(), 0) << "no other attempt can succeed";
  EXPECT_TRUE(Contains(ended.state_reason(), absl::StrCat("checkpoint.dir = '", dir, "'")))
      << ended.state_reason();
  EXPECT_TRUE(Entries(dir_ / "elsewhere").empty()) << "written through the link";
}

TEST_F(CheckpointPathsTest, AWorkerWithDataRootsReadsOnlyUnderThem) {
  fs::create_directories(dir_ / "data");
  fs::create_directories(dir_ / "elsewhere");
  WriteTokens(dir_ / "data" / "tokens.bin");
  WriteTokens(dir_ / "elsewhere" / "secret.bin");
  fs::create_symlink(dir_ / "elsewhere" / "secret.bin", dir_ / "data" / "link.bin");
  StartCoordinator();
  StartWorker("w1", {"--data-root", (dir_ / "data").string()});
  TinySpec job = ServiceSpec();
  job.max_restarts = 2;

  const std::string good =
      SubmitOk(WithDataPath(job, (dir_ / "data" / "tokens.bin").string()), "good.yaml");
  EXPECT_EQ(WaitForEnd(good).state(), v1::JOB_STATE_SUCCEEDED);
  for (const fs::path& path : {dir_ / "elsewhere" / "secret.bin", dir_ / "data" / "link.bin"}) {
    const std::string job_id = SubmitOk(WithDataPath(job, path.string()), "outside.yaml");
    const v1::Job ended = WaitForEnd(job_id);
    EXPECT_EQ(ended.state(), v1::JOB_STATE_FAILED) << path;
    EXPECT_EQ(ended.restarts(), 0) << path;
    const std::string& reason = ended.state_reason();
    EXPECT_TRUE(Contains(reason, absl::StrCat("data.path = '", path.string(), "'"))) << reason;
    EXPECT_TRUE(Contains(reason, (dir_ / "data").string())) << reason;
  }
}

TEST_F(CheckpointPathsTest, ACoordinatorWithDataRootsRefusesOtherPathsAtSubmit) {
  StartCoordinator(0, {"--data-root", "/srv/tokens"});
  const Finished refused = SubmitYaml(WithDataPath(ServiceSpec(), "/etc/passwd"), "outside.yaml");
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_TRUE(Contains(refused.err, "data.path = '/etc/passwd'")) << refused.err;
  EXPECT_TRUE(Contains(refused.err, "/srv/tokens")) << refused.err;
  const Finished climbing =
      SubmitYaml(WithDataPath(ServiceSpec(), "/srv/tokens/../../etc/passwd"), "climbing.yaml");
  EXPECT_EQ(climbing.exit_code, 2) << climbing.err;
  // Issue 31, item 3: checkpoint.init_from is read like data.path, and refused alike.
  TinySpec init_from = ServiceSpec();
  init_from.checkpoint_extra = "  init_from: /srv/other-job/step-00000040\n";
  const Finished weights = SubmitYaml(init_from.Yaml(), "init-from.yaml");
  EXPECT_EQ(weights.exit_code, 2) << weights.err;
  EXPECT_TRUE(Contains(weights.err, "checkpoint.init_from = '/srv/other-job/step-00000040'"))
      << weights.err;
  // Under a root: accepted (the workers decide, links followed).
  EXPECT_FALSE(SubmitOk(WithDataPath(ServiceSpec(), "/srv/tokens/a.bin"), "inside.yaml").empty());
}

}  // namespace
}  // namespace moetrain::testutil
