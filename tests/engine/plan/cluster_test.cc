#include "engine/plan/cluster.h"

#include <fstream>
#include <string>

#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

constexpr char kGood[] = R"(
name: test-node
gpus_per_node: 4
device:
  model: H200
  memory: 141GB
  dense_bf16_flops: 989e12
  dense_fp8_flops: 1979e12
  memory_bandwidth: 4.8TB/s
intra_node: {bandwidth: 450GB/s, latency: 5e-6}
inter_node: {bandwidth: 50GiB/s, latency: 1e-5}
efficiency: {dense_gemm: 0.7, grouped_gemm: 0.6, attention: 0.5, memory_bound: 1}
)";

// kGood with `from` replaced by `to` (which must occur).
std::string With(const std::string& from, const std::string& to) {
  EXPECT_NE(std::string(kGood).find(from), std::string::npos) << from;
  return absl::StrReplaceAll(kGood, {{from, to}});
}

TEST(ClusterTest, ParsesEveryField) {
  ASSERT_OK_AND_ASSIGN(ClusterSpec cluster, ParseClusterYaml(kGood));
  EXPECT_EQ(cluster.name, "test-node");
  EXPECT_EQ(cluster.gpus_per_node, 4);
  EXPECT_EQ(cluster.device.model, "H200");
  EXPECT_DOUBLE_EQ(cluster.device.memory_bytes, 141e9);
  EXPECT_DOUBLE_EQ(cluster.device.dense_bf16_flops, 989e12);
  EXPECT_DOUBLE_EQ(cluster.device.dense_fp8_flops, 1979e12);
  EXPECT_DOUBLE_EQ(cluster.device.memory_bandwidth_bytes_per_s, 4.8e12);
  EXPECT_DOUBLE_EQ(cluster.intra_node.bandwidth_bytes_per_s, 450e9);
  EXPECT_DOUBLE_EQ(cluster.intra_node.latency_s, 5e-6);
  EXPECT_DOUBLE_EQ(cluster.inter_node.bandwidth_bytes_per_s, 50.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(cluster.inter_node.latency_s, 1e-5);
  EXPECT_DOUBLE_EQ(cluster.efficiency.dense_gemm, 0.7);
  EXPECT_DOUBLE_EQ(cluster.efficiency.grouped_gemm, 0.6);
  EXPECT_DOUBLE_EQ(cluster.efficiency.attention, 0.5);
  EXPECT_DOUBLE_EQ(cluster.efficiency.memory_bound, 1.0);
}

TEST(ClusterTest, ErrorsNameTheFieldAndValue) {
  struct Case {
    std::string yaml, message;
  };
  const Case cases[] = {
      {With("gpus_per_node: 4", "gpus_per_node: 2.5"), "gpus_per_node = '2.5'"},
      {With("gpus_per_node: 4", "gpus_per_node: 0"), "gpus_per_node = '0'"},
      {With("memory: 141GB", "memory: 141XB"), "device.memory = '141XB'"},
      {With("memory: 141GB", "memory: -1GB"), "device.memory = '-1GB'"},
      {With("dense_bf16_flops: 989e12", "dense_bf16_flops: fast"),
       "device.dense_bf16_flops = 'fast'"},
      {With("dense_fp8_flops: 1979e12", "dense_fp8_flops: 0"), "device.dense_fp8_flops = '0'"},
      {With("memory_bandwidth: 4.8TB/s", "memory_bandwidth: 4.8TB/h"),
       "device.memory_bandwidth = '4.8TB/h'"},
      {With("bandwidth: 450GB/s", "bandwidth: x"), "intra_node.bandwidth = 'x'"},
      {With("latency: 1e-5", "latency: -1"), "inter_node.latency = '-1'"},
      {With("dense_gemm: 0.7", "dense_gemm: 1.5"), "efficiency.dense_gemm = '1.5'"},
      {With("grouped_gemm: 0.6", "grouped_gemm: 0"), "efficiency.grouped_gemm = '0'"},
      {With("attention: 0.5", "attention: a"), "efficiency.attention = 'a'"},
      {With("memory_bound: 1", "memory_bound: 2"), "efficiency.memory_bound = '2'"},
      {With("name: test-node\n", ""), "name is missing"},
      {With("  model: H200\n", ""), "device.model is missing"},
      {With("gpus_per_node: 4", "gpus_per_node: 4\ngpus: 8"), "unknown key gpus"},
      {With("model: H200", "model: H200\n  tflops: 1"), "unknown key device.tflops"},
      {With("latency: 5e-6}", "latency: 5e-6, mtu: 9000}"), "unknown key intra_node.mtu"},
      {With("memory_bound: 1}", "memory_bound: 1, softmax: 1}"), "unknown key efficiency.softmax"},
      {"[1, 2]", "cluster must be a mapping"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ClusterSpec> cluster = ParseClusterYaml(c.yaml);
    ASSERT_FALSE(cluster.ok()) << c.yaml;
    EXPECT_EQ(cluster.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(cluster.status().message().find(c.message), std::string::npos)
        << cluster.status().message() << " does not name: " << c.message;
  }
}

TEST(ClusterTest, ParsesByteSizes) {
  EXPECT_DOUBLE_EQ(ParseBytes("4096", "f", false).value(), 4096);
  EXPECT_DOUBLE_EQ(ParseBytes("80GiB", "f", false).value(), 80.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(ParseBytes("1.5KB", "f", false).value(), 1500);
  EXPECT_DOUBLE_EQ(ParseBytes("900GB/s", "f", true).value(), 900e9);
  EXPECT_DOUBLE_EQ(ParseBytes("1e9", "f", true).value(), 1e9);
  // "/s" is for rates only, and a size needs a number.
  EXPECT_FALSE(ParseBytes("900GB/s", "f", false).ok());
  EXPECT_FALSE(ParseBytes("GB", "f", false).ok());
  EXPECT_FALSE(ParseBytes("0", "f", false).ok());
}

TEST(ClusterTest, PresetsLoad) {
  for (const std::string& name : ClusterPresetNames()) {
    ASSERT_OK_AND_ASSIGN(ClusterSpec cluster, LoadCluster(name));
    EXPECT_EQ(cluster.name, name);
    EXPECT_GT(cluster.gpus_per_node, 0);
    EXPECT_GT(cluster.device.memory_bytes, 0);
    EXPECT_GT(cluster.device.dense_bf16_flops, 0);
    EXPECT_GT(cluster.intra_node.bandwidth_bytes_per_s, 0);
    EXPECT_GT(cluster.efficiency.grouped_gemm, 0);
    EXPECT_LE(cluster.efficiency.grouped_gemm, 1);
  }
  ASSERT_OK_AND_ASSIGN(ClusterSpec h200, ClusterPreset("h200-node"));
  EXPECT_EQ(h200.gpus_per_node, 8);
  EXPECT_DOUBLE_EQ(h200.device.memory_bytes, 141e9);
  EXPECT_DOUBLE_EQ(h200.intra_node.bandwidth_bytes_per_s, 450e9);
  EXPECT_DOUBLE_EQ(h200.inter_node.bandwidth_bytes_per_s, 50e9);
  ASSERT_OK_AND_ASSIGN(ClusterSpec h100, ClusterPreset("h100-node"));
  EXPECT_DOUBLE_EQ(h100.device.memory_bytes, 80e9);

  absl::StatusOr<ClusterSpec> nope = LoadCluster("nope");
  EXPECT_EQ(nope.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(nope.status().message().find("--cluster = 'nope'"), std::string::npos);
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::trunc);
  file << text;
  ASSERT_TRUE(file.good()) << path;
}

TEST(ClusterTest, LoadsAFile) {
  testutil::TempDir dir("cluster_test");
  const std::string path = (dir.path() / "cluster.yaml").string();
  Write(path, kGood);
  ASSERT_OK_AND_ASSIGN(ClusterSpec cluster, LoadCluster(path));
  EXPECT_EQ(cluster.name, "test-node");
  Write(path, With("latency: 1e-5", "latency: slow"));
  absl::StatusOr<ClusterSpec> bad = LoadCluster(path);
  EXPECT_NE(bad.status().message().find(path + ": inter_node.latency = 'slow'"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace moetrain
