// A worker keeps a job's checkpoints under the coordinator's checkpoint root and its data under
// the operator's data roots, symbolic links followed: issue 13, item 10.
#include "worker/job_paths.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

namespace fs = std::filesystem;

bool Contains(absl::string_view haystack, absl::string_view needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

class JobPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::path(::testing::TempDir()) /
            absl::StrCat("job_paths_test_", getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(base_);
    fs::create_directories(base_ / "checkpoints");
    fs::create_directories(base_ / "elsewhere");
    fs::create_directories(base_ / "data");
    std::ofstream(base_ / "data" / "tokens.bin") << "tokens";
    std::ofstream(base_ / "elsewhere" / "secret.bin") << "secret";
  }
  void TearDown() override { fs::remove_all(base_); }

  std::string Path(const std::string& relative) const { return (base_ / relative).string(); }

  v1::JobSpec Spec(const std::string& checkpoint_dir, const std::string& data_path = "") const {
    v1::JobSpec spec;
    spec.mutable_checkpoint()->set_dir(checkpoint_dir);
    spec.mutable_data()->set_path(data_path);
    return spec;
  }

  fs::path base_;
};

TEST_F(JobPathsTest, AJobDirectoryUnderTheRootPasses) {
  const JobPathPolicy policy{.checkpoint_root = Path("checkpoints")};
  EXPECT_TRUE(CheckJobPaths(Spec(""), Path("checkpoints/job-1"), policy).ok());
  EXPECT_TRUE(
      CheckJobPaths(Spec(Path("checkpoints/team")), Path("checkpoints/team/job-1"), policy).ok());
  // A trailing slash or a "." changes nothing.
  const JobPathPolicy slash{.checkpoint_root = Path("checkpoints/")};
  EXPECT_TRUE(CheckJobPaths(Spec(""), Path("checkpoints/./job-1"), slash).ok());
  // No root (an older coordinator): not checked.
  EXPECT_TRUE(CheckJobPaths(Spec("/anywhere"), "/anywhere/job-1", JobPathPolicy{}).ok());
}

TEST_F(JobPathsTest, AJobDirectoryOutsideTheRootIsRefusedNamingTheField) {
  const JobPathPolicy policy{.checkpoint_root = Path("checkpoints")};
  for (const std::string& dir : {Path("elsewhere"), Path("checkpoints/../elsewhere"),
                                 Path("checkpoints/team/../../elsewhere"), std::string("/tmp")}) {
    const absl::Status status = CheckJobPaths(Spec(dir), dir + "/job-1", policy).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << dir << ": " << status;
    EXPECT_TRUE(Contains(status.message(), absl::StrCat("checkpoint.dir = '", dir, "'"))) << status;
    EXPECT_TRUE(Contains(status.message(), Path("checkpoints"))) << status;
  }
}

TEST_F(JobPathsTest, ASymbolicLinkOutOfTheRootIsFollowed) {
  fs::create_directory_symlink(base_ / "elsewhere", base_ / "checkpoints" / "escape");
  const JobPathPolicy policy{.checkpoint_root = Path("checkpoints")};
  const std::string dir = Path("checkpoints/escape");
  const absl::Status status = CheckJobPaths(Spec(dir), dir + "/job-1", policy).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  // A root that is itself a link is where the link points, and so are the jobs under it.
  fs::create_directory_symlink(base_ / "checkpoints", base_ / "root-link");
  const JobPathPolicy linked{.checkpoint_root = Path("root-link")};
  EXPECT_TRUE(CheckJobPaths(Spec(""), Path("root-link/job-1"), linked).ok());
  EXPECT_TRUE(CheckJobPaths(Spec(""), Path("checkpoints/job-1"), linked).ok());
  // The job's own directory is no spec's choice: a link there (made by the operator) is kept.
  fs::create_directory_symlink(base_ / "elsewhere", base_ / "checkpoints" / "job-2");
  EXPECT_TRUE(CheckJobPaths(Spec(""), Path("checkpoints/job-2"), policy).ok());
}

TEST_F(JobPathsTest, RelativePathsResolveAgainstTheWorkingDirectory) {
  const fs::path before = fs::current_path();
  fs::current_path(base_);
  const JobPathPolicy policy{.checkpoint_root = "checkpoints"};
  EXPECT_TRUE(CheckJobPaths(Spec(""), "checkpoints/job-1", policy).ok());
  EXPECT_EQ(CheckJobPaths(Spec("../.."), "../../job-1", policy).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckJobPaths(Spec("elsewhere"), "elsewhere/job-1", policy).status().code(),
            absl::StatusCode::kInvalidArgument);
  fs::current_path(before);
}

TEST_F(JobPathsTest, DataRootsConfineDataPathsAndNoneAllowsAnyFile) {
  const std::string inside = Path("data/tokens.bin"), outside = Path("elsewhere/secret.bin");
  EXPECT_TRUE(CheckJobPaths(Spec("", outside), "", JobPathPolicy{}).ok());
  const JobPathPolicy policy{.data_roots = {Path("nothing-here"), Path("data")}};
  EXPECT_TRUE(CheckJobPaths(Spec("", inside), "", policy).ok());
  EXPECT_TRUE(CheckJobPaths(Spec(""), "", policy).ok());  // SYNTHETIC data: no file
  for (const std::string& path : {outside, Path("data/../elsewhere/secret.bin")}) {
    const absl::Status status = CheckJobPaths(Spec("", path), "", policy).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << path << ": " << status;
    EXPECT_TRUE(Contains(status.message(), absl::StrCat("data.path = '", path, "'"))) << status;
    EXPECT_TRUE(Contains(status.message(), Path("data"))) << status;
  }
}

// checkpoint.init_from is read like data.path: under a data root when the worker names any.
TEST_F(JobPathsTest, DataRootsConfineInitFromToo) {
  const JobPathPolicy policy{.data_roots = {Path("data")}};
  v1::JobSpec spec = Spec("");
  spec.mutable_checkpoint()->set_init_from(Path("data/step-00000000"));
  EXPECT_TRUE(CheckJobPaths(spec, "", policy).ok());
  spec.mutable_checkpoint()->set_init_from(Path("elsewhere/step-00000000"));
  const absl::Status status = CheckJobPaths(spec, "", policy).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(Contains(status.message(), "checkpoint.init_from = '")) << status;
  EXPECT_TRUE(CheckJobPaths(spec, "", JobPathPolicy{}).ok());
}

TEST_F(JobPathsTest, ADataPathLinkedOutOfTheRootIsRefused) {
  fs::create_symlink(base_ / "elsewhere" / "secret.bin", base_ / "data" / "link.bin");
  fs::create_directory_symlink(base_ / "elsewhere", base_ / "data" / "dir-link");
  const JobPathPolicy policy{.data_roots = {Path("data")}};
  for (const std::string& path : {Path("data/link.bin"), Path("data/dir-link/secret.bin")}) {
    const absl::Status status = CheckJobPaths(Spec("", path), "", policy).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << path << ": " << status;
    EXPECT_TRUE(Contains(status.message(), Path("elsewhere/secret.bin"))) << status;
  }
}

// Issue 31, item 3: --data-root confined init_from's directory but not its files, so a link in
// it to another job's weights was read. Every entry of the directory must resolve under a root.
TEST_F(JobPathsTest, EveryFileOfInitFromMustResolveUnderADataRoot) {
  const fs::path step = base_ / "data" / "step-00000010";
  fs::create_directories(step);
  std::ofstream(step / "manifest.json") << "{}";
  std::ofstream(step / "config.json") << "{}";
  const JobPathPolicy policy{.data_roots = {Path("data")}};
  v1::JobSpec spec = Spec("");
  spec.mutable_checkpoint()->set_init_from(step.string());
  EXPECT_TRUE(CheckJobPaths(spec, "", policy).ok());
  // A link that stays inside a data root is no escape.
  fs::create_symlink(base_ / "data" / "tokens.bin", step / "optim-rank00000.safetensors");
  EXPECT_TRUE(CheckJobPaths(spec, "", policy).ok());

  fs::create_directories(base_ / "elsewhere" / "job-other");
  std::ofstream(base_ / "elsewhere" / "job-other" / "model-rank00000.safetensors") << "weights";
  fs::create_symlink(base_ / "elsewhere" / "job-other" / "model-rank00000.safetensors",
                     step / "model-rank00000.safetensors");
  const absl::Status status = CheckJobPaths(spec, "", policy).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(Contains(status.message(), "'model-rank00000.safetensors'")) << status;
  EXPECT_TRUE(Contains(status.message(), Path("elsewhere/job-other"))) << status;
  // Without data roots the worker reads any file it can: not checked.
  EXPECT_TRUE(CheckJobPaths(spec, "", JobPathPolicy{}).ok());
}

// Issue 31, item 3: the check used the normalized path and the trainer the raw one, so a `..`
// after a directory that does not exist passed the check and failed after training. The paths
// come back resolved, for the trainer to use.
TEST_F(JobPathsTest, ThePathsComeBackResolvedForTheTrainer) {
  fs::create_directory_symlink(base_ / "data", base_ / "checkpoints" / "data-link");
  fs::create_symlink(base_ / "data" / "tokens.bin", base_ / "data" / "link.bin");
  const JobPathPolicy policy{.checkpoint_root = Path("checkpoints"), .data_roots = {Path("data")}};
  v1::JobSpec spec = Spec(Path("checkpoints/missing/../team"), Path("data/link.bin"));
  spec.mutable_checkpoint()->set_init_from(Path("checkpoints/data-link/step-00000001"));
  const absl::StatusOr<ResolvedJobPaths> paths =
      CheckJobPaths(spec, Path("checkpoints/missing/../team/job-1"), policy);
  ASSERT_TRUE(paths.ok()) << paths.status();
  const std::string base = ResolvePath(base_.string()).value();
  EXPECT_EQ(paths->checkpoint_dir, base + "/checkpoints/team");
  EXPECT_EQ(paths->data_path, base + "/data/tokens.bin");
  EXPECT_EQ(paths->init_from, base + "/data/step-00000001");
  // The job's directory itself is not resolved (a link there is the operator's): its parent is.
  fs::create_directory_symlink(base_ / "elsewhere", base_ / "checkpoints" / "job-2");
  const absl::StatusOr<ResolvedJobPaths> linked =
      CheckJobPaths(Spec(""), Path("checkpoints/job-2"), policy);
  ASSERT_TRUE(linked.ok()) << linked.status();
  EXPECT_EQ(linked->checkpoint_dir, base + "/checkpoints");
}

}  // namespace
}  // namespace moetrain
