// What the communicator tests share: ranks run as threads of the test
// process (each with its own Gloo communicator over TCP loopback), and a guard that turns a hang
// into a failure.
#ifndef MOETRAIN_TESTS_ENGINE_COMM_COMM_TEST_UTIL_H_
#define MOETRAIN_TESTS_ENGINE_COMM_COMM_TEST_UTIL_H_

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/comm/file_kv_store.h"
#include "engine/comm/gloo_communicator.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace moetrain::comm_test {

// Runs body(rank) for every rank on a thread of its own and waits for all of them; aborts the
// test binary when they have not finished within `limit`, so a deadlock fails at once with a
// message instead of at the ctest timeout.
inline void RunRanks(int size, const std::function<void(int rank)>& body,
                     std::chrono::seconds limit = std::chrono::seconds(60)) {
  std::vector<std::future<void>> done;
  for (int rank = 0; rank < size; ++rank) {
    done.push_back(std::async(std::launch::async, body, rank));
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (std::future<void>& rank_done : done) {
    if (rank_done.wait_until(deadline) != std::future_status::ready) {
      std::fprintf(stderr, "ranks did not finish within %lld s: a collective hangs\n",
                   static_cast<long long>(limit.count()));
      std::abort();
    }
    rank_done.get();
  }
}

// Options for rank `rank` of `size` meeting in `store` under `prefix`.
inline GlooOptions Gloo(std::shared_ptr<KeyValueStore> store, int rank, int size,
                        absl::Duration timeout = absl::Seconds(20),
                        const std::string& prefix = "world") {
  GlooOptions options;
  options.group.store = std::move(store);
  options.group.prefix = prefix;
  options.group.rank = rank;
  options.group.size = size;
  options.group.timeout = timeout;
  return options;
}

// `size` Gloo communicators of one group, connected (each rank joins from a thread of its own,
// as separate processes would). Fails the test (and returns an empty vector) if one cannot join.
inline std::vector<std::unique_ptr<GlooCommunicator>> MakeGlooWorld(
    const std::filesystem::path& dir, int size, absl::Duration timeout = absl::Seconds(20)) {
  absl::StatusOr<std::shared_ptr<FileKeyValueStore>> store = FileKeyValueStore::Open(dir / "kv");
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return {};
  std::vector<std::unique_ptr<GlooCommunicator>> world(size);
  std::vector<absl::Status> statuses(size);
  RunRanks(size, [&](int rank) {
    absl::StatusOr<std::unique_ptr<GlooCommunicator>> comm =
        GlooCommunicator::Create(Gloo(*store, rank, size, timeout));
    statuses[rank] = comm.status();
    if (comm.ok()) world[rank] = *std::move(comm);
  });
  for (int rank = 0; rank < size; ++rank) {
    EXPECT_TRUE(statuses[rank].ok()) << "rank " << rank << ": " << statuses[rank];
    if (!statuses[rank].ok()) return {};
  }
  return world;
}

}  // namespace moetrain::comm_test

#endif  // MOETRAIN_TESTS_ENGINE_COMM_COMM_TEST_UTIL_H_
