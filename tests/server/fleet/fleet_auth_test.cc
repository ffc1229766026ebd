// Worker identity in the fleet, on a real store and coordinator: RegisterWorker issues a secret
// that proves one worker only, is kept hashed (and survives a coordinator restart), is never shown
// by ListWorkers, and the rendezvous serves only the workers that hold a rank of its attempt.
#include <string>

#include "absl/strings/match.h"
#include "server/core/fleet.h"
#include "tests/server/fleet/fleet_test_util.h"

namespace moetrain::server {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

struct Registration {
  std::string id;
  std::string secret;
};

class FleetAuthTest : public FleetTest {
 protected:
  Registration RegisterWithSecret(const std::string& name) {
    v1::RegisterWorkerRequest request;
    request.set_name(name);
    request.set_version("test");
    request.mutable_resources()->set_device(v1::ResourceConfig::CPU);
    request.mutable_resources()->set_device_count(1);
    request.mutable_resources()->set_threads(1);
    absl::StatusOr<v1::RegisterWorkerResponse> response = fleet_->Register(request);
    EXPECT_TRUE(response.ok()) << response.status();
    if (!response.ok()) return {};
    return {response->worker_id(), response->worker_secret()};
  }
};

TEST_F(FleetAuthTest, EachWorkerGetsItsOwnSecretAndOnlyItProvesThatWorker) {
  StartFleet();
  const Registration a = RegisterWithSecret("a"), b = RegisterWithSecret("b");
  EXPECT_THAT(a.secret, MatchesRegex("[0-9a-f]{64}"));
  EXPECT_THAT(b.secret, MatchesRegex("[0-9a-f]{64}"));
  EXPECT_NE(a.secret, b.secret);

  EXPECT_OK(fleet_->Authenticate(a.id, a.secret));
  EXPECT_OK(fleet_->Authenticate(b.id, b.secret));
  for (const std::string& wrong :
       {b.secret, std::string(), std::string(64, '0'), a.secret.substr(0, 63), a.secret + "0"}) {
    const absl::Status status = fleet_->Authenticate(a.id, wrong);
    EXPECT_TRUE(absl::IsUnauthenticated(status)) << "'" << wrong << "': " << status;
    EXPECT_THAT(status.message(), HasSubstr(a.id));
    EXPECT_FALSE(absl::StrContains(status.message(), a.secret));
  }
  const absl::Status unknown = fleet_->Authenticate("w-nosuchworker", a.secret);
  EXPECT_TRUE(absl::IsNotFound(unknown)) << unknown;

  // The public listing shows ids, never a secret.
  for (const v1::WorkerInfo& info : AllWorkers()) {
    const std::string bytes = info.SerializeAsString();
    EXPECT_FALSE(absl::StrContains(bytes, a.secret)) << info.DebugString();
    EXPECT_FALSE(absl::StrContains(bytes, b.secret)) << info.DebugString();
  }
}

TEST_F(FleetAuthTest, TheSecretSurvivesACoordinatorRestartAndIsStoredOnlyHashed) {
  StartFleet();
  const Registration worker = RegisterWithSecret("survivor");
  StopFleet();

  absl::StatusOr<std::vector<WorkerRecord>> records = store_->ListWorkers();
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 1u);
  EXPECT_FALSE(absl::StrContains(records->front().resources, worker.secret));
  EXPECT_FALSE(absl::StrContains(records->front().name, worker.secret));

  StartFleet();  // reconciliation: the worker comes back under its id and secret
  EXPECT_OK(fleet_->Authenticate(worker.id, worker.secret));
  EXPECT_TRUE(absl::IsUnauthenticated(fleet_->Authenticate(worker.id, std::string(64, 'f'))));
}

TEST_F(FleetAuthTest, AWorkerStoredBeforeSecretsMustRegisterAgain) {
  // A record as an older coordinator wrote it: the registration request, no secret.
  v1::RegisterWorkerRequest old;
  old.set_name("old");
  old.mutable_resources()->set_device(v1::ResourceConfig::CPU);
  old.mutable_resources()->set_device_count(1);
  old.mutable_resources()->set_threads(1);
  WorkerRecord record;
  record.id = "w-registeredlongago";
  record.name = "old";
  record.resources = old.SerializeAsString();
  ASSERT_OK(store_->UpsertWorker(record));
  StartFleet();
  const absl::Status status = fleet_->Authenticate(record.id, std::string(64, 'a'));
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("register again"));
  EXPECT_EQ(InfoOf(record.id).device_count(), 1);  // the record itself still reads
}

TEST_F(FleetAuthTest, ALostWorkerIsNotFoundWhateverItsSecret) {
  FleetOptions options = DefaultOptions();
  options.heartbeat_interval = absl::Milliseconds(50);
  options.heartbeat_timeout = absl::Milliseconds(300);
  options.reconcile_grace = absl::Milliseconds(300);
  StartFleet(options);
  const Registration worker = RegisterWithSecret("silent");
  ASSERT_TRUE(WaitUntil([&] { return WorkerStateOf(worker.id) == v1::WORKER_STATE_LOST; }));
  const absl::Status status = fleet_->Authenticate(worker.id, worker.secret);
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
}

TEST_F(FleetAuthTest, TheRendezvousServesOnlyWorkersHoldingARankOfTheAttempt) {
  StartFleet();
  const RendezvousJob running = StartRendezvousJob();
  const std::string bystander = Register("bystander");
  const std::string& job = running.job.id;

  ASSERT_OK(fleet_->KvSet(running.worker_id, job, 1, "nccl-id", "real"));
  absl::Status status = fleet_->KvSet(bystander, job, 1, "nccl-id", "forged");
  EXPECT_TRUE(absl::IsPermissionDenied(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("worker ", bystander, " holds no rank")));
  EXPECT_TRUE(absl::IsPermissionDenied(fleet_->KvGet(bystander, job, 1, "nccl-id").status()));
  EXPECT_TRUE(absl::IsPermissionDenied(
      fleet_->KvWait(bystander, job, 1, "nccl-id", absl::Seconds(1), nullptr).status()));
  EXPECT_TRUE(absl::IsNotFound(fleet_->KvSet("w-nosuchworker", job, 1, "k", "v")));

  absl::StatusOr<std::optional<std::string>> value =
      fleet_->KvGet(running.worker_id, job, 1, "nccl-id");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(value->value_or("<unset>"), "real");

  // A rank that reported its end has left the rendezvous with its slot.
  ASSERT_OK(fleet_->ReportAttemptEnd(
      EndReport(running.worker_id, running.assignment, v1::ATTEMPT_OUTCOME_FAILED, 1, "x")));
  EXPECT_FALSE(fleet_->KvGet(running.worker_id, job, 1, "nccl-id").ok());
}

}  // namespace
}  // namespace moetrain::server
