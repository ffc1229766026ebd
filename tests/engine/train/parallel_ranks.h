// The processes of a parallel training job in tests: one parallel_train_rank per rank
// (MOETRAIN_PARALLEL_TRAIN_RANK, Gloo over 127.0.0.1 through a FileKeyValueStore), their JSON
// output lines, and the checkpoints they write. Shared by parallel_training_test and
// sharded_training_test.
#ifndef MOETRAIN_TESTS_ENGINE_TRAIN_PARALLEL_RANKS_H_
#define MOETRAIN_TESTS_ENGINE_TRAIN_PARALLEL_RANKS_H_

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/train/checkpoint.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/child_process.h"
#include "tests/testing/testing.h"

namespace moetrain::parallel_test {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testutil::Child;
using testutil::Finished;

inline constexpr auto kRunTimeout = std::chrono::seconds(120);

// The dp × ep processes of one launch of the job.
class Ranks {
 public:
  Ranks(int dp, int ep) : dp_(dp), ep_(ep) {}

  // Starts every rank with the job's checkpoint directory and `extra` flags. Each launch meets in
  // a store directory of its own: a second launch must not find the first one's addresses.
  void Start(const fs::path& dir, const std::vector<std::string>& extra) {
    static int launches = 0;
    const fs::path store = dir / absl::StrCat("kv-", launches++);
    for (int rank = 0; rank < dp_ * ep_; ++rank) {
      children_.push_back(std::make_unique<Child>(fs::path(MOETRAIN_PARALLEL_TRAIN_RANK)));
      std::vector<std::string> args = {"--rank",
                                       std::to_string(rank),
                                       "--dp",
                                       std::to_string(dp_),
                                       "--ep",
                                       std::to_string(ep_),
                                       "--store",
                                       store.string(),
                                       "--checkpoint-dir",
                                       (dir / "checkpoints").string()};
      args.insert(args.end(), extra.begin(), extra.end());
      // One thread each: idle OpenMP threads spin, and the ranks share two cores.
      ASSERT_EQ(children_.back()->Start(args, dir,
                                        {{"MOETRAIN_NUM_THREADS", "1"}, {"OMP_NUM_THREADS", "1"}}),
                "");
    }
  }

  // Waits for every rank; each must exit with `exit_code`.
  std::vector<Finished> Wait(int exit_code = 0) {
    std::vector<Finished> finished;
    for (auto& child : children_) {
      finished.push_back(child->Wait(kRunTimeout));
      const Finished& f = finished.back();
      EXPECT_FALSE(f.timed_out) << "rank " << finished.size() - 1 << " hangs: " << f.out;
      EXPECT_EQ(f.exit_code, exit_code) << "rank " << finished.size() - 1 << ": " << f.out << f.err;
    }
    children_.clear();
    return finished;
  }

  // Waits until every rank has printed a line containing `text`, then kills them all (SIGKILL).
  void KillAfter(const std::string& text) {
    for (auto& child : children_) {
      EXPECT_TRUE(child->WaitForStdout(
          [&](const std::string& out) { return out.find(text) != std::string::npos; }, kRunTimeout))
          << child->out() << child->err();
    }
    for (auto& child : children_) child->Signal(SIGKILL);
    for (auto& child : children_) child->Wait(kRunTimeout);
    children_.clear();
  }

 private:
  const int dp_, ep_;
  std::vector<std::unique_ptr<Child>> children_;
};

// One launch to the end; every rank's output lines.
inline std::vector<std::vector<Json>> RunJob(int dp, int ep, const fs::path& dir,
                                      const std::vector<std::string>& extra = {},
                                      int exit_code = 0) {
  Ranks ranks(dp, ep);
  ranks.Start(dir, extra);
  std::vector<std::vector<Json>> lines;
  for (const Finished& f : ranks.Wait(exit_code)) lines.push_back(testutil::JsonLines(f.out));
  return lines;
}

// The step lines of one rank's output, by step.
inline std::map<int64_t, Json> Steps(const std::vector<Json>& lines) {
  std::map<int64_t, Json> steps;
  for (const Json& line : lines) {
    if (line.contains("loss")) steps[line["step"].get<int64_t>()] = line;
  }
  return steps;
}

inline double Number(const Json& line, const char* key) { return std::stod(line[key].get<std::string>()); }

// The tensors of every rank file of a run's step-`step` checkpoint.
inline LoadedCheckpoint CheckpointTensors(const fs::path& dir, int ep, int64_t step) {
  CheckpointReadOptions all{.ranks = {}};
  for (int rank = 0; rank < ep; ++rank) all.ranks.push_back(rank);
  absl::StatusOr<LoadedCheckpoint> loaded =
      LoadCheckpoint((dir / "checkpoints/parallel" / CheckpointStepDirName(step)).string(), all);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? *std::move(loaded) : LoadedCheckpoint();
}

inline void ExpectSameBits(const std::map<std::string, Tensor>& want,
                    const std::map<std::string, Tensor>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, tensor] : want) {
    ASSERT_TRUE(got.contains(name)) << name;
    const Tensor& other = got.at(name);
    ASSERT_EQ(tensor.numel(), other.numel()) << name;
    EXPECT_EQ(std::memcmp(tensor.view().raw(), other.view().raw(),
                          tensor.numel() * DTypeSize(tensor.dtype())),
              0)
        << name;
  }
}

}  // namespace moetrain::parallel_test

#endif  // MOETRAIN_TESTS_ENGINE_TRAIN_PARALLEL_RANKS_H_
