// `moetrain submit` and `moetrain submit --dry-run` through the real binary against a real
// coordinator in this process, with workers registered through the real WorkerService RPC as GPU
// workers advertise themselves (no GPU is needed to register). submit fills a CUDA job's
// resources.device_memory_bytes from the plan (or keeps the one the spec states), and the
// coordinator judges the job by it; the dry run prints the plan of the spec on those workers and
// the coordinator's verdict, agrees with what a real submit then does, and submits nothing.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/client/client_test_util.h"

namespace moetrain::testutil {
namespace {

using nlohmann::json;

constexpr int64_t kGiB = int64_t{1} << 30;

// A CUDA job of about 17.5 GiB a rank by the plan (0.55 G parameters and the activations of 8
// sequences of 1024 tokens): more than a 2 GiB GPU, less than a 1 TiB one.
constexpr char kBigCudaSpec[] = R"(name: big
model:
  vocab_size: 32000
  hidden_size: 2048
  num_layers: 4
  num_heads: 16
  num_kv_heads: 16
  ffn_dim: 8192
  first_dense_layers: 1
  moe:
    num_experts: 8
    top_k: 2
    expert_ffn_dim: 2048
data:
  format: SYNTHETIC
train:
  steps: 10
  batch_size: 8
  seq_len: 1024
resources:
  workers: 1
  device: CUDA
)";

class CliDryRunTest : public ClientTest {
 protected:
  // The fixture's coordinator, restarted with a heartbeat timeout the registered workers, which
  // never heartbeat, do not reach during a test.
  void SetUp() override {
    ClientTest::SetUp();
    if (HasFatalFailure()) return;
    StopCoordinator();
    server::FleetOptions fleet;
    fleet.heartbeat_timeout = absl::Minutes(10);
    fleet.control_interval = absl::Milliseconds(50);
    absl::StatusOr<std::unique_ptr<server::CoordinatorServer>> server =
        StartLoopbackCoordinator(dir_, 0, kToken, fleet);
    ASSERT_TRUE(server.ok()) << server.status();
    coordinator_ = *std::move(server);
    port_ = coordinator_->grpc_port();
  }

  // Registers a worker with these resources, as `moetrain-worker --devices cuda` would.
  void RegisterGpuWorker(const std::string& name, int32_t devices, int64_t memory_bytes) {
    ConnectOptions options;
    options.address = address();
    options.token_file = token_file_;
    absl::StatusOr<Connection> connection = Connect(options);
    ASSERT_TRUE(connection.ok()) << connection.status();
    v1::RegisterWorkerRequest request;
    request.set_name(name);
    request.set_version("test");
    v1::WorkerResources& resources = *request.mutable_resources();
    resources.set_device(v1::ResourceConfig::CUDA);
    resources.set_device_count(devices);
    resources.set_device_memory_bytes(memory_bytes);
    resources.set_threads(1);
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    connection->Prepare(&context, absl::Seconds(10));
    const absl::Status status = FromGrpcStatus(v1::WorkerService::NewStub(connection->channel)
                                                   ->RegisterWorker(&context, request, &response));
    ASSERT_TRUE(status.ok()) << status;
  }

  // The coordinator's jobs, as `moetrain jobs --json` lists them.
  json Jobs() {
    const Finished jobs = Moetrain(Args({"jobs", "--json"}));
    EXPECT_EQ(jobs.exit_code, 0) << jobs.err;
    const std::vector<json> lines = JsonLines(jobs.out);
    EXPECT_EQ(lines.size(), 1u) << jobs.out;
    return lines.empty() ? json() : lines[0].at("jobs");
  }
};

TEST_F(CliDryRunTest, PrintsThePlanOnTheWorkersAndTheRefusalAndSubmitsNothing) {
  RegisterGpuWorker("gpu-a", 1, 2 * kGiB);
  RegisterGpuWorker("gpu-b", 1, 2 * kGiB);
  const std::string spec = WriteSpec(kBigCudaSpec);

  const Finished text = Moetrain(Args({"submit", "--dry-run", spec}));
  EXPECT_EQ(text.exit_code, 2) << text.err;
  EXPECT_TRUE(Contains(text.out, "2 CUDA workers registered, 2.00 GiB each; the job needs 1"))
      << text.out;
  EXPECT_TRUE(Contains(text.out, "plan on h200-node with the workers' memory: 2.00 GiB a device"))
      << text.out;
  EXPECT_TRUE(Contains(text.out, "memory/rank")) << text.out;
  EXPECT_TRUE(Contains(text.out, "the coordinator would refuse it (FAILED_PRECONDITION)"))
      << text.out;

  const Finished document = Moetrain(Args({"submit", "--dry-run", spec, "--json"}));
  EXPECT_EQ(document.exit_code, 2) << document.err;
  const std::vector<json> lines = JsonLines(document.out);
  ASSERT_EQ(lines.size(), 1u) << document.out;
  const json& plan = lines[0];
  EXPECT_FALSE(plan.at("accepted").get<bool>());
  EXPECT_EQ(plan.at("workers").at("matching"), 2);
  EXPECT_EQ(plan.at("workers").at("largest_memory_bytes"), 2 * kGiB);
  EXPECT_EQ(plan.at("device_memory_bytes").get<double>(), 2.0 * kGiB);
  EXPECT_EQ(plan.at("gpus"), 1);
  const json& layout = plan.at("layout");
  EXPECT_EQ(layout.at("data_parallel"), 1);
  EXPECT_EQ(layout.at("expert_parallel"), 1);
  EXPECT_FALSE(layout.at("fits").get<bool>());
  // The table's memory, in whole bytes, is the figure submit sends and the coordinator judges by.
  EXPECT_EQ(std::ceil(layout.at("memory_bytes").at("total").get<double>()),
            plan.at("device_memory_needed_bytes").get<double>());
  EXPECT_GT(plan.at("device_memory_needed_bytes").get<int64_t>(), 2 * kGiB);
  EXPECT_FALSE(plan.at("device_memory_stated").get<bool>());

  // Nothing was submitted; a real submit is refused with the message the dry run predicted.
  EXPECT_TRUE(Jobs().empty());
  const std::string refusal = plan.at("refusal").get<std::string>();
  ASSERT_TRUE(Contains(refusal, "the largest of the 2 registered CUDA workers offers 2.00 GiB"))
      << refusal;
  const Finished submit = Moetrain(Args({"submit", spec}));
  EXPECT_EQ(submit.exit_code, 2) << submit.err;
  EXPECT_TRUE(Contains(submit.err, "FAILED_PRECONDITION")) << submit.err;
  EXPECT_TRUE(Contains(submit.err, refusal.substr(0, 150))) << submit.err;
  EXPECT_TRUE(Jobs().empty());
}

TEST_F(CliDryRunTest, SubmitFillsTheNeedFromThePlanAndTheCoordinatorRefusesIt) {
  RegisterGpuWorker("gpu-a", 1, 2 * kGiB);
  RegisterGpuWorker("gpu-b", 1, 2 * kGiB);
  const std::string spec = WriteSpec(kBigCudaSpec);
  // The plan's figure, as `moetrain plan --json` computes it for the spec's layout.
  const Finished planned = Moetrain(Args({"plan", spec, "--json"}, /*with_flags=*/false));
  ASSERT_EQ(planned.exit_code, 0) << planned.err;
  const std::vector<json> plans = JsonLines(planned.out);
  ASSERT_EQ(plans.size(), 1u) << planned.out;
  const auto need = static_cast<int64_t>(
      std::ceil(plans[0].at("layouts").at(0).at("memory_bytes").at("total").get<double>()));
  ASSERT_GT(need, 2 * kGiB);

  const Finished submit = Moetrain(Args({"submit", spec}));
  EXPECT_EQ(submit.exit_code, 2) << submit.err;
  // One line says what was planned, then the coordinator refuses the figure submit sent.
  EXPECT_TRUE(Contains(submit.err, "moetrain submit: planned device memory per rank: "))
      << submit.err;
  EXPECT_TRUE(Contains(submit.err, "FAILED_PRECONDITION")) << submit.err;
  EXPECT_TRUE(Contains(submit.err, absl::StrCat("of device memory per rank "
                                                "(resources.device_memory_bytes = ",
                                                need,
                                                "); the largest of the 2 registered CUDA "
                                                "workers offers 2.00 GiB a device")))
      << submit.err;
  EXPECT_TRUE(submit.out.empty()) << submit.out;
  EXPECT_TRUE(Jobs().empty());
}

TEST_F(CliDryRunTest, SubmitKeepsAStatedNeedAndSendsThePlannedOneOtherwise) {
  RegisterGpuWorker("gpu-small", 1, 2 * kGiB);
  // The spec says one rank fits in 1 GiB: kept, so the 2 GiB worker is enough.
  const std::string stated =
      WriteSpec(absl::StrCat(kBigCudaSpec, "  device_memory_bytes: ", kGiB, "\n"), "stated.yaml");
  const Finished dry = Moetrain(Args({"submit", "--dry-run", stated, "--json"}));
  EXPECT_EQ(dry.exit_code, 0) << dry.err;
  const std::vector<json> lines = JsonLines(dry.out);
  ASSERT_EQ(lines.size(), 1u) << dry.out;
  EXPECT_TRUE(lines[0].at("device_memory_stated").get<bool>());
  EXPECT_EQ(lines[0].at("device_memory_needed_bytes"), kGiB);
  EXPECT_TRUE(lines[0].at("accepted").get<bool>());

  const Finished submit = Moetrain(Args({"submit", stated, "--json"}));
  EXPECT_EQ(submit.exit_code, 0) << submit.err;
  EXPECT_FALSE(Contains(submit.err, "planned device memory")) << submit.err;
  json jobs = Jobs();
  ASSERT_EQ(jobs.size(), 1u);
  // The protobuf JSON mapping writes an int64 as a string.
  EXPECT_EQ(jobs[0].at("spec").at("resources").at("device_memory_bytes"), std::to_string(kGiB));

  // Without it, a worker large enough takes the planned figure, which the stored spec keeps.
  RegisterGpuWorker("gpu-large", 1, 1024 * kGiB);
  const Finished planned =
      Moetrain(Args({"submit", "--dry-run", WriteSpec(kBigCudaSpec), "--json"}));
  const std::vector<json> plan_lines = JsonLines(planned.out);
  ASSERT_EQ(plan_lines.size(), 1u) << planned.out;
  const int64_t need = plan_lines[0].at("device_memory_needed_bytes").get<int64_t>();
  EXPECT_FALSE(Submit(WriteSpec(kBigCudaSpec)).empty());
  jobs = Jobs();
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[1].at("spec").at("resources").at("device_memory_bytes"), std::to_string(need));
}

TEST_F(CliDryRunTest, SaysTheCoordinatorWouldAcceptWhenAWorkerOffersEnough) {
  RegisterGpuWorker("gpu-small", 1, 2 * kGiB);
  RegisterGpuWorker("gpu-large", 1, 1024 * kGiB);
  const std::string spec = WriteSpec(kBigCudaSpec);

  const Finished text = Moetrain(Args({"submit", "--dry-run", spec}));
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_TRUE(Contains(text.out, "2 CUDA workers registered, 2.00 GiB to 1.00 TiB each"))
      << text.out;
  EXPECT_TRUE(Contains(text.out, "the coordinator would accept it")) << text.out;
  EXPECT_TRUE(Contains(text.out, "1 of the 2 matching workers offer that much\n")) << text.out;

  const Finished document = Moetrain(Args({"submit", "--dry-run", spec, "--json"}));
  EXPECT_EQ(document.exit_code, 0) << document.err;
  const std::vector<json> lines = JsonLines(document.out);
  ASSERT_EQ(lines.size(), 1u) << document.out;
  EXPECT_TRUE(lines[0].at("accepted").get<bool>());
  EXPECT_TRUE(lines[0].at("refusal").is_null());
  EXPECT_EQ(lines[0].at("workers").at("enough_memory"), 1);
  EXPECT_TRUE(Jobs().empty());

  // And so it does.
  EXPECT_FALSE(Submit(spec).empty());
  EXPECT_EQ(Jobs().size(), 1u);
}

TEST_F(CliDryRunTest, CpuWorkersDoNotSayTheirMemoryAndACpuJobIsAccepted) {
  std::unique_ptr<TestWorker> worker = RegisterWorker("cpu-worker");
  ASSERT_NE(worker, nullptr);
  const std::string spec = WriteSpec(TinySpecYaml("tiny", 20));

  const Finished text = Moetrain(Args({"submit", "--dry-run", spec}));
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_TRUE(
      Contains(text.out, "1 CPU worker registered, device memory not advertised; the job needs 1"))
      << text.out;
  EXPECT_TRUE(Contains(text.out, "plan on cpu:")) << text.out;
  EXPECT_TRUE(Contains(text.out, "of host memory by the plan")) << text.out;
  EXPECT_TRUE(Jobs().empty());
}

TEST_F(CliDryRunTest, RefusesFollowAndABadSpecWithoutCallingTheCoordinator) {
  const std::string spec = WriteSpec(TinySpecYaml("tiny", 20));
  const Finished follow = Moetrain(Args({"submit", "--dry-run", "--follow", spec}));
  EXPECT_EQ(follow.exit_code, 2) << follow.err;
  EXPECT_TRUE(Contains(follow.err, "--dry-run")) << follow.err;

  const std::string bad = WriteSpec(TinySpecYaml("tiny", 20, "top_k: 9"), "bad.yaml");
  const Finished refused = Moetrain(Args({"submit", "--dry-run", bad}));
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_TRUE(Contains(refused.err, "model.moe.top_k")) << refused.err;
  EXPECT_TRUE(refused.out.empty()) << refused.out;
  EXPECT_TRUE(Jobs().empty());
}

}  // namespace
}  // namespace moetrain::testutil
