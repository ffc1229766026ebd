#include "engine/comm/nccl_communicator.h"

#ifndef MOETRAIN_HAVE_NCCL

namespace moetrain {

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& options) {
  return absl::UnimplementedError(
      "NCCL communicator: this build has no NCCL (built without CUDA, or NCCL was not found)");
}

bool NcclCommunicatorBuilt() { return false; }

}  // namespace moetrain

#else  // MOETRAIN_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/comm/comm_checks.h"
#include "engine/comm/nccl_group.h"
#include "engine/core/status.h"

namespace moetrain {
namespace {

// Every CUDA call is checked; a failure names the call.
#ifndef MOETRAIN_CUDA_RETURN_IF_ERROR
#define MOETRAIN_CUDA_RETURN_IF_ERROR(expr) MOETRAIN_RETURN_IF_ERROR(CudaStatus((expr), #expr))
#endif

// NCCL's type for a summable dtype (f32, bf16, i32, i64: the checks allow no other).
ncclDataType_t SumType(DType dtype) {
  return dtype == DType::kF32    ? ncclFloat32
         : dtype == DType::kBF16 ? ncclBfloat16
         : dtype == DType::kI32  ? ncclInt32
                                 : ncclInt64;
}

// Whether every rank's block has the same length (NCCL's own reduce-scatter and all-gather).
bool EqualBlocks(const std::vector<int64_t>& blocks) {
  return std::all_of(blocks.begin(), blocks.end(), [&](int64_t c) { return c == blocks[0]; });
}

// call(root, start of root's block, its elements) for every rank's non-empty block of the buffer at
// `base` (elements of `element` bytes, laid out rank by rank), inside one NCCL group: a collective
// per block, rooted at the block's rank.
template <typename Call>
absl::Status PerBlockInGroup(ncclComm_t comm, const std::vector<int64_t>& blocks, size_t element,
                             char* base, Call call) {
  MOETRAIN_RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "ncclGroupStart", comm));
  absl::Status status;
  size_t offset = 0;
  for (int root = 0; root < static_cast<int>(blocks.size()) && status.ok(); ++root) {
    if (blocks[root] > 0) status = call(root, base + offset, blocks[root]);
    offset += blocks[root] * element;
  }
  // The group must be closed even when a call inside it failed.
  const absl::Status ended = NcclStatus(ncclGroupEnd(), "ncclGroupEnd", comm);
  return status.ok() ? ended : status;
}

class NcclRequest final : public CommRequest {
 public:
  NcclRequest(std::shared_ptr<NcclGroup> group, std::string what, NcclEnqueued enqueued,
              absl::Time deadline)
      : group_(std::move(group)),
        what_(std::move(what)),
        enqueued_(std::move(enqueued)),
        deadline_(deadline) {}
  // The buffers (and the staging) must outlive the collective: one never waited for is waited
  // for here, at most until its deadline.
  ~NcclRequest() override { Wait().IgnoreError(); }

  absl::Status Wait() override {
    absl::MutexLock lock(&mu_);
    if (done_) return status_;
    status_ = group_->Complete(enqueued_, deadline_, what_);
    done_ = true;
    return status_;
  }

 private:
  const std::shared_ptr<NcclGroup> group_;
  const std::string what_;
  absl::Mutex mu_;
  NcclEnqueued enqueued_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  const absl::Time deadline_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclGroup> group, NcclOptions options)
      : group_(std::move(group)), options_(std::move(options)) {}

  int rank() const override { return options_.group.rank; }
  int size() const override { return options_.group.size; }
  std::string backend() const override { return "nccl"; }
  bool orders_after_device_work() const override { return options_.order_after_stream != nullptr; }

  absl::StatusOr<std::unique_ptr<CommRequest>> StartAllToAllV(const AllToAllVArgs& args) override {
    MOETRAIN_RETURN_IF_ERROR(CheckAllToAllV(Op("all_to_all_v"), args));
    const size_t element = DTypeSize(args.dtype);
    std::vector<size_t> send_offsets(size()), recv_offsets(size());
    for (int r = 1; r < size(); ++r) {
      send_offsets[r] = send_offsets[r - 1] + args.send_counts[r - 1] * element;
      recv_offsets[r] = recv_offsets[r - 1] + args.recv_counts[r - 1] * element;
    }
    const size_t send_bytes = send_offsets[size() - 1] + args.send_counts[size() - 1] * element;
    const size_t recv_bytes = recv_offsets[size() - 1] + args.recv_counts[size() - 1] * element;
    const NcclBuffer buffers[] = {{.data = args.send, .bytes = send_bytes, .read = true},
                                  {.data = args.recv, .bytes = recv_bytes, .written = true}};
    return Launch(
        "all_to_all_v", buffers,
        [&](ncclComm_t comm, cudaStream_t stream, absl::Span<void* const> device) -> absl::Status {
          const auto* send = static_cast<const char*>(device[0]);
          auto* recv = static_cast<char*>(device[1]);
          // This rank's own chunk is a copy; peers with nothing to exchange are left out.
          if (const size_t own = args.send_counts[rank()] * element; own > 0) {
            MOETRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(recv + recv_offsets[rank()],
                                                          send + send_offsets[rank()], own,
                                                          cudaMemcpyDeviceToDevice, stream));
          }
          MOETRAIN_RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "ncclGroupStart", comm));
          absl::Status status;
          for (int peer = 0; peer < size() && status.ok(); ++peer) {
            if (peer == rank()) continue;
            if (const size_t bytes = args.send_counts[peer] * element; bytes > 0) {
              status = NcclStatus(
                  ncclSend(send + send_offsets[peer], bytes, ncclUint8, peer, comm, stream),
                  "ncclSend", comm);
            }
            if (const size_t bytes = args.recv_counts[peer] * element; bytes > 0 && status.ok()) {
              status = NcclStatus(
                  ncclRecv(recv + recv_offsets[peer], bytes, ncclUint8, peer, comm, stream),
                  "ncclRecv", comm);
            }
          }
          // The group must be closed even when a call inside it failed.
          const absl::Status ended = NcclStatus(ncclGroupEnd(), "ncclGroupEnd", comm);
          return status.ok() ? ended : status;
        });
  }

  absl::StatusOr<std::unique_ptr<CommRequest>> StartAllReduceSum(void* data, int64_t count,
                                                                 DType dtype) override {
    MOETRAIN_RETURN_IF_ERROR(CheckAllReduceSum(Op("all_reduce_sum"), data, count, dtype));
    const ncclDataType_t type = SumType(dtype);
    const NcclBuffer buffers[] = {{.data = data,
                                   .bytes = static_cast<size_t>(count) * DTypeSize(dtype),
                                   .read = true,
                                   .written = true}};
    return Launch("all_reduce_sum", buffers,
                  [&](ncclComm_t comm, cudaStream_t stream, absl::Span<void* const> device) {
                    if (count == 0) return absl::OkStatus();
                    return NcclStatus(
                        ncclAllReduce(device[0], device[0], count, type, ncclSum, comm, stream),
                        "ncclAllReduce", comm);
                  });
  }

  absl::StatusOr<std::unique_ptr<CommRequest>> StartAllGather(const void* send, void* recv,
                                                              int64_t count, DType dtype) override {
    MOETRAIN_RETURN_IF_ERROR(CheckAllGather(Op("all_gather"), send, recv, count, dtype));
    const size_t bytes = static_cast<size_t>(count) * DTypeSize(dtype);
    const NcclBuffer buffers[] = {{.data = send, .bytes = bytes, .read = true},
                                  {.data = recv, .bytes = bytes * size(), .written = true}};
    return Launch("all_gather", buffers,
                  [&](ncclComm_t comm, cudaStream_t stream, absl::Span<void* const> device) {
                    if (count == 0) return absl::OkStatus();
                    return NcclStatus(
                        ncclAllGather(device[0], device[1], bytes, ncclUint8, comm, stream),
                        "ncclAllGather", comm);
                  });
  }

  // Equal blocks are ncclReduceScatter in place; unequal ones one ncclReduce per block, to its
  // rank, in one NCCL group.
  absl::StatusOr<std::unique_ptr<CommRequest>> StartReduceScatterSum(
      void* data, absl::Span<const int64_t> counts, DType dtype) override {
    const ncclDataType_t type = SumType(dtype);
    return LaunchBlocks(
        "reduce_scatter_sum", data, counts, dtype, /*summed=*/true,
        [&](ncclComm_t comm, cudaStream_t stream, char* base, const std::vector<int64_t>& blocks,
            size_t element) -> absl::Status {
          if (EqualBlocks(blocks)) {
            return NcclStatus(ncclReduceScatter(base, base + rank() * blocks[0] * element,
                                                blocks[0], type, ncclSum, comm, stream),
                              "ncclReduceScatter", comm);
          }
          return PerBlockInGroup(
              comm, blocks, element, base, [&](int root, char* block, int64_t count) {
                return NcclStatus(
                    ncclReduce(block, block, count, type, ncclSum, root, comm, stream),
                    "ncclReduce", comm);
              });
        });
  }

  // Equal blocks are ncclAllGather in place; unequal ones one ncclBroadcast per block, from its
  // rank, in one NCCL group.
  absl::StatusOr<std::unique_ptr<CommRequest>> StartAllGatherV(void* data,
                                                               absl::Span<const int64_t> counts,
                                                               DType dtype) override {
    return LaunchBlocks(
        "all_gather_v", data, counts, dtype, /*summed=*/false,
        [&](ncclComm_t comm, cudaStream_t stream, char* base, const std::vector<int64_t>& blocks,
            size_t element) -> absl::Status {
          if (EqualBlocks(blocks)) {
            const size_t bytes = blocks[0] * element;
            return NcclStatus(
                ncclAllGather(base + rank() * bytes, base, bytes, ncclUint8, comm, stream),
                "ncclAllGather", comm);
          }
          return PerBlockInGroup(
              comm, blocks, element, base, [&](int root, char* block, int64_t count) {
                return NcclStatus(
                    ncclBroadcast(block, block, count * element, ncclUint8, root, comm, stream),
                    "ncclBroadcast", comm);
              });
        });
  }

  absl::StatusOr<std::unique_ptr<CommRequest>> StartBroadcast(void* data, int64_t count,
                                                              DType dtype, int root) override {
    MOETRAIN_RETURN_IF_ERROR(CheckBroadcast(Op("broadcast"), data, count, dtype, root));
    const size_t bytes = static_cast<size_t>(count) * DTypeSize(dtype);
    // Only the root's values are read; every rank's are written.
    const NcclBuffer buffers[] = {
        {.data = data, .bytes = bytes, .read = rank() == root, .written = true}};
    return Launch("broadcast", buffers,
                  [&](ncclComm_t comm, cudaStream_t stream, absl::Span<void* const> device) {
                    if (count == 0) return absl::OkStatus();
                    return NcclStatus(
                        ncclBroadcast(device[0], device[0], bytes, ncclUint8, root, comm, stream),
                        "ncclBroadcast", comm);
                  });
  }

  // An all-reduce of one integer kept on the device: NCCL has no barrier of its own.
  absl::StatusOr<std::unique_ptr<CommRequest>> StartBarrier() override {
    return Launch("barrier", {},
                  [&](ncclComm_t comm, cudaStream_t stream, absl::Span<void* const>) {
                    return NcclStatus(ncclAllReduce(group_->scratch(), group_->scratch(), 1,
                                                    ncclInt32, ncclSum, comm, stream),
                                      "ncclAllReduce", comm);
                  });
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Subgroup(const std::vector<int>& ranks) override {
    MOETRAIN_ASSIGN_OR_RETURN(const int group_rank, CheckSubgroup(Op("subgroup"), ranks));
    NcclOptions options = options_;
    options.group.prefix = absl::StrCat(options_.group.prefix, "/group", subgroups_made_++, "/",
                                        absl::StrJoin(ranks, ","));
    options.group.rank = group_rank;
    options.group.size = static_cast<int>(ranks.size());
    // Members of one group share a color, the group's lowest rank; the key orders them as
    // `ranks` does.
    MOETRAIN_ASSIGN_OR_RETURN(std::shared_ptr<NcclGroup> child,
                              group_->Split(ranks.front(), rank(), options));
    return std::make_unique<NcclCommunicator>(std::move(child), std::move(options));
  }

 private:
  OpContext Op(absl::string_view op) const {
    return {.backend = "nccl", .op = op, .rank = rank(), .size = size()};
  }

  // Enqueues `enqueue`'s NCCL calls on the group's stream, on the device addresses of `buffers`,
  // and returns a request for them.
  absl::StatusOr<std::unique_ptr<CommRequest>> Launch(absl::string_view op,
                                                      absl::Span<const NcclBuffer> buffers,
                                                      NcclGroup::EnqueueFn enqueue) {
    const std::string what = group_->Describe(op);
    const absl::Time deadline = absl::Now() + options_.group.timeout;
    MOETRAIN_ASSIGN_OR_RETURN(NcclEnqueued enqueued,
                              group_->Enqueue(what, deadline, buffers, enqueue));
    return std::make_unique<NcclRequest>(group_, what, std::move(enqueued), deadline);
  }

  // The collectives over per-rank blocks of one buffer, in place (ReduceScatterSum, AllGatherV):
  // checks the blocks, then enqueues `enqueue(comm, stream, device address of data, the blocks,
  // bytes an element)` unless they are all empty.
  template <typename Enqueue>
  absl::StatusOr<std::unique_ptr<CommRequest>> LaunchBlocks(absl::string_view op, void* data,
                                                            absl::Span<const int64_t> counts,
                                                            DType dtype, bool summed,
                                                            Enqueue enqueue) {
    int64_t total = 0;
    MOETRAIN_RETURN_IF_ERROR(CheckBlocks(Op(op), data, counts, dtype, summed, &total));
    const size_t element = DTypeSize(dtype);
    const std::vector<int64_t> blocks(counts.begin(), counts.end());
    const NcclBuffer buffers[] = {{.data = data,
                                   .bytes = static_cast<size_t>(total) * element,
                                   .read = true,
                                   .written = true}};
    return Launch(op, buffers,
                  [&](ncclComm_t comm, cudaStream_t stream, absl::Span<void* const> device) {
                    if (total == 0) return absl::OkStatus();
                    return enqueue(comm, stream, static_cast<char*>(device[0]), blocks, element);
                  });
  }

  const std::shared_ptr<NcclGroup> group_;
  const NcclOptions options_;
  int subgroups_made_ = 0;  // Subgroup is called in the same order on every rank
};

// The unique id as hex, and back.
std::string IdToHex(const ncclUniqueId& id) {
  return absl::BytesToHexString(absl::string_view(id.internal, sizeof(id.internal)));
}

absl::StatusOr<ncclUniqueId> IdFromHex(const std::string& hex, const std::string& key) {
  ncclUniqueId id;
  const bool hex_digits =
      std::all_of(hex.begin(), hex.end(), [](unsigned char c) { return std::isxdigit(c) != 0; });
  if (!hex_digits || hex.size() != 2 * sizeof(id.internal)) {
    return absl::DataLossError(absl::StrCat("NCCL unique id under '", key, "' is not ",
                                            2 * sizeof(id.internal), " hex digits (", hex.size(),
                                            " characters)"));
  }
  const std::string bytes = absl::HexStringToBytes(hex);
  std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  return id;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& options) {
  const GroupOptions& group = options.group;
  // A world of one has nobody to tell its id: it needs no store.
  MOETRAIN_RETURN_IF_ERROR(group.Validate(/*needs_store=*/group.size > 1));
  const std::string key = absl::StrCat(group.prefix, "/nccl_unique_id");
  ncclUniqueId id;
  if (group.size == 1) {
    // Alone: no rendezvous, so the lack of a GPU is said before NCCL's bootstrap starts.
    MOETRAIN_RETURN_IF_ERROR(NcclGroup::UsableDevice(options).status());
    MOETRAIN_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId", nullptr));
  } else if (group.rank == 0) {
    MOETRAIN_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId", nullptr));
    MOETRAIN_RETURN_IF_ERROR(group.store->Set(key, IdToHex(id)));
  } else {
    absl::StatusOr<std::string> hex = group.store->Get(key, group.timeout);
    if (!hex.ok()) {
      return absl::Status(
          hex.status().code(),
          absl::StrCat("nccl rendezvous of rank ", group.rank, " of ", group.size,
                       ": rank 0 did not publish the unique id: ", hex.status().message()));
    }
    MOETRAIN_ASSIGN_OR_RETURN(id, IdFromHex(*hex, key));
  }
  MOETRAIN_ASSIGN_OR_RETURN(std::shared_ptr<NcclGroup> nccl_group, NcclGroup::Init(id, options));
  return std::make_unique<NcclCommunicator>(std::move(nccl_group), options);
}

bool NcclCommunicatorBuilt() { return true; }

}  // namespace moetrain

#endif  // MOETRAIN_HAVE_NCCL
