// The coordinator's device-memory admission at submit (moetrain/v1/memory_admission.h, through
// Fleet::CheckDeviceMemory), end to end: a real CoordinatorServer on 127.0.0.1, workers registered
// through the real WorkerService RPC with the resources a GPU worker advertises (no GPU is needed
// to register), jobs submitted through the real JobService with resources.device_memory_bytes set
// as `moetrain submit` sets it from the plan. A CUDA job that needs more device memory per rank
// than every matching worker offers is refused with both figures and nothing is stored; a worker
// that offers enough, or does not say, a need not stated, or a CPU job, is accepted; and the
// scheduler places the job by its stated need.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "moetrain/v1/coordinator.grpc.pb.h"
#include "moetrain/v1/job_spec.h"
#include "moetrain/v1/worker.grpc.pb.h"
#include "tests/integration/tiny_spec.h"
#include "tests/server/coordinator_server/loopback_coordinator.h"
#include "tests/testing/testing.h"

namespace moetrain::server {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

// A job of `device` whose rank needs `device_memory_bytes` (0 = not stated).
v1::JobSpec Spec(v1::ResourceConfig::Device device, int64_t device_memory_bytes,
                 int64_t devices_per_worker = 1) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpecYaml(testutil::PlannedSpecYaml("big", 8, "  workers: 1\n"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->mutable_resources()->set_device(device);
  spec->mutable_resources()->set_devices_per_worker(devices_per_worker);
  spec->mutable_resources()->set_device_memory_bytes(device_memory_bytes);
  return *spec;
}

class SubmitMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FleetOptions fleet;
    // The workers here never heartbeat: they must not be declared LOST during a test, unless the
    // test forgets them on purpose.
    if (forget_workers_) fleet.heartbeat_interval = absl::Milliseconds(50);
    fleet.heartbeat_timeout = forget_workers_ ? absl::Milliseconds(100) : absl::Minutes(10);
    fleet.forget_lost_after = absl::Milliseconds(100);
    fleet.control_interval = absl::Milliseconds(50);
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
        testutil::StartLoopbackCoordinator(dir_, 0, /*bearer_token=*/"", fleet);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->grpc_port()),
                                   grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel_);
    workers_ = v1::WorkerService::NewStub(channel_);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  static void Deadline(grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  }

  // Registers a worker as `moetrain-worker` would with these resources; its id.
  std::string Register(const std::string& name, v1::ResourceConfig::Device device, int32_t count,
                       int64_t memory_bytes) {
    v1::RegisterWorkerRequest request;
    request.set_name(name);
    request.set_version("test");
    v1::WorkerResources& resources = *request.mutable_resources();
    resources.set_device(device);
    resources.set_device_count(count);
    resources.set_device_memory_bytes(memory_bytes);
    resources.set_threads(1);
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    Deadline(&context);
    const grpc::Status status = workers_->RegisterWorker(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.worker_id();
  }

  grpc::Status Submit(const v1::JobSpec& spec, v1::Job* job, const std::string& id = "") {
    v1::SubmitJobRequest request;
    request.set_submission_id(id.empty() ? absl::StrCat("submission-", ++submissions_) : id);
    *request.mutable_spec() = spec;
    grpc::ClientContext context;
    Deadline(&context);
    return jobs_->SubmitJob(&context, request, job);
  }

  std::vector<v1::Job> ListJobs() {
    v1::ListJobsResponse response;
    grpc::ClientContext context;
    Deadline(&context);
    const grpc::Status status = jobs_->ListJobs(&context, v1::ListJobsRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return {response.jobs().begin(), response.jobs().end()};
  }

  std::vector<v1::WorkerInfo> ListWorkers() {
    v1::ListWorkersResponse response;
    grpc::ClientContext context;
    Deadline(&context);
    const grpc::Status status = jobs_->ListWorkers(&context, v1::ListWorkersRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return {response.workers().begin(), response.workers().end()};
  }

  // True once the coordinator lists no worker (within a minute).
  bool WaitUntilNoWorkers() {
    const absl::Time deadline = absl::Now() + absl::Minutes(1);
    while (absl::Now() < deadline) {
      if (ListWorkers().empty()) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  // The worker the scheduler gave `job_id` to; empty if none within a minute (a hang).
  std::string AssignedWorker(const std::string& job_id) {
    const absl::Time deadline = absl::Now() + absl::Minutes(1);
    while (absl::Now() < deadline) {
      for (const v1::WorkerInfo& worker : ListWorkers()) {
        if (worker.current_job_id() == job_id) return worker.id();
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return "";
  }

  const testutil::TempDir temp_dir_{"submit_memory_test"};
  const std::filesystem::path dir_ = temp_dir_.path();
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  int submissions_ = 0;
  bool forget_workers_ = false;  // set before SetUp: silent workers are forgotten within 200 ms
};

class SubmitMemoryForgettingTest : public SubmitMemoryTest {
 protected:
  SubmitMemoryForgettingTest() { forget_workers_ = true; }
};

// A repeated submission returns its job whatever the fleet is now: the large worker it was
// accepted for is gone (declared lost, then forgotten), and only a small one remains.
TEST_F(SubmitMemoryForgettingTest, ARepeatedSubmissionIsNotJudgedAgain) {
  Register("gpu-1t", v1::ResourceConfig::CUDA, 1, 1024 * kGiB);
  const v1::JobSpec spec = Spec(v1::ResourceConfig::CUDA, 10 * kGiB);
  v1::Job first;
  ASSERT_TRUE(Submit(spec, &first, "once").ok());
  ASSERT_TRUE(WaitUntilNoWorkers());
  Register("gpu-1g", v1::ResourceConfig::CUDA, 1, 1 * kGiB);

  v1::Job again;
  const grpc::Status repeated = Submit(spec, &again, "once");
  ASSERT_TRUE(repeated.ok()) << repeated.error_message();
  EXPECT_EQ(again.id(), first.id());
  // A new submission of the same spec is judged, and refused.
  v1::Job other;
  EXPECT_EQ(Submit(spec, &other, "twice").error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ListJobs().size(), 1u);
}

TEST_F(SubmitMemoryTest, RefusesACudaJobLargerThanEveryWorkerAndStoresNothing) {
  Register("gpu-1g", v1::ResourceConfig::CUDA, 1, 1 * kGiB);
  Register("gpu-2g", v1::ResourceConfig::CUDA, 1, 2 * kGiB);
  // A CPU worker is no candidate for a CUDA job, and its unknown memory does not count.
  Register("cpu", v1::ResourceConfig::CPU, 1, 0);

  v1::Job job;
  const grpc::Status status = Submit(Spec(v1::ResourceConfig::CUDA, 18845101261), &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_EQ(status.error_message(),
            "job big needs 17.55 GiB of device memory per rank (resources.device_memory_bytes = "
            "18845101261); the largest of the 2 registered CUDA workers offers 2.00 GiB a device; "
            "lower train.micro_batch_size or raise parallel.expert_parallel, or make the model "
            "smaller; `moetrain plan SPEC` shows where the memory goes");
  EXPECT_TRUE(ListJobs().empty());
}

TEST_F(SubmitMemoryTest, CountsOnlyWorkersWithEnoughDevices) {
  // Two devices a worker: the 1 TiB worker has one, so it cannot hold the job at all.
  Register("one-big-gpu", v1::ResourceConfig::CUDA, 1, 1024 * kGiB);
  Register("two-small-gpus", v1::ResourceConfig::CUDA, 2, 1 * kGiB);

  v1::Job job;
  const grpc::Status status =
      Submit(Spec(v1::ResourceConfig::CUDA, 10 * kGiB, /*devices_per_worker=*/2), &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_THAT(status.error_message(),
              HasSubstr("job big needs 10.00 GiB of device memory per rank "
                        "(resources.device_memory_bytes = 10737418240); the only registered CUDA "
                        "worker with at least 2 devices offers 1.00 GiB a device"));
  EXPECT_TRUE(ListJobs().empty());
}

TEST_F(SubmitMemoryTest, AcceptsWhenOneWorkerOffersEnoughAndSchedulesItThere) {
  const std::string small = Register("gpu-1g", v1::ResourceConfig::CUDA, 1, 1 * kGiB);
  // Two devices: by best fit alone (rule 6) the scheduler would take the one-device worker.
  const std::string large = Register("gpu-1t", v1::ResourceConfig::CUDA, 2, 1024 * kGiB);

  v1::Job job;
  const grpc::Status status = Submit(Spec(v1::ResourceConfig::CUDA, 10 * kGiB), &job);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(ListJobs().size(), 1u);
  // The stated need reached the scheduler (rule 2): the small worker is passed over.
  EXPECT_EQ(AssignedWorker(job.id()), large) << "small worker: " << small;
}

TEST_F(SubmitMemoryTest, AcceptsWhenAMatchingWorkerDoesNotSayItsMemory) {
  Register("gpu-1g", v1::ResourceConfig::CUDA, 1, 1 * kGiB);
  Register("gpu-unknown", v1::ResourceConfig::CUDA, 1, 0);

  v1::Job job;
  const grpc::Status status = Submit(Spec(v1::ResourceConfig::CUDA, 10 * kGiB), &job);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(ListJobs().size(), 1u);
}

TEST_F(SubmitMemoryTest, DoesNotCheckANeedNotStated) {
  Register("gpu-1g", v1::ResourceConfig::CUDA, 1, 1 * kGiB);
  // resources.device_memory_bytes = 0: the coordinator plans nothing itself.
  v1::Job job;
  const grpc::Status status = Submit(Spec(v1::ResourceConfig::CUDA, 0), &job);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(ListJobs().size(), 1u);
  // And the job goes to the worker, whatever its memory.
  EXPECT_FALSE(AssignedWorker(job.id()).empty());
}

TEST_F(SubmitMemoryTest, RefusesANegativeNeedAsABadSpec) {
  Register("gpu-1g", v1::ResourceConfig::CUDA, 1, 1 * kGiB);
  v1::Job job;
  const grpc::Status status = Submit(Spec(v1::ResourceConfig::CUDA, -1), &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(),
              HasSubstr("resources.device_memory_bytes = -1 must not be negative"));
  EXPECT_TRUE(ListJobs().empty());
}

TEST_F(SubmitMemoryTest, AcceptsCpuJobsAndCudaJobsWithoutCudaWorkers) {
  // CPU workers advertise no device memory, so even a stated need finds none too small.
  Register("cpu-1", v1::ResourceConfig::CPU, 1, 0);
  Register("cpu-2", v1::ResourceConfig::CPU, 1, 0);
  v1::Job job;
  grpc::Status status = Submit(Spec(v1::ResourceConfig::CPU, 0), &job);
  EXPECT_TRUE(status.ok()) << status.error_message();
  status = Submit(Spec(v1::ResourceConfig::CPU, 10 * kGiB), &job);
  EXPECT_TRUE(status.ok()) << status.error_message();

  // No CUDA worker yet: the job waits for one (the scheduler says why), it is not refused.
  status = Submit(Spec(v1::ResourceConfig::CUDA, 10 * kGiB), &job);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(ListJobs().size(), 3u);
}

}  // namespace
}  // namespace moetrain::server
