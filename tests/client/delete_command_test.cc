// `moetrain delete` (issue 13, item 13): the real binary against a real coordinator in this
// process and a test worker. Only final jobs whose ranks have stopped; the checkpoint files stay
// unless --delete-checkpoints; exit codes as the README's table. And a cancel reason over the
// size limit is refused.
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/client/client_test_util.h"

namespace moetrain::testutil {
namespace {

namespace fs = std::filesystem;
using DeleteCommandTest = ClientTest;

TEST_F(DeleteCommandTest, DeletesAFinalJobAndKeepsItsCheckpointsByDefault) {
  std::unique_ptr<TestWorker> worker = RegisterWorker();
  ASSERT_NE(worker, nullptr);
  const std::string id = Submit(WriteSpec(TinySpecYaml("tiny", 20)));
  absl::StatusOr<v1::Assignment> assignment = worker->AwaitAssignment(absl::Seconds(30));
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  ASSERT_TRUE(worker->ReportStep(1).ok());
  ASSERT_TRUE(worker->ReportCheckpoint(1).ok());
  const fs::path job_dir = assignment->checkpoint_dir();
  ASSERT_TRUE(fs::is_directory(job_dir / "step-00000001"));

  const Finished running = Moetrain(Args({"delete", id}));
  EXPECT_EQ(running.exit_code, 2);
  EXPECT_TRUE(Contains(running.err, "FAILED_PRECONDITION")) << running.err;
  EXPECT_TRUE(Contains(running.err, "RUNNING")) << running.err;

  ASSERT_EQ(Moetrain(Args({"cancel", id})).exit_code, 0);
  // The rank has not reported its end yet: retry later (exit 3), nothing deleted.
  const Finished stopping = Moetrain(Args({"delete", id}));
  EXPECT_EQ(stopping.exit_code, 3) << stopping.err;
  EXPECT_TRUE(Contains(stopping.err, "still stopping")) << stopping.err;
  ASSERT_TRUE(worker->ReportAttemptEnd(v1::ATTEMPT_OUTCOME_CANCELLED, 1).ok());

  const Finished deleted = Moetrain(Args({"delete", id}));
  ASSERT_EQ(deleted.exit_code, 0) << deleted.err;
  EXPECT_TRUE(Contains(deleted.out, absl::StrCat("job ", id, " deleted"))) << deleted.out;
  EXPECT_TRUE(Contains(deleted.out, job_dir.string())) << deleted.out;
  EXPECT_TRUE(fs::is_directory(job_dir / "step-00000001"));

  const Finished describe = Moetrain(Args({"describe", id}));
  EXPECT_EQ(describe.exit_code, 2);
  EXPECT_TRUE(Contains(describe.err, "NOT_FOUND")) << describe.err;
  const Finished jobs = Moetrain(Args({"jobs", "--json"}));
  ASSERT_EQ(jobs.exit_code, 0) << jobs.err;
  EXPECT_TRUE(nlohmann::json::parse(jobs.out).at("jobs").empty()) << jobs.out;
  const Finished again = Moetrain(Args({"delete", id}));
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_TRUE(Contains(again.err, "NOT_FOUND")) << again.err;
}

TEST_F(DeleteCommandTest, DeleteCheckpointsRemovesTheJobsDirectory) {
  const std::string id = Submit(WriteSpec(TinySpecYaml("tiny", 20)));
  ASSERT_EQ(Moetrain(Args({"cancel", id})).exit_code, 0);
  const fs::path job_dir = dir_ / "checkpoints" / id;
  fs::create_directories(job_dir / "step-00000005");
  WriteTextFile(job_dir / "step-00000005" / "shard", "weights");

  const Finished deleted = Moetrain(Args({"delete", id, "--delete-checkpoints", "--json"}));
  ASSERT_EQ(deleted.exit_code, 0) << deleted.err;
  const nlohmann::json response = nlohmann::json::parse(deleted.out);
  EXPECT_EQ(response.value("checkpoint_dir", ""), job_dir.string()) << deleted.out;
  EXPECT_EQ(response.value("checkpoints_deleted", false), true) << deleted.out;
  EXPECT_FALSE(fs::exists(job_dir));
  EXPECT_TRUE(fs::is_directory(dir_ / "checkpoints"));
}

// The reproduction over the real CLI: an overlong cancel reason is refused (exit 2,
// naming the field and its length) instead of being stored in every later listing.
TEST_F(DeleteCommandTest, AnOverlongCancelReasonIsRefusedAndJobsStillLists) {
  const std::string id = Submit(WriteSpec(TinySpecYaml("tiny", 20)));
  const Finished cancel = Moetrain(Args({"cancel", id, "--reason", std::string(100000, 'r')}));
  EXPECT_EQ(cancel.exit_code, 2);
  EXPECT_TRUE(Contains(cancel.err, "INVALID_ARGUMENT")) << cancel.err.substr(0, 500);
  EXPECT_TRUE(Contains(cancel.err, "reason has 100000 bytes")) << cancel.err.substr(0, 500);
  const Finished jobs = Moetrain(Args({"jobs"}));
  EXPECT_EQ(jobs.exit_code, 0) << jobs.err;
  EXPECT_TRUE(Contains(jobs.out, id)) << jobs.out;
}

TEST_F(DeleteCommandTest, UsageAndUnknownJobsExitTwo) {
  const Finished missing = Moetrain(Args({"delete"}));
  EXPECT_EQ(missing.exit_code, 2);
  const Finished unknown = Moetrain(Args({"delete", "job-nosuchjob00"}));
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_TRUE(Contains(unknown.err, "NOT_FOUND")) << unknown.err;
}

}  // namespace
}  // namespace moetrain::testutil
