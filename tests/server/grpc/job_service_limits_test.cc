// Issue 13, item 13 and the smaller server-side items, over a real gRPC server: stored strings
// are bounded (cancel reasons refused, log lines truncated), ListJobs pages by bytes so that old
// oversized rows still list, malformed requests are INVALID_ARGUMENT, a replayed submission id
// with another priority is ALREADY_EXISTS, WatchJob from INT64_MAX does not overflow, and a
// non-ASCII submission id is called what it is.
#include <sqlite3.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/limits.h"
#include "tests/server/grpc/job_service_fixture.h"

namespace moetrain::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr size_t kThreeMiB = size_t{3} << 20;

using JobServiceLimitsTest = JobServiceFixture;

// The reproduction: two cancels with 3 MiB reasons made every later ListJobs fail (the
// response passed gRPC's 4 MiB limit). Now such a reason is refused, naming the field and size.
TEST_F(JobServiceLimitsTest, HugeCancelReasonsAreRefusedAndListingStillWorks) {
  const v1::Job first = MustSubmit("huge-1");
  const v1::Job second = MustSubmit("huge-2");
  for (const v1::Job& job : {first, second}) {
    v1::Job cancelled;
    const grpc::Status status = Cancel(job.id(), std::string(kThreeMiB, 'r'), &cancelled);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("reason"));
    EXPECT_THAT(status.error_message(), HasSubstr(std::to_string(kThreeMiB)));
  }
  std::vector<v1::Job> jobs;
  int pages = 0;
  const grpc::Status listed = ListAll(&jobs, &pages);
  ASSERT_TRUE(listed.ok()) << listed.error_code() << ": " << listed.error_message();
  EXPECT_EQ(jobs.size(), 2u);
  // The limit itself is allowed, one byte more is not.
  v1::Job cancelled;
  EXPECT_EQ(Cancel(first.id(), std::string(kMaxReasonBytes + 1, 'r'), &cancelled).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  const grpc::Status at_limit = Cancel(first.id(), std::string(kMaxReasonBytes, 'r'), &cancelled);
  ASSERT_TRUE(at_limit.ok()) << at_limit.error_message();
  EXPECT_EQ(cancelled.state_reason().size(), kMaxReasonBytes);
}

// Rows written before the caps (here: put into the file with SQL) still list, a page at a time,
// with their oversized strings cut short in the listing.
TEST_F(JobServiceLimitsTest, OldOversizedRowsListByBytePages) {
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(MustSubmit(absl::StrCat("old-", i)).id());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ / "coordinator.db").string().c_str(), &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 10000);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "UPDATE jobs SET state_reason = ?1", -1, &stmt, nullptr),
            SQLITE_OK);
  const std::string reason(kThreeMiB, 'o');
  sqlite3_bind_text(stmt, 1, reason.data(), static_cast<int>(reason.size()), SQLITE_STATIC);
  EXPECT_EQ(sqlite3_step(stmt), SQLITE_DONE) << sqlite3_errmsg(db);
  sqlite3_finalize(stmt);
  sqlite3_close(db);

  std::vector<v1::Job> jobs;
  int pages = 0;
  const grpc::Status listed = ListAll(&jobs, &pages);
  ASSERT_TRUE(listed.ok()) << listed.error_code() << ": " << listed.error_message();
  ASSERT_EQ(jobs.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(jobs[i].id(), ids[i]);
    EXPECT_LT(jobs[i].state_reason().size(), kMaxReasonBytes + 100);
    EXPECT_NE(jobs[i].state_reason().find("[truncated"), std::string::npos);
  }
  // GetJob still shows the whole stored value.
  grpc::ClientContext context;
  Authorize(&context);
  v1::GetJobRequest get;
  get.set_job_id(ids[0]);
  v1::Job job;
  ASSERT_TRUE(stub_->GetJob(&context, get, &job).ok());
  EXPECT_EQ(job.state_reason().size(), kThreeMiB);
}

// Jobs whose rows are each well within the limits (here: large step metrics, which a worker
// of a wide MoE reports) add up past gRPC's 4 MiB message limit; pages end by bytes instead.
TEST_F(JobServiceLimitsTest, ListJobsPagesByBytes) {
  v1::StepMetrics metrics;
  metrics.set_step(1);
  // 80,000 nine-byte varints: about 720 KB per job, 5.8 MB for the eight.
  for (int i = 0; i < 80000; ++i) metrics.add_expert_tokens(int64_t{1} << 60);
  std::vector<std::string> ids;
  for (int i = 0; i < 8; ++i) {
    const v1::Job job = MustSubmit(absl::StrCat("wide-", i));
    ids.push_back(job.id());
    ASSERT_TRUE(coordinator_->RecordStepMetrics(job.id(), 1, metrics).ok());
  }
  std::vector<v1::Job> jobs;
  int pages = 0;
  const grpc::Status listed = ListAll(&jobs, &pages);
  ASSERT_TRUE(listed.ok()) << listed.error_code() << ": " << listed.error_message();
  ASSERT_EQ(jobs.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(jobs[i].id(), ids[i]);
  EXPECT_GE(pages, 6);
}

TEST_F(JobServiceLimitsTest, LogLinesAreTruncatedWithAMarker) {
  const v1::Job job = MustSubmit("log-1");
  ASSERT_TRUE(coordinator_->AppendEvent(job.id(), kLogEventKind, std::string(100000, 'x')).ok());
  ASSERT_TRUE(coordinator_->AppendEvent(job.id(), kLogEventKind, "short line").ok());
  absl::StatusOr<std::vector<EventRecord>> events = coordinator_->ReadEvents(job.id(), 1, 100);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 3u);
  EXPECT_LE((*events)[1].payload.size(), kMaxLogLineBytes);
  EXPECT_NE((*events)[1].payload.find("[truncated"), std::string::npos);
  EXPECT_EQ((*events)[2].payload, "short line");
}

TEST_F(JobServiceLimitsTest, OverlongSpecPathsAreRefusedNamingTheField) {
  v1::SubmitJobRequest data = Submission("path-1");
  data.mutable_spec()->mutable_data()->set_format(v1::DataConfig::U16);
  data.mutable_spec()->mutable_data()->set_path("/" + std::string(kMaxPathBytes, 'd'));
  v1::Job job;
  grpc::Status status = Submit(data, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("data.path"));
  EXPECT_THAT(status.error_message(), HasSubstr(std::to_string(kMaxPathBytes + 1)));

  v1::SubmitJobRequest checkpoint = Submission("path-2");
  checkpoint.mutable_spec()->mutable_checkpoint()->set_dir(std::string(kMaxPathBytes + 1, 'c'));
  status = Submit(checkpoint, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("checkpoint.dir"));

  // Issue 31: a ~4 MiB init_from was stored, and every listing then passed gRPC's 4 MiB limit.
  v1::SubmitJobRequest init_from = Submission("path-3");
  init_from.mutable_spec()->mutable_checkpoint()->set_init_from(std::string(3 << 20, 'i'));
  status = Submit(init_from, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("checkpoint.init_from"));
  std::vector<v1::Job> jobs;
  int pages = 0;
  EXPECT_TRUE(ListAll(&jobs, &pages).ok());
  EXPECT_TRUE(jobs.empty());
}

// gRPC's own answer to bytes that do not parse is INTERNAL with an empty message.
TEST_F(JobServiceLimitsTest, MalformedRequestsAreInvalidArgumentWithAMessage) {
  // Field 1, length-delimited, 127 bytes announced, 2 present.
  const std::string garbage(
      "\x0a\x7f"
      "ab",
      4);
  for (const char* method :
       {"/moetrain.v1.JobService/SubmitJob", "/moetrain.v1.JobService/ListJobs",
        "/moetrain.v1.JobService/CancelJob"}) {
    SCOPED_TRACE(method);
    const grpc::Status status = RawCall(method, garbage);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("parse"));
  }
  // A streaming method too.
  grpc::ClientContext context;
  Authorize(&context);
  grpc::GenericStub generic(channel_);
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      generic.PrepareCall(&context, "/moetrain.v1.JobService/WatchJob", &cq);
  void* tag = nullptr;
  bool ok = false;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::Slice slice(garbage);
  grpc::ByteBuffer request(&slice, 1);
  call->WriteLast(request, grpc::WriteOptions(), reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(JobServiceLimitsTest, ReplayedSubmissionWithAnotherPriorityIsAlreadyExists) {
  v1::Job first;
  ASSERT_TRUE(Submit(Submission("prio", 1), &first).ok());
  v1::Job again;
  ASSERT_TRUE(Submit(Submission("prio", 1), &again).ok());
  EXPECT_EQ(again.id(), first.id());
  const grpc::Status status = Submit(Submission("prio", 7), &again);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("priority"));
}

TEST_F(JobServiceLimitsTest, WatchFromTheLargestSequenceDoesNotOverflow) {
  const v1::Job job = MustSubmit("watch-max");
  v1::WatchJobRequest request;
  request.set_job_id(job.id());
  request.set_from_sequence(std::numeric_limits<int64_t>::max());
  request.set_no_wait(true);
  grpc::ClientContext context;
  Authorize(&context);
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchJob(&context, request);
  v1::JobEvent event;
  int events = 0;
  while (reader->Read(&event)) ++events;
  const grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_EQ(events, 0);
}

TEST_F(JobServiceLimitsTest, NonAsciiSubmissionIdIsCalledNonAscii) {
  v1::Job job;
  const grpc::Status status = Submit(Submission("sub-\xc3\xa9t\xc3\xa9"), &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), Not(HasSubstr("non-printable")));
  EXPECT_THAT(status.error_message(), HasSubstr("ASCII"));
  EXPECT_THAT(status.error_message(), HasSubstr("0xc3"));
}

// An error that quotes what the caller sent (here a 100 KB job id) is cut, so it fits the
// trailer the client accepts: the caller gets the real answer (INVALID_ARGUMENT: not a job id), not
// RESOURCE_EXHAUSTED about metadata.
TEST_F(JobServiceLimitsTest, ErrorsQuotingAHugeRequestStillReachTheCaller) {
  v1::GetJobRequest request;
  request.set_job_id(std::string(100'000, 'j'));
  grpc::ClientContext context;
  Authorize(&context);
  v1::Job job;
  const grpc::Status status = stub_->GetJob(&context, request, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message().size();
  EXPECT_LE(status.error_message().size(), kMaxErrorMessageBytes);
  EXPECT_THAT(status.error_message(), HasSubstr("truncated"));
}

}  // namespace
}  // namespace moetrain::server
