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
    const absl::Status status = CheckJobPaths(Spec(dir), dir + "/job-1", policy);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << dir << ": " << status;
    EXPECT_TRUE(Contains(status.message(), absl::StrCat("checkpoint.dir = '", dir, "'"))) << status;
    EXPECT_TRUE(Contains(status.message(), Path("checkpoints"))) << status;
  }
}

TEST_F(JobPathsTest, ASymbolicLinkOutOfTheRootIsFollowed) {
  fs::create_directory_symlink(base_ / "elsewhere", base_ / "checkpoints" / "escape");
  const JobPathPolicy policy{.checkpoint_root = Path("checkpoints")};
  const std::string dir = Path("checkpoints/escape");
  const absl::Status status = CheckJobPaths(Spec(dir), dir + "/job-1", policy);
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
  EXPECT_EQ(CheckJobPaths(Spec("../.."), "../../job-1", policy).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckJobPaths(Spec("elsewhere"), "elsewhere/job-1", policy).code(),
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
    const absl::Status status = CheckJobPaths(Spec("", path), "", policy);
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
  const absl::Status status = CheckJobPaths(spec, "", policy);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(Contains(status.message(), "checkpoint.init_from = '")) << status;
  EXPECT_TRUE(CheckJobPaths(spec, "", JobPathPolicy{}).ok());
}

TEST_F(JobPathsTest, ADataPathLinkedOutOfTheRootIsRefused) {
  fs::create_symlink(base_ / "elsewhere" / "secret.bin", base_ / "data" / "link.bin");
  fs::create_directory_symlink(base_ / "elsewhere", base_ / "data" / "dir-link");
  const JobPathPolicy policy{.data_roots = {Path("data")}};
  for (const std::string& path : {Path("data/link.bin"), Path("data/dir-link/secret.bin")}) {
    const absl::Status status = CheckJobPaths(Spec("", path), "", policy);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << path << ": " << status;
    EXPECT_TRUE(Contains(status.message(), Path("elsewhere/secret.bin"))) << status;
  }
}

}  // namespace
}  // namespace moetrain
