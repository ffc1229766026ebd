// `moetrain-worker --metrics-listen`, with real processes on 127.0.0.1: two workers, each serving
// its own /metrics on a free port, train a two-rank expert-parallel job of a real coordinator; each
// worker's text then passes `promtool check metrics` and shows its rank's step phases, its
// communication and its memory with sane values. A bad or taken address is a usage error.
#include <algorithm>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/service_test_util.h"
#include "tests/testing/exposition.h"
#include "tests/testing/testing.h"

namespace moetrain::testutil {
namespace {

using ::testing::HasSubstr;

class WorkerMetricsTest : public ServiceTest {
 protected:
  // The port of `name`'s metrics endpoint, from its log line.
  int MetricsPort(const std::string& name) {
    const std::regex serving(R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)");
    std::smatch match;
    std::string log;
    const bool found = WaitUntil(
        [&] {
          log = workers_.at(name)->Log();
          return std::regex_search(log, match, serving);
        },
        std::chrono::seconds(30));
    EXPECT_TRUE(found) << "worker " << name << " did not say its metrics port:\n" << log;
    return found ? std::stoi(match[1]) : 0;
  }
};

TEST_F(WorkerMetricsTest, EachWorkerServesItsRanksPhasesCommunicationAndMemory) {
  StartCoordinator();
  for (const std::string name : {"a", "b"}) {
    StartWorker(name, {"--comm-timeout", "20s", "--metrics-listen", "127.0.0.1:0"});
  }
  const int ports[] = {MetricsPort("a"), MetricsPort("b")};
  ASSERT_GT(ports[0], 0);
  ASSERT_GT(ports[1], 0);
  ASSERT_NE(ports[0], ports[1]);

  // Before any job: the memory of the CPU, and no rank's series yet.
  {
    httplib::Client client("127.0.0.1", ports[0]);
    auto health = client.Get("/healthz");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
    auto scraped = client.Get("/metrics");
    ASSERT_TRUE(scraped);
    ASSERT_EQ(scraped->status, 200);
    EXPECT_THAT(scraped->get_header_value("Content-Type"), HasSubstr("version=0.0.4"));
    EXPECT_THAT(scraped->body, HasSubstr("moetrain_worker_device_memory_used_bytes{"));
    EXPECT_THAT(scraped->body, ::testing::Not(HasSubstr("moetrain_worker_comm_sent_bytes_total{")));
  }

  TinySpec job = ServiceSpec("metered");
  job.workers = 2;
  job.expert_parallel = 2;
  job.steps = 12;
  job.checkpoint_every = 6;
  const std::string id = Submit(job);
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED, std::chrono::seconds(180)))
      << coordinator_->Log() << workers_.at("a")->Log() << workers_.at("b")->Log();

  std::vector<std::string> ranks_seen;
  for (int port : ports) {
    SCOPED_TRACE(port);
    httplib::Client client("127.0.0.1", port);
    auto scraped = client.Get("/metrics");
    ASSERT_TRUE(scraped);
    ASSERT_EQ(scraped->status, 200);
    const std::string& text = scraped->body;
    ASSERT_OK_AND_ASSIGN(const PromtoolResult promtool, PromtoolCheckMetrics(text));
    EXPECT_EQ(promtool.exit_code, 0) << promtool.output << "\n" << text;
    const Exposition parsed = MustParseExposition(text);
    // The value of the one series `name` with exactly `labels`; -1 (a failure) when it is absent.
    auto value = [&](const std::string& name, const ExpositionLabels& labels) {
      const std::optional<double> found = parsed.Value(name, labels);
      EXPECT_TRUE(found.has_value()) << name << " with the given labels";
      return found.value_or(-1);
    };

    // This worker's rank: the one rank label its phase series carry.
    std::string rank;
    for (const ExpositionSample& sample : parsed.samples) {
      if (sample.name == "moetrain_worker_step_phase_duration_seconds_count") {
        EXPECT_EQ(sample.labels.at("job_id"), id);
        if (rank.empty()) rank = sample.labels.at("rank");
        EXPECT_EQ(sample.labels.at("rank"), rank) << "one rank per worker";
      }
    }
    ASSERT_FALSE(rank.empty()) << text;
    ranks_seen.push_back(rank);
    const ExpositionLabels of_rank = {{"job_id", id}, {"rank", rank}};

    // Every phase of every step, each taking some time.
    for (const std::string phase : {"forward", "backward", "communication", "optimizer"}) {
      ExpositionLabels labels = of_rank;
      labels["phase"] = phase;
      EXPECT_EQ(value("moetrain_worker_step_phase_duration_seconds_count", labels), job.steps)
          << phase;
      const double seconds = value("moetrain_worker_step_phase_duration_seconds_sum", labels);
      EXPECT_GT(seconds, 0.0) << phase;
      EXPECT_LT(seconds, 120.0) << phase;
    }

    // Two expert ranks exchange tokens (all-to-all) and sum the dense gradients and the step's
    // statistics (all-reduce): bytes both ways, and time spent.
    for (const std::string op : {"all_to_all", "all_reduce"}) {
      ExpositionLabels labels = of_rank;
      labels["op"] = op;
      EXPECT_GT(value("moetrain_worker_comm_sent_bytes_total", labels), 0.0) << op;
      EXPECT_GT(value("moetrain_worker_comm_received_bytes_total", labels), 0.0) << op;
      EXPECT_GT(value("moetrain_worker_comm_seconds_total", labels), 0.0) << op;
    }
    // The model's all-to-all moves the same tokens out and back on each of two ranks: what one
    // rank sends over a step is of the order of what it receives.
    ExpositionLabels all_to_all = of_rank;
    all_to_all["op"] = "all_to_all";
    const double sent = value("moetrain_worker_comm_sent_bytes_total", all_to_all);
    const double received = value("moetrain_worker_comm_received_bytes_total", all_to_all);
    EXPECT_LT(sent, 10 * received);
    EXPECT_LT(received, 10 * sent);

    // The CPU: this process's resident memory, below its peak, below the machine's memory.
    const double used = value("moetrain_worker_device_memory_used_bytes", {{"device", "cpu"}});
    const double peak = value("moetrain_worker_device_memory_peak_bytes", {{"device", "cpu"}});
    const double capacity =
        value("moetrain_worker_device_memory_capacity_bytes", {{"device", "cpu"}});
    EXPECT_GT(used, 1 << 20);
    EXPECT_GE(peak, used);
    EXPECT_GT(capacity, peak);
  }
  std::sort(ranks_seen.begin(), ranks_seen.end());
  EXPECT_EQ(ranks_seen, (std::vector<std::string>{"0", "1"}));
}

TEST_F(WorkerMetricsTest, ABadOrTakenAddressIsAUsageError) {
  StartCoordinator();
  struct Case {
    std::string address;
    std::string error;
  };
  const Case cases[] = {
      {"nope", "--metrics-listen = 'nope' is not host:port with a port in [0, 65535]"},
      {"127.0.0.1:70000", "--metrics-listen = '127.0.0.1:70000' is not host:port"},
      // The coordinator's HTTP port is taken.
      {absl::StrCat("127.0.0.1:", http_port_),
       absl::StrCat("--metrics-listen = '127.0.0.1:", http_port_, "': ")},
  };
  for (const Case& bad : cases) {
    Child worker(Binary("moetrain-worker"));
    ASSERT_EQ(worker.Start({"--coordinator", address(), "--token-file", (dir_ / "token").string(),
                            "--metrics-listen", bad.address},
                           dir_),
              "");
    const Finished finished = worker.Wait(std::chrono::seconds(60));
    EXPECT_EQ(finished.exit_code, 2) << bad.address << ": " << finished.err;
    EXPECT_THAT(finished.err, HasSubstr(bad.error));
  }
}

}  // namespace
}  // namespace moetrain::testutil
