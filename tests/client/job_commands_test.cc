// The coordinator commands of the real `moetrain` binary against a real coordinator in this
// process: submit (idempotency, bad specs, authentication), jobs, describe, checkpoints, workers,
// cancel, in text and --json, and the exit codes of each outcome.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/client/client_test_util.h"

namespace moetrain::testutil {
namespace {

using nlohmann::json;

// A port nothing listens on: bound once by the kernel's choice, then released.
int UnusedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

// The one JSON document a --json listing prints.
json Document(const Finished& finished) {
  const std::vector<json> lines = JsonLines(finished.out);
  EXPECT_EQ(lines.size(), 1u) << finished.out;
  return lines.empty() ? json() : lines[0];
}

// The IDs column of a text table (the first word of every line after the header).
std::vector<std::string> TableIds(const std::string& table) {
  std::vector<std::string> ids;
  std::istringstream in(table);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) ids.push_back(line.substr(0, line.find(' ')));
  return ids;
}

using JobCommandsTest = ClientTest;

TEST_F(JobCommandsTest, SubmitPrintsTheJobIdAndTheJobExists) {
  const std::string spec = WriteSpec(TinySpecYaml("tiny", 20));
  const Finished submit = Moetrain(Args({"submit", spec}));
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  // "job <id> PENDING"
  std::istringstream words(submit.out);
  std::string word, id, state;
  words >> word >> id >> state;
  EXPECT_EQ(word, "job") << submit.out;
  EXPECT_EQ(state, "PENDING") << submit.out;
  ASSERT_FALSE(id.empty());

  const Finished describe = Moetrain(Args({"describe", id, "--json"}));
  ASSERT_EQ(describe.exit_code, 0) << describe.err;
  const json job = Document(describe);
  EXPECT_EQ(job.value("id", ""), id);
  EXPECT_EQ(job.value("name", ""), "tiny");
  EXPECT_EQ(job.value("state", ""), "JOB_STATE_PENDING");
  // A fresh random UUID as the submission id.
  EXPECT_EQ(job.value("submission_id", "").size(), 36u) << job.dump();
  // The stored spec, with the coordinator's defaults: every field present.
  EXPECT_EQ(job.at("spec").at("model").at("moe").at("top_k"), "2");
  EXPECT_EQ(job.at("spec").at("train").at("steps"), "20");
}

TEST_F(JobCommandsTest, SubmitIsIdempotentOnTheSubmissionId) {
  const std::string spec = WriteSpec(TinySpecYaml("tiny", 20));
  const std::string first = Submit(spec, {"--id", "sub-42", "--priority", "3"});
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(Submit(spec, {"--id", "sub-42", "--priority", "3"}), first);

  const std::string other = WriteSpec(TinySpecYaml("tiny", 30), "other.yaml");
  const Finished conflict = Moetrain(Args({"submit", other, "--id", "sub-42"}));
  EXPECT_EQ(conflict.exit_code, 2);
  EXPECT_TRUE(Contains(conflict.err, "ALREADY_EXISTS")) << conflict.err;
  EXPECT_TRUE(Contains(conflict.err, "sub-42")) << conflict.err;
  EXPECT_TRUE(conflict.out.empty()) << conflict.out;

  const Finished jobs = Moetrain(Args({"jobs", "--json"}));
  ASSERT_EQ(jobs.exit_code, 0) << jobs.err;
  const json listed = Document(jobs);
  ASSERT_EQ(listed.at("jobs").size(), 1u) << listed.dump();
  EXPECT_EQ(listed.at("jobs")[0].at("priority"), 3);
}

TEST_F(JobCommandsTest, BadSpecFailsLocallyNamingTheField) {
  struct Case {
    std::string top_k_line;
    std::string field;
  };
  for (const Case& c : {Case{"top_k: 9", "model.moe.top_k"}, Case{"top_k: two", "model.moe.top_k"},
                        Case{"topk: 2", "model.moe.topk"}}) {
    SCOPED_TRACE(c.top_k_line);
    const std::string spec = WriteSpec(TinySpecYaml("tiny", 20, c.top_k_line));
    const Finished submit = Moetrain(Args({"submit", spec}));
    EXPECT_EQ(submit.exit_code, 2);
    EXPECT_TRUE(Contains(submit.err, c.field)) << submit.err;
    EXPECT_TRUE(Contains(submit.err, spec)) << submit.err;
  }
  // Nothing reached the coordinator.
  const Finished jobs = Moetrain(Args({"jobs", "--json"}));
  ASSERT_EQ(jobs.exit_code, 0) << jobs.err;
  EXPECT_TRUE(Document(jobs).at("jobs").empty());

  const Finished missing = Moetrain(Args({"submit", (dir_ / "missing.yaml").string()}));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_TRUE(Contains(missing.err, (dir_ / "missing.yaml").string())) << missing.err;
}

TEST_F(JobCommandsTest, MissingOrWrongTokenIsUnauthenticated) {
  const Finished without = Moetrain({"jobs", "--coordinator", address()});
  EXPECT_EQ(without.exit_code, 2);
  EXPECT_TRUE(Contains(without.err, "UNAUTHENTICATED")) << without.err;

  const std::string wrong = (dir_ / "wrong-token").string();
  WriteTextFile(wrong, "not-the-token\n");
  const Finished wrong_token = Moetrain({"submit", WriteSpec(TinySpecYaml("tiny", 20)),
                                         "--coordinator", address(), "--token-file", wrong});
  EXPECT_EQ(wrong_token.exit_code, 2);
  EXPECT_TRUE(Contains(wrong_token.err, "UNAUTHENTICATED")) << wrong_token.err;

  const std::string absent = (dir_ / "no-such-token").string();
  const Finished no_file =
      Moetrain({"workers", "--coordinator", address(), "--token-file", absent});
  EXPECT_EQ(no_file.exit_code, 2);
  EXPECT_TRUE(Contains(no_file.err, absent)) << no_file.err;
}

TEST_F(JobCommandsTest, EnvironmentNamesCoordinatorAndToken) {
  const Finished jobs = Moetrain(
      {"jobs"}, {{"MOETRAIN_COORDINATOR", address()}, {"MOETRAIN_TOKEN_FILE", token_file_}});
  EXPECT_EQ(jobs.exit_code, 0) << jobs.err;
  EXPECT_EQ(jobs.out, "(no jobs)\n");
}

TEST_F(JobCommandsTest, UnreachableCoordinatorExitsThree) {
  const std::string address = absl::StrCat("127.0.0.1:", UnusedPort());
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"jobs"}, std::vector<std::string>{"describe", "job-x"},
        std::vector<std::string>{"submit", WriteSpec(TinySpecYaml("tiny", 20))},
        std::vector<std::string>{"logs", "-f", "job-x"}}) {
    SCOPED_TRACE(command[0]);
    std::vector<std::string> args = command;
    args.insert(args.end(), {"--coordinator", address, "--token-file", token_file_});
    const Finished finished = Moetrain(args);
    EXPECT_EQ(finished.exit_code, 3);
    EXPECT_TRUE(Contains(finished.err, address)) << finished.err;
    EXPECT_TRUE(Contains(finished.err, "UNAVAILABLE")) << finished.err;
  }
}

TEST_F(JobCommandsTest, UnknownJobIsNotFound) {
  for (const char* command : {"describe", "logs", "cancel", "checkpoints"}) {
    SCOPED_TRACE(command);
    const Finished finished = Moetrain(Args({command, "job-nope"}));
    EXPECT_EQ(finished.exit_code, 2);
    EXPECT_TRUE(Contains(finished.err, "NOT_FOUND")) << finished.err;
    EXPECT_TRUE(Contains(finished.err, "job-nope")) << finished.err;
  }
}

TEST_F(JobCommandsTest, JobsListsEveryJobAndFiltersByState) {
  const std::string spec = WriteSpec(TinySpecYaml("tiny", 20));
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(Submit(spec));
  const Finished cancel = Moetrain(Args({"cancel", ids[1], "--reason", "not needed"}));
  ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
  EXPECT_EQ(cancel.out, absl::StrCat("job ", ids[1], " CANCELLED\n"));

  const Finished table = Moetrain(Args({"jobs"}));
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_TRUE(table.out.starts_with("ID ")) << table.out;
  for (const char* column : {"NAME", "STATE", "STEP", "LOSS", "RESTARTS", "AGE"}) {
    EXPECT_TRUE(Contains(table.out.substr(0, table.out.find('\n')), column)) << column;
  }
  EXPECT_EQ(TableIds(table.out), ids);
  EXPECT_TRUE(Contains(table.out, "0/20")) << table.out;

  const Finished pending = Moetrain(Args({"jobs", "--state", "pending"}));
  ASSERT_EQ(pending.exit_code, 0) << pending.err;
  EXPECT_EQ(TableIds(pending.out), (std::vector<std::string>{ids[0], ids[2]}));

  const Finished several = Moetrain(Args({"jobs", "--state", "CANCELLED,Pending", "--json"}));
  ASSERT_EQ(several.exit_code, 0) << several.err;
  const json both = Document(several);
  std::vector<std::string> listed;
  for (const json& job : both.at("jobs")) listed.push_back(job.at("id"));
  EXPECT_EQ(listed, ids);

  const Finished cancelled = Moetrain(Args({"jobs", "--state", "CANCELLED", "--json"}));
  ASSERT_EQ(cancelled.exit_code, 0) << cancelled.err;
  const json only = Document(cancelled);
  ASSERT_EQ(only.at("jobs").size(), 1u);
  EXPECT_EQ(only.at("jobs")[0].at("id"), ids[1]);
  EXPECT_EQ(only.at("jobs")[0].at("state_reason"), "not needed");

  const Finished bad = Moetrain(Args({"jobs", "--state", "sleeping"}));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(Contains(bad.err, "sleeping")) << bad.err;

  // A second cancel: the job's state does not allow it.
  const Finished again = Moetrain(Args({"cancel", ids[1]}));
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_TRUE(Contains(again.err, "FAILED_PRECONDITION")) << again.err;
}

// One job driven through two steps and a checkpoint by the test worker, for the commands that
// show progress: describe, checkpoints, workers.
TEST_F(JobCommandsTest, DescribeCheckpointsAndWorkersShowProgress) {
  std::unique_ptr<TestWorker> worker = RegisterWorker();
  ASSERT_NE(worker, nullptr);
  const std::string id = Submit(WriteSpec(TinySpecYaml("tiny", 20)));
  absl::StatusOr<v1::Assignment> assignment = worker->AwaitAssignment(absl::Seconds(30));
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  ASSERT_EQ(assignment->job_id(), id);
  ASSERT_TRUE(worker->ReportStep(1).ok());
  ASSERT_TRUE(worker->ReportStep(2).ok());
  ASSERT_TRUE(worker->ReportCheckpoint(2).ok());
  const std::string checkpoint_path = absl::StrCat(assignment->checkpoint_dir(), "/step-00000002");

  const Finished describe = Moetrain(Args({"describe", id}));
  ASSERT_EQ(describe.exit_code, 0) << describe.err;
  for (const std::string& expected :
       {absl::StrCat("Job:"), id, std::string("RUNNING"), std::string("Latest checkpoint:  step 2"),
        std::string("step 2/20"), std::string("loss 3.9688"), std::string("Spec:"),
        std::string("    top_k: 2"), std::string("Created:")}) {
    EXPECT_TRUE(Contains(describe.out, expected)) << expected << " in\n" << describe.out;
  }
  const json job = Document(Moetrain(Args({"describe", id, "--json"})));
  EXPECT_EQ(job.value("state", ""), "JOB_STATE_RUNNING");
  EXPECT_EQ(job.value("attempt", ""), "1");
  EXPECT_EQ(job.value("latest_checkpoint_step", ""), "2");
  EXPECT_EQ(job.at("last_metrics").at("step"), "2");

  const Finished checkpoints = Moetrain(Args({"checkpoints", id}));
  ASSERT_EQ(checkpoints.exit_code, 0) << checkpoints.err;
  EXPECT_TRUE(checkpoints.out.starts_with("STEP")) << checkpoints.out;
  EXPECT_TRUE(Contains(checkpoints.out, checkpoint_path)) << checkpoints.out;
  const json listed = Document(Moetrain(Args({"checkpoints", id, "--json"})));
  ASSERT_EQ(listed.at("checkpoints").size(), 1u) << listed.dump();
  EXPECT_EQ(listed.at("checkpoints")[0].at("path"), checkpoint_path);
  EXPECT_EQ(listed.at("checkpoints")[0].at("step"), "2");
  EXPECT_EQ(listed.at("checkpoints")[0].at("tokens_seen"), "256");

  const Finished workers = Moetrain(Args({"workers"}));
  ASSERT_EQ(workers.exit_code, 0) << workers.err;
  EXPECT_EQ(TableIds(workers.out), std::vector<std::string>{worker->id()});
  EXPECT_TRUE(Contains(workers.out, "BUSY")) << workers.out;
  EXPECT_TRUE(Contains(workers.out, id)) << workers.out;
  const json fleet = Document(Moetrain(Args({"workers", "--json"})));
  ASSERT_EQ(fleet.at("workers").size(), 1u) << fleet.dump();
  EXPECT_EQ(fleet.at("workers")[0].at("id"), worker->id());
  EXPECT_EQ(fleet.at("workers")[0].at("state"), "WORKER_STATE_BUSY");
  EXPECT_EQ(fleet.at("workers")[0].at("current_job_id"), id);

  // Cancelling a running job: the exit code and the Job as JSON.
  const Finished cancel = Moetrain(Args({"cancel", id, "--json"}));
  ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
  EXPECT_EQ(Document(cancel).value("state", ""), "JOB_STATE_CANCELLED");
}

// More workers than one ListWorkers page (100 by default): `moetrain workers` follows every
// page, in text and in JSON.
TEST_F(JobCommandsTest, WorkersListsEveryPage) {
  ConnectOptions options;
  options.address = address();
  options.token_file = token_file_;
  absl::StatusOr<Connection> connection = Connect(options);
  ASSERT_TRUE(connection.ok()) << connection.status();
  const std::unique_ptr<v1::WorkerService::Stub> stub =
      v1::WorkerService::NewStub(connection->channel);
  std::set<std::string> registered;
  for (int i = 0; i < 150; ++i) {
    v1::RegisterWorkerRequest request;
    request.set_name(absl::StrCat("fleet-", i));
    request.mutable_resources()->set_device(v1::ResourceConfig::CPU);
    request.mutable_resources()->set_device_count(1);
    request.mutable_resources()->set_threads(1);
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    connection->Prepare(&context, absl::Seconds(10));
    const grpc::Status status = stub->RegisterWorker(&context, request, &response);
    ASSERT_TRUE(status.ok()) << i << ": " << status.error_message();
    registered.insert(response.worker_id());
    // One heartbeat each: a client may have only 16 registrations that never heartbeated.
    Connection worker = *connection;
    worker.worker_id = response.worker_id();
    worker.worker_secret = response.worker_secret();
    v1::HeartbeatRequest heartbeat;
    heartbeat.set_worker_id(response.worker_id());
    v1::HeartbeatResponse answer;
    grpc::ClientContext heartbeat_context;
    worker.Prepare(&heartbeat_context, absl::Seconds(10));
    ASSERT_TRUE(stub->Heartbeat(&heartbeat_context, heartbeat, &answer).ok());
  }

  const Finished text = Moetrain(Args({"workers"}));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  const std::vector<std::string> ids = TableIds(text.out);
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()), registered);
  EXPECT_EQ(ids.size(), registered.size());
  const json listed = Document(Moetrain(Args({"workers", "--json"})));
  ASSERT_EQ(listed.at("workers").size(), registered.size());
  std::set<std::string> json_ids;
  for (const json& worker : listed.at("workers")) json_ids.insert(worker.at("id"));
  EXPECT_EQ(json_ids, registered);
  EXPECT_EQ(listed.value("next_page_token", ""), "") << "one listing, not a page";
}

TEST_F(JobCommandsTest, BadUsageExitsTwo) {
  EXPECT_EQ(Moetrain({"jobs", "--no-such-flag"}).exit_code, 2);
  EXPECT_EQ(Moetrain({"describe"}).exit_code, 2);
  EXPECT_EQ(Moetrain({}).exit_code, 2);
  const Finished timeout = Moetrain(Args({"logs", "job-x", "-f", "--reconnect-timeout", "soon"}));
  EXPECT_EQ(timeout.exit_code, 2);
  EXPECT_TRUE(Contains(timeout.err, "--reconnect-timeout = 'soon'")) << timeout.err;
  EXPECT_EQ(Moetrain({"--help"}).exit_code, 0);
}

}  // namespace
}  // namespace moetrain::testutil
