// CoordinatorKeyValueStore against a real coordinator in the test process (a CoordinatorServer on
// a loopback port with a bearer token, the fixture of worker_test_util.h) whose two-worker job has
// attempt 1 running (an attempt of one rank has no rendezvous): set and get, a get that waits for
// another rank's set, the timeout, another attempt, a coordinator restart under a waiting get, a
// wrong token, and two Gloo ranks meeting through it. Then LocalAddressToward on the address forms
// a coordinator is given by.
#include "worker/rendezvous_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/comm/communicator.h"
#include "engine/comm/create_communicator.h"
#include "engine/core/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "moetrain/v1/connect.h"
#include "tests/worker/worker_test_util.h"

namespace moetrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using worker_test::kPatience;

constexpr char kToken[] = "rendezvous-test-token";

class RendezvousStoreTest : public worker_test::CoordinatorFixture {
 protected:
  RendezvousStoreTest() : CoordinatorFixture("rendezvous-store-test", kToken) {}

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(CoordinatorFixture::SetUp());
    ASSERT_NO_FATAL_FAILURE(StartRunningJob(/*workers=*/2));
    attempt_ = assignment_.attempt();
  }

  // A channel of its own, as another rank's worker would have, with the credentials of rank 0's
  // worker (rank 1's with `peer`); `token` replaces the test's.
  Connection NewConnection(const std::string& token = kToken, bool peer = false) {
    ConnectOptions options;
    options.address = address();
    absl::StatusOr<Connection> connection = Connect(options);
    EXPECT_TRUE(connection.ok()) << connection.status();
    if (!connection.ok()) return connection_;
    connection->token = token;
    const Connection& rank = peer ? peer_connection_ : connection_;
    connection->worker_id = rank.worker_id;  // a worker of the running attempt
    connection->worker_secret = rank.worker_secret;
    return *std::move(connection);
  }

  // Rank 0's store for the job's running attempt, or for `attempt` when given.
  std::shared_ptr<CoordinatorKeyValueStore> NewStore(int64_t attempt = -1) {
    return std::make_shared<CoordinatorKeyValueStore>(NewConnection(), job_id_,
                                                      attempt < 0 ? attempt_ : attempt);
  }
  // Rank 1's, on the other worker.
  std::shared_ptr<CoordinatorKeyValueStore> NewPeerStore() {
    return std::make_shared<CoordinatorKeyValueStore>(NewConnection(kToken, /*peer=*/true), job_id_,
                                                      attempt_);
  }

  int64_t attempt_ = 0;
};

TEST_F(RendezvousStoreTest, SetThenGetReturnsTheValue) {
  const std::shared_ptr<CoordinatorKeyValueStore> store = NewStore();
  const std::string binary("addr\0\x01\xff", 7);  // values are bytes, not text
  ASSERT_TRUE(store->Set("rank-0", binary).ok());
  absl::StatusOr<std::string> value = store->Get("rank-0", absl::Seconds(10));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, binary);

  // Another rank reads it, and a second Set overwrites it.
  const std::shared_ptr<CoordinatorKeyValueStore> other = NewPeerStore();
  value = other->Get("rank-0", absl::Seconds(10));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, binary);
  ASSERT_TRUE(other->Set("rank-0", "replaced").ok());
  value = store->Get("rank-0", absl::Seconds(10));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "replaced");
}

// As FileKeyValueStore: a Get with no time left still looks once (GlooStoreAdapter::wait gives
// each key what is left of one deadline, which may be nothing by the last key).
TEST_F(RendezvousStoreTest, GetWithNoTimeLeftStillReturnsAKeyAlreadySet) {
  const std::shared_ptr<CoordinatorKeyValueStore> store = NewStore();
  ASSERT_TRUE(store->Set("rank-1", "here").ok());
  absl::StatusOr<std::string> value = store->Get("rank-1", absl::ZeroDuration());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "here");
  value = store->Get("rank-1", -absl::Seconds(1));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "here");

  const absl::Time start = absl::Now();
  value = store->Get("rank-2", absl::ZeroDuration());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "a zero timeout is not \"wait forever\"";
  EXPECT_TRUE(absl::IsDeadlineExceeded(value.status())) << value.status();
}

TEST_F(RendezvousStoreTest, GetWaitsForASetMadeLaterByAnotherRank) {
  const std::shared_ptr<CoordinatorKeyValueStore> waiting = NewStore();
  const std::shared_ptr<CoordinatorKeyValueStore> setting = NewPeerStore();
  absl::StatusOr<std::string> value = absl::UnknownError("Get has not returned");
  absl::Time returned_at;
  std::thread waiter([&] {
    value = waiting->Get("late-key", kPatience);
    returned_at = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(300));  // the waiter is in its long poll by now
  const absl::Time set_at = absl::Now();
  const absl::Status set = setting->Set("late-key", "late-value");
  waiter.join();
  ASSERT_TRUE(set.ok()) << set;
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "late-value");
  EXPECT_GE(returned_at, set_at) << "Get returned before the key was set";
}

TEST_F(RendezvousStoreTest, GetOfAKeyNeverSetFailsAfterTheTimeoutNamingKeyJobAndAttempt) {
  const std::shared_ptr<CoordinatorKeyValueStore> store = NewStore();
  constexpr absl::Duration kTimeout = absl::Milliseconds(400);
  const absl::Time start = absl::Now();
  const absl::StatusOr<std::string> value = store->Get("never-set", kTimeout);
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(value.ok()) << "got '" << *value << "'";
  EXPECT_TRUE(absl::IsDeadlineExceeded(value.status())) << value.status();
  EXPECT_THAT(value.status().message(), AllOf(HasSubstr("'never-set'"), HasSubstr(job_id_),
                                              HasSubstr(absl::StrCat("attempt ", attempt_))));
  EXPECT_GE(took, kTimeout);
}

TEST_F(RendezvousStoreTest, StoreOfAnotherAttemptFailsWithFailedPrecondition) {
  const int64_t other_attempt = attempt_ + 1;
  const std::shared_ptr<CoordinatorKeyValueStore> store = NewStore(other_attempt);
  const absl::Status set = store->Set("rank-0", "x");
  EXPECT_TRUE(absl::IsFailedPrecondition(set)) << set;
  EXPECT_THAT(set.message(), HasSubstr(absl::StrCat("attempt ", other_attempt)));

  // At once, not after the timeout: the attempt will never be the current one for this store.
  const absl::Time start = absl::Now();
  const absl::StatusOr<std::string> value = store->Get("rank-0", kPatience);
  EXPECT_LT(absl::Now() - start, kPatience);
  ASSERT_FALSE(value.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(value.status())) << value.status();
  EXPECT_THAT(value.status().message(), AllOf(HasSubstr("'rank-0'"), HasSubstr(job_id_),
                                              HasSubstr(absl::StrCat("attempt ", other_attempt))));
}

TEST_F(RendezvousStoreTest, GetRidesOutACoordinatorRestart) {
  const std::shared_ptr<CoordinatorKeyValueStore> waiting = NewStore();
  absl::StatusOr<std::string> value = absl::UnknownError("Get has not returned");
  std::thread waiter([&] { value = waiting->Get("after-restart", kPatience); });
  absl::SleepFor(absl::Milliseconds(300));  // the waiter is in its long poll by now

  StopCoordinator();
  absl::SleepFor(absl::Milliseconds(300));  // its retries find nobody there
  // The same port and state file, within the grace period: the attempt is still current.
  StartCoordinator(port_);
  const bool restarted = !HasFatalFailure();
  const absl::Status set = restarted ? NewStore()->Set("after-restart", "still-here")
                                     : absl::UnavailableError("the coordinator did not restart");
  waiter.join();  // before any ASSERT returns: the waiter uses this test's objects
  ASSERT_TRUE(set.ok()) << set;
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "still-here");
  const v1::Job job = GetJob();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.attempt(), attempt_);
}

TEST_F(RendezvousStoreTest, WrongTokenIsUnauthenticated) {
  for (const std::string& token : {std::string("not-the-token"), std::string()}) {
    SCOPED_TRACE(token.empty() ? "no token" : "wrong token");
    CoordinatorKeyValueStore store(NewConnection(token), job_id_, attempt_);
    const absl::Status set = store.Set("rank-0", "x");
    EXPECT_TRUE(absl::IsUnauthenticated(set)) << set;
    // Not retried until the timeout: a token does not get better by waiting.
    const absl::Time start = absl::Now();
    const absl::StatusOr<std::string> value = store.Get("rank-0", kPatience);
    EXPECT_LT(absl::Now() - start, kPatience);
    ASSERT_FALSE(value.ok());
    EXPECT_TRUE(absl::IsUnauthenticated(value.status())) << value.status();
  }
}

TEST_F(RendezvousStoreTest, ACallerThatIsNotARankOfTheAttemptIsRefused) {
  // Without the worker's secret: UNAUTHENTICATED, not retried.
  Connection anonymous = NewConnection();
  anonymous.worker_secret.clear();
  CoordinatorKeyValueStore forged(anonymous, job_id_, attempt_);
  absl::Status set = forged.Set("rank-0", "x");
  EXPECT_TRUE(absl::IsUnauthenticated(set)) << set;
  absl::StatusOr<std::string> value = forged.Get("rank-0", kPatience);
  EXPECT_TRUE(absl::IsUnauthenticated(value.status())) << value.status();

  // A registered worker, proved, that holds no rank of the attempt: PERMISSION_DENIED.
  v1::RegisterWorkerRequest registration;
  registration.set_name("bystander");
  registration.mutable_resources()->set_device(v1::ResourceConfig::CPU);
  registration.mutable_resources()->set_device_count(1);
  registration.mutable_resources()->set_threads(1);
  v1::RegisterWorkerResponse registered;
  grpc::ClientContext context;
  NewConnection().Prepare(&context, absl::Seconds(10));
  ASSERT_TRUE(workers_->RegisterWorker(&context, registration, &registered).ok());
  Connection bystander = NewConnection();
  bystander.worker_id = registered.worker_id();
  bystander.worker_secret = registered.worker_secret();
  CoordinatorKeyValueStore other(bystander, job_id_, attempt_);
  set = other.Set("rank-0", "x");
  EXPECT_TRUE(absl::IsPermissionDenied(set)) << set;
  value = other.Get("rank-0", kPatience);
  EXPECT_TRUE(absl::IsPermissionDenied(value.status())) << value.status();

  // Nothing of theirs reached the rendezvous.
  const std::shared_ptr<CoordinatorKeyValueStore> own = NewStore();
  value = own->Get("rank-0", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsDeadlineExceeded(value.status())) << value.status();
}

TEST_F(RendezvousStoreTest, TwoGlooRanksMeetThroughTheCoordinatorAndAllReduce) {
  constexpr int kSize = 2;
  constexpr int64_t kCount = 1001;  // odd: the ring all-reduce splits it into ragged chunks
  std::vector<absl::Status> statuses(kSize);
  std::vector<std::vector<float>> data(kSize);
  std::vector<std::string> backends(kSize);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kSize; ++rank) {
    data[rank].resize(kCount);
    for (int64_t i = 0; i < kCount; ++i) {
      data[rank][i] = static_cast<float>(i) * 0.5f + static_cast<float>(rank + 1);
    }
    ranks.emplace_back([&, rank, store = rank == 0 ? NewStore() : NewPeerStore()] {
      CommOptions options;
      options.backend = CommBackend::kGloo;
      options.listen_host = "127.0.0.1";
      options.group.store = store;
      options.group.prefix = absl::StrCat(job_id_, "/attempt-", attempt_, "/world");
      options.group.rank = rank;
      options.group.size = kSize;
      options.group.timeout = absl::Seconds(10);
      absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateCommunicator(options);
      if (!comm.ok()) {
        statuses[rank] = comm.status();
        return;
      }
      backends[rank] = (*comm)->backend();
      statuses[rank] = (*comm)->AllReduceSum(data[rank].data(), kCount, DType::kF32);
    });
  }
  for (std::thread& rank : ranks) rank.join();
  for (int rank = 0; rank < kSize; ++rank) {
    ASSERT_TRUE(statuses[rank].ok()) << "rank " << rank << ": " << statuses[rank];
    EXPECT_EQ(backends[rank], "gloo");
    for (int64_t i = 0; i < kCount; ++i) {
      // 0.5·i + 1 + 0.5·i + 2, exact in f32.
      ASSERT_EQ(data[rank][i], static_cast<float>(i) + 3.0f) << "rank " << rank << ", i " << i;
    }
  }
}

// Whether `address` (numeric) is a loopback address: 127.0.0.0/8 or ::1.
bool IsLoopback(const std::string& address) {
  in_addr v4 = {};
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6 = {};
  return inet_pton(AF_INET6, address.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

bool HasIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_DGRAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 loopback = {};
  loopback.sin6_family = AF_INET6;
  loopback.sin6_addr = in6addr_loopback;
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&loopback), sizeof(loopback)) == 0;
  close(fd);
  return bound;
}

TEST(LocalAddressTowardTest, Ipv4HostAndPort) {
  const absl::StatusOr<std::string> local = LocalAddressToward("127.0.0.1:1234");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, "127.0.0.1");
}

TEST(LocalAddressTowardTest, DnsSchemeLocalhostIsALoopbackAddress) {
  const absl::StatusOr<std::string> local = LocalAddressToward("dns:///localhost:1234");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_TRUE(IsLoopback(*local)) << *local;
}

TEST(LocalAddressTowardTest, BracketedIpv6Loopback) {
  if (!HasIpv6Loopback()) GTEST_SKIP() << "this machine has no IPv6 loopback";
  absl::StatusOr<std::string> local = LocalAddressToward("[::1]:1234");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, "::1");
  local = LocalAddressToward("ipv6:[::1]:1234");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, "::1");
}

TEST(LocalAddressTowardTest, Ipv4Scheme) {
  const absl::StatusOr<std::string> local = LocalAddressToward("ipv4:127.0.0.1:5");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, "127.0.0.1");
}

TEST(LocalAddressTowardTest, UnresolvableNameIsUnavailableNamingIt) {
  const absl::StatusOr<std::string> local = LocalAddressToward("no-such-host.invalid:1");
  ASSERT_FALSE(local.ok()) << "resolved to " << *local;
  EXPECT_TRUE(absl::IsUnavailable(local.status())) << local.status();
  EXPECT_THAT(local.status().message(), HasSubstr("no-such-host.invalid"));
}

}  // namespace
}  // namespace moetrain
