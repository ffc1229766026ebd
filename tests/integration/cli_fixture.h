// What the tests that drive the real `moetrain` binary share (cli_test.cc, cli_eval_test.cc): a
// fresh directory per test, the binary's path, one thread for the child unless the caller
// chose, and readers of its JSON lines, step directories and safetensors headers.
#ifndef MOETRAIN_TESTS_INTEGRATION_CLI_FIXTURE_H_
#define MOETRAIN_TESTS_INTEGRATION_CLI_FIXTURE_H_

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/transformer.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/train/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/child_process.h"
#include "tests/integration/tiny_spec.h"
#include "tests/testing/testing.h"

namespace moetrain::cli_testing {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::seconds;
using testutil::Child;
using testutil::EnvChanges;
using testutil::Finished;
using testutil::JsonLines;
using testutil::TinySpec;

// A normal run of the tiny spec takes a second or two; this only catches a hang.
inline constexpr seconds kRunTimeout{60};

inline fs::path MoetrainBinary() { return fs::path(MOETRAIN_BIN_DIR) / "moetrain"; }

// One thread unless the caller chose (the engine's pool and oneDNN's): the model is tiny, and on a
// loaded machine spinning OpenMP workers turn a one-second run into tens of seconds. Results
// depend on the thread count, but every run of a test uses the same.
inline EnvChanges OneThreadUnlessChosen() {
  EnvChanges env;
  for (const char* name : {"MOETRAIN_NUM_THREADS", "OMP_NUM_THREADS"}) {
    if (getenv(name) == nullptr) env[name] = "1";
  }
  return env;
}

inline bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

inline std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

inline void WriteFile(const fs::path& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

inline bool IsStepLine(const json& line) {
  return line.contains("loss") && !line.contains("summary");
}

// The step lines of a --json run, by step; a step printed twice fails the test.
inline std::map<int64_t, json> StepLines(const std::vector<json>& lines) {
  std::map<int64_t, json> steps;
  for (const json& line : lines) {
    if (!IsStepLine(line)) continue;
    const int64_t step = line.at("step").get<int64_t>();
    EXPECT_TRUE(steps.emplace(step, line).second) << "step " << step << " printed twice";
  }
  return steps;
}

inline int CountStepLines(const std::string& out) {
  int count = 0;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) count += Contains(line, "\"loss\":");
  return count;
}

inline std::string StepDirName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

// The names of the entries of `dir`, sorted; empty when it does not exist.
inline std::set<std::string> Entries(const fs::path& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// Every regular file under `dir` (relative path) with its contents.
inline std::map<std::string, std::string> Snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) {
      files[fs::relative(entry.path(), dir).string()] = ReadFile(entry.path());
    }
  }
  return files;
}

// The JSON header of a safetensors file (8-byte little-endian length, then the header), checked
// against the file: every tensor F32 with offsets inside the data section that match its shape,
// and the data section ending where the file ends.
inline json SafetensorsHeader(const fs::path& path) {
  const std::string bytes = ReadFile(path);
  EXPECT_GE(bytes.size(), 8u) << path;
  if (bytes.size() < 8) return json();
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | static_cast<unsigned char>(bytes[i]);
  EXPECT_LE(8 + header_len, bytes.size()) << path;
  if (8 + header_len > bytes.size()) return json();
  json header = json::parse(bytes.substr(8, header_len), nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(header.is_object()) << path << ": header is not a JSON object";
  if (!header.is_object()) return json();
  const uint64_t data_bytes = bytes.size() - 8 - header_len;
  uint64_t data_end = 0;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    EXPECT_EQ(info.value("dtype", ""), "F32") << name;
    uint64_t numel = 1;
    for (const json& d : info.at("shape")) numel *= d.get<uint64_t>();
    const uint64_t begin = info.at("data_offsets").at(0).get<uint64_t>();
    const uint64_t end = info.at("data_offsets").at(1).get<uint64_t>();
    EXPECT_EQ(end - begin, 4 * numel) << name;
    EXPECT_LE(end, data_bytes) << name;
    data_end = std::max(data_end, end);
  }
  EXPECT_EQ(data_end, data_bytes) << path << ": data section has trailing bytes";
  return header;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(MoetrainBinary())) << MoetrainBinary() << " is not built";
  }

  // Writes `spec` as <dir>/<file> and returns its path.
  std::string WriteSpec(const TinySpec& spec, const std::string& file = "spec.yaml") {
    const fs::path path = dir_ / file;
    WriteFile(path, spec.Yaml());
    return path.string();
  }

  // Runs `moetrain args...` in the test directory to the end (or kills it past `timeout`).
  Finished Moetrain(const std::vector<std::string>& args, Clock::duration timeout = kRunTimeout) {
    Child child(MoetrainBinary());
    const std::string error = child.Start(args, dir_, OneThreadUnlessChosen());
    if (!error.empty()) {
      ADD_FAILURE() << "cannot start moetrain: " << error;
      return Finished();
    }
    Finished result = child.Wait(timeout);
    EXPECT_FALSE(result.timed_out) << "moetrain hung and was killed; stderr:\n" << result.err;
    return result;
  }

  // `moetrain run spec --checkpoint-dir checkpoint_dir --json` plus `extra`, expected to succeed.
  Finished RunOk(const std::string& spec, const fs::path& checkpoint_dir,
                 const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"run", spec, "--checkpoint-dir", checkpoint_dir.string(),
                                     "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    Finished result = Moetrain(args);
    EXPECT_EQ(result.exit_code, 0) << "stderr:\n" << result.err;
    return result;
  }

  const testutil::TempDir temp_dir_{"moetrain_cli"};
  const fs::path dir_ = temp_dir_.path();
};

}  // namespace moetrain::cli_testing

#endif  // MOETRAIN_TESTS_INTEGRATION_CLI_FIXTURE_H_
