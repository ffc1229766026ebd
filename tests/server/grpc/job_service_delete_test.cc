// DeleteJob (issue 13, item 13) over a real gRPC server: only final jobs, everything recorded
// about the job goes, and checkpoint files go only when asked and only inside the job's own
// directory, never through a symbolic link.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/grpc/job_service_fixture.h"

namespace moetrain::server {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class JobServiceDeleteTest : public JobServiceFixture {
 protected:
  grpc::Status Delete(const std::string& job_id, bool delete_checkpoints,
                      v1::DeleteJobResponse* response) {
    v1::DeleteJobRequest request;
    request.set_job_id(job_id);
    request.set_delete_checkpoints(delete_checkpoints);
    grpc::ClientContext context;
    Authorize(&context);
    return stub_->DeleteJob(&context, request, response);
  }

  grpc::Status Get(const std::string& job_id) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    grpc::ClientContext context;
    Authorize(&context);
    v1::Job job;
    return stub_->GetJob(&context, request, &job);
  }

  // A cancelled job whose spec names `checkpoint_dir`.
  v1::Job CancelledJobIn(const std::string& checkpoint_dir, const std::string& submission_id) {
    v1::SubmitJobRequest request = Submission(submission_id);
    request.mutable_spec()->mutable_checkpoint()->set_dir(checkpoint_dir);
    v1::Job job;
    const grpc::Status submitted = Submit(request, &job);
    EXPECT_TRUE(submitted.ok()) << submitted.error_message();
    v1::Job cancelled;
    EXPECT_TRUE(Cancel(job.id(), "", &cancelled).ok());
    return job;
  }

  // A cancelled job with a checkpoint step directory holding one file.
  v1::Job CancelledJobWithFiles(const std::string& submission_id) {
    const v1::Job job = MustSubmit(submission_id);
    v1::Job cancelled;
    EXPECT_TRUE(Cancel(job.id(), "", &cancelled).ok());
    const fs::path step = checkpoint_dir_ / job.id() / "step-00000005";
    fs::create_directories(step);
    std::ofstream(step / "model.safetensors") << "weights";
    return job;
  }
};

TEST_F(JobServiceDeleteTest, OnlyFinalJobsAndKnownOnes) {
  v1::DeleteJobResponse response;
  grpc::Status status = Delete("job-nosuchjob", false, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();

  const v1::Job pending = MustSubmit("pending");
  status = Delete(pending.id(), false, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("PENDING"));
  EXPECT_TRUE(Get(pending.id()).ok());
}

TEST_F(JobServiceDeleteTest, KeepsTheCheckpointFilesByDefault) {
  const v1::Job job = CancelledJobWithFiles("keep");
  const v1::Job other = MustSubmit("other");
  v1::DeleteJobResponse response;
  const grpc::Status status = Delete(job.id(), false, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.checkpoint_dir(), (checkpoint_dir_ / job.id()).string());
  EXPECT_FALSE(response.checkpoints_deleted());
  EXPECT_TRUE(fs::exists(checkpoint_dir_ / job.id() / "step-00000005" / "model.safetensors"));

  EXPECT_EQ(Get(job.id()).error_code(), grpc::StatusCode::NOT_FOUND);
  std::vector<v1::Job> jobs;
  int pages = 0;
  ASSERT_TRUE(ListAll(&jobs, &pages).ok());
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].id(), other.id());
  // Its events went too: a watch finds no job.
  v1::WatchJobRequest watch;
  watch.set_job_id(job.id());
  watch.set_no_wait(true);
  grpc::ClientContext context;
  Authorize(&context);
  auto reader = stub_->WatchJob(&context, watch);
  v1::JobEvent event;
  while (reader->Read(&event)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  // Deleted once.
  EXPECT_EQ(Delete(job.id(), false, &response).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(JobServiceDeleteTest, DeletesTheCheckpointDirectoryWhenAskedAndNothingOutsideIt) {
  const v1::Job job = CancelledJobWithFiles("remove");
  // A link inside the job's directory to a file outside it: the link goes, the file stays.
  const fs::path outside = dir_ / "outside";
  fs::create_directories(outside);
  std::ofstream(outside / "precious") << "keep me";
  fs::create_directory_symlink(outside, checkpoint_dir_ / job.id() / "step-00000005" / "link");
  const v1::Job neighbour = CancelledJobWithFiles("neighbour");

  v1::DeleteJobResponse response;
  const grpc::Status status = Delete(job.id(), true, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(response.checkpoints_deleted());
  EXPECT_FALSE(fs::exists(checkpoint_dir_ / job.id()));
  EXPECT_TRUE(fs::exists(outside / "precious"));
  EXPECT_TRUE(fs::exists(checkpoint_dir_ / neighbour.id() / "step-00000005"));
  EXPECT_EQ(Get(job.id()).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(JobServiceDeleteTest, AJobDirectoryThatIsALinkIsNotFollowed) {
  const v1::Job job = MustSubmit("linked");
  v1::Job cancelled;
  ASSERT_TRUE(Cancel(job.id(), "", &cancelled).ok());
  const fs::path outside = dir_ / "elsewhere";
  fs::create_directories(outside / "step-00000005");
  fs::create_directories(checkpoint_dir_);
  fs::create_directory_symlink(outside, checkpoint_dir_ / job.id());

  v1::DeleteJobResponse response;
  const grpc::Status status = Delete(job.id(), true, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("symbolic link"));
  EXPECT_TRUE(fs::exists(outside / "step-00000005"));
  EXPECT_TRUE(Get(job.id()).ok()) << "nothing was deleted";
}

// Issue 31, item 3: only a link at the job's own directory was refused. One among the directories
// above it (a spec's checkpoint.dir that is, or goes through, a link out of the root) made the
// delete remove a directory outside the checkpoint root.
TEST_F(JobServiceDeleteTest, ALinkAboveTheJobDirectoryIsNotFollowed) {
  const fs::path outside = dir_ / "elsewhere";
  fs::create_directories(checkpoint_dir_);
  fs::create_directories(outside);
  fs::create_directory_symlink(outside, checkpoint_dir_ / "team");
  const v1::Job job = CancelledJobIn((checkpoint_dir_ / "team").string(), "linked-parent");
  fs::create_directories(outside / job.id() / "step-00000005");

  v1::DeleteJobResponse response;
  const grpc::Status status = Delete(job.id(), true, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("outside the checkpoint root"));
  EXPECT_TRUE(fs::exists(outside / job.id() / "step-00000005"));
  EXPECT_TRUE(Get(job.id()).ok()) << "nothing was deleted";
}

// A `..` after a directory that does not exist: the workers resolved it away and wrote to the
// directory it names; the delete removes that one.
TEST_F(JobServiceDeleteTest, TheDirectoryDeletedIsTheOneTheWorkersWrote) {
  const v1::Job job =
      CancelledJobIn((checkpoint_dir_ / "missing" / ".." / "team").string(), "dotdot");
  const fs::path written = checkpoint_dir_ / "team" / job.id();
  fs::create_directories(written / "step-00000005");

  v1::DeleteJobResponse response;
  const grpc::Status status = Delete(job.id(), true, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(response.checkpoints_deleted());
  EXPECT_FALSE(fs::exists(written));
  EXPECT_TRUE(fs::exists(checkpoint_dir_ / "team"));
}

// Issue 31, item 3: a submit retried after a delete made a second job; the id stays taken.
TEST_F(JobServiceDeleteTest, ASubmitRetriedAfterTheDeleteIsAlreadyExists) {
  const v1::Job job = MustSubmit("retried");
  v1::Job cancelled;
  ASSERT_TRUE(Cancel(job.id(), "", &cancelled).ok());
  v1::DeleteJobResponse response;
  ASSERT_TRUE(Delete(job.id(), false, &response).ok());

  v1::Job again;
  const grpc::Status status = Submit(Submission("retried"), &again);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr(job.id()));
  EXPECT_THAT(status.error_message(), HasSubstr("deleted at"));
  std::vector<v1::Job> jobs;
  int pages = 0;
  ASSERT_TRUE(ListAll(&jobs, &pages).ok());
  EXPECT_TRUE(jobs.empty());
}

TEST_F(JobServiceDeleteTest, NoCheckpointDirectoryIsNotAnError) {
  const v1::Job job = MustSubmit("bare");
  v1::Job cancelled;
  ASSERT_TRUE(Cancel(job.id(), "", &cancelled).ok());
  v1::DeleteJobResponse response;
  const grpc::Status status = Delete(job.id(), true, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(response.checkpoints_deleted());
}

}  // namespace
}  // namespace moetrain::server
