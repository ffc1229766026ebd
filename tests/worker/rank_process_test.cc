// The channel between a worker and its rank processes, and what the worker reports for a rank
// process: its own end report, or how the process died. The rank process is the real
// moetrain-worker executable (or a program that is no rank at all).
#include "worker/rank_process.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <future>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "moetrain/v1/job_spec.h"
#include "tests/testing/testing.h"
#include "worker/rank_channel.h"
#include "worker/rank_channel.pb.h"
#include "worker/rank_main.h"

namespace moetrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Both ends of a socket pair, as channels.
struct ChannelPair {
  ChannelPair() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    raw = fds[1];
    a = std::make_unique<MessageChannel>(fds[0]);
    b = std::make_unique<MessageChannel>(fds[1]);
  }
  std::unique_ptr<MessageChannel> a, b;
  int raw = -1;  // b's socket, for writing bytes no channel would
};

TEST(MessageChannelTest, MessagesArriveWholeAndInOrder) {
  ChannelPair pair;
  rank::FromRank progress;
  progress.set_progress(41);
  rank::FromRank log;
  log.mutable_log()->add_lines(std::string(100000, 'x'));  // larger than one socket write
  ASSERT_OK(pair.a->Send(progress));
  ASSERT_OK(pair.a->Send(log));
  rank::FromRank received;
  ASSERT_OK(pair.b->Receive(&received));
  EXPECT_EQ(received.progress(), 41);
  ASSERT_OK(pair.b->Receive(&received));
  EXPECT_EQ(received.log().lines(0).size(), 100000u);
}

TEST(MessageChannelTest, APeerThatClosedIsOutOfRangeAndSendingToItUnavailable) {
  ChannelPair pair;
  pair.a.reset();
  rank::FromRank received;
  EXPECT_TRUE(absl::IsOutOfRange(pair.b->Receive(&received)));
  rank::ToRank order;
  order.mutable_stop()->set_kind(rank::STOP_KIND_STOP);
  EXPECT_TRUE(absl::IsUnavailable(pair.b->Send(order)));
}

TEST(MessageChannelTest, AFrameTooLongCutShortOrNotParsingIsDataLoss) {
  // Each written as raw bytes by a broken peer.
  const std::vector<std::string> frames = {std::string("\xff\xff\xff\x7f", 4),  // 2 GiB announced
                                           std::string("\x10\x00\x00\x00"
                                                       "abc",
                                                       7),              // 16 announced, 3 sent
                                           std::string("\x02\x00", 2),  // the length itself cut
                                           std::string("\x03\x00\x00\x00"
                                                       "\xff\xff\xff",
                                                       7)};  // not a protobuf message
  for (const std::string& frame : frames) {
    ChannelPair pair;
    ASSERT_EQ(write(pair.raw, frame.data(), frame.size()), static_cast<ssize_t>(frame.size()));
    shutdown(pair.raw, SHUT_WR);
    rank::FromRank received;
    const absl::Status status = pair.a->Receive(&received);
    EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  }
}

TEST(MessageChannelTest, ShutdownWakesABlockedReceive) {
  ChannelPair pair;
  std::future<absl::Status> receiving = std::async(std::launch::async, [&] {
    rank::FromRank received;
    return pair.a->Receive(&received);
  });
  pair.a->Shutdown();
  EXPECT_TRUE(absl::IsOutOfRange(receiving.get()));
}

// The wait status of a child that ends as `body` makes it.
int WaitStatusOf(void (*body)()) {
  const pid_t pid = fork();
  if (pid == 0) {
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST(DescribeRankExitTest, NamesTheSignalAndWhatItUsuallyMeans) {
  const int segv = WaitStatusOf([] {
    signal(SIGSEGV, SIG_DFL);
    raise(SIGSEGV);
  });
  EXPECT_EQ(DescribeRankExit(segv, 30),
            "was killed by signal 11 (SIGSEGV, Segmentation fault) after step 30");
  const int killed = WaitStatusOf([] { raise(SIGKILL); });
  EXPECT_THAT(DescribeRankExit(killed, 2), HasSubstr("signal 9 (SIGKILL"));
  EXPECT_THAT(DescribeRankExit(killed, 2), HasSubstr("OOM killer"));
  const int bus = WaitStatusOf([] {
    signal(SIGBUS, SIG_DFL);
    raise(SIGBUS);
  });
  EXPECT_THAT(DescribeRankExit(bus, 5),
              HasSubstr("(SIGBUS, Bus error) after step 5; SIGBUS comes"));
  const int exited = WaitStatusOf([] { _exit(7); });
  EXPECT_EQ(DescribeRankExit(exited, 0),
            "exited with status 7 after step 0 without reporting how its attempt ended");
}

rank::RankStart StartOf(const std::string& job_id) {
  rank::RankStart start;
  start.mutable_assignment()->set_job_id(job_id);
  start.mutable_assignment()->set_attempt(3);
  start.mutable_assignment()->set_rank(0);
  start.mutable_assignment()->set_world_size(1);
  start.set_worker_id("w-1");
  start.set_threads(1);
  start.set_reports_checkpoints(true);
  start.set_log(false);
  return start;
}

// Runs `executable` as the rank process of `start`; its reports and its end.
struct RankRun {
  std::vector<Reporter::Report> reports;
  v1::ReportAttemptEndRequest end;
  bool reported = false;  // the end is the rank's own
};

RankRun RunRankProcess(const std::string& executable, const rank::RankStart& start) {
  RankRun run;
  std::promise<v1::ReportAttemptEndRequest> ended;
  RankProcessHooks hooks;
  hooks.report = [&run](Reporter::Report report) { run.reports.push_back(std::move(report)); };
  hooks.on_exit = [&ended, &run](v1::ReportAttemptEndRequest end, bool reported) {
    run.reported = reported;
    ended.set_value(std::move(end));
  };
  RankProcess process(executable, start, std::move(hooks));
  std::future<v1::ReportAttemptEndRequest> end = ended.get_future();
  if (end.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "the rank process did not end within 60 s";
    process.Kill();
  }
  run.end = end.get();
  process.Join();
  return run;
}

TEST(RankProcessTest, ARankThatFailsReportsItsOwnEnd) {
  // The real rank program, given an assignment whose spec does not make a model.
  const RankRun run =
      RunRankProcess(std::string(MOETRAIN_BIN_DIR) + "/moetrain-worker", StartOf("job-a"));
  EXPECT_TRUE(run.reported);
  EXPECT_EQ(run.end.job_id(), "job-a");
  EXPECT_EQ(run.end.attempt(), 3);
  EXPECT_EQ(run.end.worker_id(), "w-1");
  EXPECT_EQ(run.end.outcome(), v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_EQ(run.end.failure_kind(), v1::FAILURE_KIND_PERMANENT) << run.end.message();
  EXPECT_THAT(run.end.message(), Not(HasSubstr("rank's process")));
}

TEST(RankProcessTest, AProgramThatIsNoRankIsReportedAsExitingWithoutAnEnd) {
  const RankRun run = RunRankProcess("/bin/true", StartOf("job-b"));
  EXPECT_FALSE(run.reported);
  EXPECT_EQ(run.end.outcome(), v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_EQ(run.end.failure_kind(), v1::FAILURE_KIND_TRANSIENT);
  EXPECT_EQ(run.end.job_id(), "job-b");
  EXPECT_EQ(run.end.worker_id(), "w-1");
  EXPECT_THAT(run.end.message(),
              HasSubstr("exited with status 0 after step 0 without reporting how its attempt "
                        "ended"));
  EXPECT_TRUE(run.reports.empty());
}

TEST(RankProcessTest, AProgramThatCannotStartIsReportedSo) {
  const RankRun run = RunRankProcess("/nonexistent/moetrain-worker", StartOf("job-c"));
  EXPECT_EQ(run.end.outcome(), v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_EQ(run.end.failure_kind(), v1::FAILURE_KIND_TRANSIENT);
  EXPECT_THAT(run.end.message(),
              HasSubstr("cannot start the rank process /nonexistent/moetrain-worker"));
}

// A spec that trains, but names a checkpoint to start from that is not there: every attempt would
// find the same, so the rank says no restart can help.
TEST(RankProcessTest, AMissingInitFromFailsForGood) {
  const testutil::TempDir dir("rank_process_test");
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(absl::StrCat(
      "name: init\nmodel: {vocab_size: 64, hidden_size: 32, num_layers: 1, num_heads: 2, "
      "ffn_dim: 32, moe: {num_experts: 4, top_k: 2, expert_ffn_dim: 16}}\n"
      "train: {steps: 2, batch_size: 2, seq_len: 16}\n"
      "checkpoint: {init_from: ",
      (dir.path() / "absent/step-00000001").string(), "}\n"));
  ASSERT_OK(spec);
  rank::RankStart start = StartOf("job-d");
  *start.mutable_assignment()->mutable_spec() = *spec;
  start.mutable_assignment()->set_checkpoint_dir((dir.path() / "job-d").string());
  const RankRun run = RunRankProcess(std::string(MOETRAIN_BIN_DIR) + "/moetrain-worker", start);
  EXPECT_EQ(run.end.outcome(), v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_EQ(run.end.failure_kind(), v1::FAILURE_KIND_PERMANENT) << run.end.message();
  EXPECT_THAT(run.end.message(), HasSubstr("checkpoint.init_from = "));
  // Its memory estimate went to the job's log on the way: the reports travel too.
  ASSERT_FALSE(run.reports.empty());
  EXPECT_TRUE(std::holds_alternative<v1::ReportLogRequest>(run.reports.front()));
}

TEST(RankProcessTest, ARankProcessStartedByHandRefusesToRun) {
  // Not started by a worker: no channel at the descriptor, or another parent than it says.
  const std::string worker = std::string(MOETRAIN_BIN_DIR) + "/moetrain-worker";
  const std::string flag = RankProcessFlag(1);
  const pid_t pid = fork();
  if (pid == 0) {
    execl(worker.c_str(), worker.c_str(), flag.c_str(), nullptr);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
}

}  // namespace
}  // namespace moetrain
