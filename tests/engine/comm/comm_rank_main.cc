// One rank of a Gloo group as a process of its own, for the tests that kill a rank:
//
//   comm_rank_main DIR RANK SIZE TIMEOUT_MS
//
// Joins the group through a FileKeyValueStore in DIR/kv, passes a barrier, prints "ready", waits
// for the file DIR/go, then all-reduces until a collective fails. Prints "failed: <code>:
// <message>" and exits 0 when one fails (what the test expects once a peer is gone), "completed"
// and exits 1 when none does, "setup failed: ..." and exits 2 when it cannot join.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/comm/file_kv_store.h"
#include "engine/comm/gloo_communicator.h"

namespace {

int Fail(const char* stage, const absl::Status& status) {
  std::printf("%s: %s: %s\n", stage, absl::StatusCodeToString(status.code()).c_str(),
              std::string(status.message()).c_str());
  std::fflush(stdout);
  return std::string(stage) == "failed" ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s DIR RANK SIZE TIMEOUT_MS\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  auto store = moetrain::FileKeyValueStore::Open(dir / "kv");
  if (!store.ok()) return Fail("setup failed", store.status());
  moetrain::GlooOptions options;
  options.group.store = *store;
  options.group.rank = std::atoi(argv[2]);
  options.group.size = std::atoi(argv[3]);
  options.group.timeout = absl::Milliseconds(std::atoi(argv[4]));
  auto comm = moetrain::GlooCommunicator::Create(options);
  if (!comm.ok()) return Fail("setup failed", comm.status());
  if (absl::Status status = (*comm)->Barrier(); !status.ok()) return Fail("setup failed", status);
  std::printf("ready\n");
  std::fflush(stdout);

  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(dir / "go")) {
    if (std::chrono::steady_clock::now() > give_up) {
      return Fail("setup failed", absl::DeadlineExceededError("no go file"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::vector<float> data(1000, 1.0f);
  for (int round = 0; round < 1000; ++round) {
    absl::Status status = (*comm)->AllReduceSum(data.data(), 1000, moetrain::DType::kF32);
    if (!status.ok()) return Fail("failed", status);
  }
  std::printf("completed\n");
  return 1;
}
