// Expert-parallel token exchange (DeepEP-style dispatch and combine) among the ranks of an expert
// group: ep ranks, group rank j owning the L = E/ep global experts [j·L, (j+1)·L).
//
//   PlanDispatch  one all-gather of every rank's per-expert row counts; from it the layout both
//                 sides of every exchange follow (a DispatchHandle), computed once per forward and
//                 reused by combine and by the backward.
//   Dispatch      rows in send order (R, D) → the rows of this rank's experts (N, D).
//   Combine       the inverse: those N rows, transformed in place of order, back to their senders
//                 in send order (R, D). The backward of dispatch is a combine of the gradient, and
//                 the backward of combine a dispatch.
//
// Chunks (for overlapping communication with expert compute): chunk c of a handle covers a range
// of every rank's local experts, chosen so that each chunk carries about 1/C of the rows that
// rank receives; each chunk is one all-to-all-v per exchange. Every expert is in exactly one chunk.
//
// Received layout: by chunk, then source rank, then local expert, each (source, expert) block in
// the sender's order (handle.ExpertOffsets gives the blocks of one chunk and source). That is the
// order all-to-all-v delivers, so neither side copies a row: the sender's rows for one exchange
// are one contiguous block, and the expert side runs one grouped GEMM per source block instead of
// first sorting its rows by expert. (On TCP loopback an all-to-all costs about one memcpy of the
// rows, so a sort on each side would halve the exchange's throughput.) An expert's blocks and
// their order do not depend on the number of chunks, so neither do its results.
//
// FP8 on the wire (DispatchArgs::fp8): a dispatch may send E4M3 rows with 1×128 power-of-two
// block scales instead of compute-dtype rows (D + 4·ceil(D/128) bytes a row instead of 2·D for
// bf16), dequantised on arrival; combine always sends the compute dtype (as DeepEP does).
//
// Send order: a rank's rows sorted by handle.expert_send_slot of their expert, i.e. by chunk, then
// destination rank, then global expert, each expert's rows in the sender's order. With one chunk
// that is simply by global expert; with more, ops::BuildPermutation sorts by it when given
// expert_send_slot as its expert_order and SendOrderOffsets as its offsets.
#ifndef MOETRAIN_ENGINE_MOE_EXPERT_PARALLEL_H_
#define MOETRAIN_ENGINE_MOE_EXPERT_PARALLEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend/exec_context.h"
#include "engine/comm/communicator.h"
#include "engine/core/tensor.h"

namespace moetrain {

// Every chunk of a handle, in order.
inline constexpr int kAllChunks = -1;

// The layout of one exchange pattern. ep = group size, E experts, L = E/ep local experts, C
// chunks, R rows this rank sends, N rows it receives. rows_sent and chunk_experts are the same on
// every rank of the group; the rest is this rank's view.
struct DispatchHandle {
  Communicator* group = nullptr;  // the expert group; not owned
  int group_size = 1;             // ep
  int group_rank = 0;             // this rank's index in the group
  int64_t num_experts = 0;        // E
  int64_t num_local_experts = 0;  // L = E / ep
  int num_chunks = 1;             // C

  std::vector<int64_t> rows_sent;  // (ep, E) rows rank s sends to global expert e: [s·E + e]
  // (ep, C + 1) local experts of rank j in chunk c: [chunk_experts[j·(C+1) + c], … + c + 1).
  std::vector<int64_t> chunk_experts;

  // Send side.
  std::vector<int32_t> expert_send_slot;  // (E) the place of expert e in the send order
  std::vector<int64_t> send_offsets;      // (C + 1) chunk c sends rows [send_offsets[c], [c+1])
  std::vector<int64_t> send_counts;       // (C, ep) rows of chunk c for rank j: [c·ep + j]

  // Receive side: chunk c's rows are [recv_offsets[c], [c+1]), source by source.
  std::vector<int64_t> recv_offsets;  // (C + 1)
  std::vector<int64_t> recv_counts;   // (C, ep) rows of chunk c from rank s: [c·ep + s]

  int64_t num_send_rows() const { return send_offsets.back(); }      // R
  int64_t num_received_rows() const { return recv_offsets.back(); }  // N
  // This rank's local experts in chunk c: [first, last).
  int64_t chunk_first_expert(int c) const {
    return chunk_experts[group_rank * (num_chunks + 1) + c];
  }
  int64_t chunk_last_expert(int c) const {
    return chunk_experts[group_rank * (num_chunks + 1) + c + 1];
  }
  // (E + 1) the send-order rows of each expert slot: slot expert_send_slot[e] holds the rows this
  // rank sends to expert e.
  std::vector<int64_t> SendOrderOffsets() const;
  // The received rows of chunk c from source s, by local expert: (last − first + 1) offsets,
  // absolute rows of the received buffer; expert first + i owns [offsets[i], offsets[i+1]).
  std::vector<int64_t> ExpertOffsets(int c, int source) const;
};

struct DispatchPlanArgs {
  Communicator* group = nullptr;              // the expert group; must outlive the handle
  absl::Span<const int64_t> rows_per_expert;  // (E) rows this rank sends to each global expert
  int num_chunks = 1;                         // C in [1, L]
};

struct DispatchArgs {
  const DispatchHandle* handle = nullptr;
  TensorView rows;      // (R, D) f32 or bf16, in send order; read
  TensorView received;  // (N, D) same dtype, written: by chunk, source, local expert
  int chunk = kAllChunks;
  // FP8 on the wire (train.fp8.fp8_dispatch): the rows travel as E4M3 with one power-of-two f32
  // scale per 128 elements of a row (ops::Fp8Scaling::kBlock1x128, amax epsilon 0), and Wait
  // dequantises them into `received`, so each received row is exactly Dequantize(Quantize(row)).
  // `ctx` (required then) is the context of the rows' device: it runs the quantise, the
  // dequantise and the two small scale transposes, and owns the wire buffers' memory.
  bool fp8 = false;
  const ExecContext* ctx = nullptr;
};

// The bytes one row of D elements takes on the wire: D·sizeof(dtype), or with FP8 the E4M3 row
// (padded to 16 bytes, ops::Fp8PaddedCols) and its ceil(D/128) f32 scales.
int64_t DispatchRowBytes(int64_t cols, DType dtype, bool fp8);

struct CombineArgs {
  const DispatchHandle* handle = nullptr;
  TensorView rows;  // (N, D) f32 or bf16, in the received layout; read
  TensorView out;   // (R, D) same dtype, written: in send order
  int chunk = kAllChunks;
};

// Exchanges the counts (a collective on the group: every rank calls it in the same order) and
// returns the layout. InvalidArgument naming the argument when there is no group, counts are
// negative, E is not a multiple of ep, or num_chunks is outside [1, L].
absl::StatusOr<DispatchHandle> PlanDispatch(const DispatchPlanArgs& args);

// A dispatch or combine in flight. Wait returns once the rows are in place or the exchange failed;
// the buffers of its Args must stay alive and untouched until then. Destroying a request that was
// not waited for waits for it.
class ExchangeRequest {
 public:
  ExchangeRequest() = default;
  // The all-to-alls of the exchange's chunks, and what Wait runs once they all succeeded (an FP8
  // dispatch's dequantise; it owns the wire buffers until then).
  explicit ExchangeRequest(std::vector<std::unique_ptr<CommRequest>> requests,
                           std::function<absl::Status()> finish = nullptr)
      : requests_(std::move(requests)), finish_(std::move(finish)) {}
  ExchangeRequest(ExchangeRequest&& other) noexcept = default;
  ExchangeRequest& operator=(ExchangeRequest&& other) noexcept;
  // Waits for the transfers but does not finish: an abandoned request writes no buffer.
  ~ExchangeRequest();

  // The first failure among the chunks (or of the finish), or OK; a second Wait returns the same.
  absl::Status Wait();

 private:
  // Waits for every transfer; drops the finish.
  void Abandon();

  std::vector<std::unique_ptr<CommRequest>> requests_;  // not yet waited for
  std::function<absl::Status()> finish_;                // not yet run
  absl::Status status_;
};

// Start one chunk (or all, in order) of an exchange; every rank of the group starts the same
// chunks in the same order. Chunk c's combine may start while later chunks' dispatches are still
// in flight. InvalidArgument naming the argument for a missing handle, rows of the wrong shape or
// dtype, or a chunk outside [0, C).
absl::StatusOr<ExchangeRequest> StartDispatch(const DispatchArgs& args);
absl::StatusOr<ExchangeRequest> StartCombine(const CombineArgs& args);
// Start and wait.
absl::Status Dispatch(const DispatchArgs& args);
absl::Status Combine(const CombineArgs& args);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_MOE_EXPERT_PARALLEL_H_
