// The naming policy over every metric family the real coordinator registers (ServiceMetrics with
// the per-expert series, the gRPC interceptor's RPC metrics, the HTTP endpoint's own), checked
// here on its own rather than through the registry's checks at registration, so that a check
// weakened there still shows here.
#include <memory>
#include <regex>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "tests/testing/testing.h"

namespace moetrain::server {
namespace {

TEST(MetricNamesTest, EveryFamilyOfTheCoordinatorFollowsThePolicy) {
  testutil::TempDir dir("metric_names");
  CoordinatorServerOptions options;
  options.listen = "127.0.0.1:0";
  options.http_listen = "127.0.0.1:0";
  options.state_db = (dir.path() / "state.db").string();
  options.fleet.checkpoint_dir = (dir.path() / "checkpoints").string();
  options.metrics_per_expert = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CoordinatorServer> server,
                       CoordinatorServer::Start(options));

  // Lower snake case under the project's prefix, stricter than Prometheus asks.
  const std::regex name_pattern("moetrain_[a-z][a-z0-9_]*[a-z0-9]");
  const std::regex label_pattern("[a-z][a-z0-9_]*");
  // Base units only: seconds, bytes, ratios from 0 to 1.
  const std::regex other_unit(
      "_(ms|milliseconds|us|microseconds|ns|nanoseconds|minutes|hours|days|kb|kib|kilobytes|mb|"
      "mib|megabytes|gb|gib|gigabytes|bits|percent|percentage)(_|$)");
  std::set<std::string> names;
  for (const FamilyBase* family : server->metrics_registry().Families()) {
    const std::string& name = family->name();
    names.insert(name);
    EXPECT_TRUE(std::regex_match(name, name_pattern)) << name;
    EXPECT_EQ(absl::EndsWith(name, "_total"), family->type() == prometheus::MetricType::Counter)
        << name << ": _total on counters, and only on counters";
    EXPECT_FALSE(std::regex_search(name, other_unit)) << name << " is not in base units";
    for (const char* suffix : {"_bucket", "_count", "_sum"}) {
      EXPECT_FALSE(absl::EndsWith(name, suffix)) << name << " ends in a histogram series' suffix";
    }
    if (absl::StrContains(name, "duration") || absl::StrContains(name, "timestamp")) {
      EXPECT_TRUE(absl::EndsWith(name, "_seconds")) << name << " is a time, in seconds";
    }
    if (absl::StrContains(name, "memory")) {
      EXPECT_TRUE(absl::EndsWith(name, "_bytes")) << name << " is a size, in bytes";
    }
    for (const std::string& label : family->label_names()) {
      EXPECT_TRUE(std::regex_match(label, label_pattern)) << name << " label " << label;
      // Prometheus sets job and instance on every series it scrapes.
      EXPECT_NE(label, "job") << name;
      EXPECT_NE(label, "instance") << name;
    }
  }
  // Each part's families are there, so that the checks above ran over all of them.
  for (const char* part :
       {"moetrain_train_tokens_total", "moetrain_job_fp8_expert_amax",
        "moetrain_workers_lost_total", "moetrain_rpcs_total", "moetrain_rpc_duration_seconds",
        "moetrain_http_requests_total", "moetrain_up", "moetrain_readiness_state"}) {
    EXPECT_EQ(names.count(part), 1u) << part;
  }
  EXPECT_GE(names.size(), 35u);
}

}  // namespace
}  // namespace moetrain::server
