#include "engine/moe/expert_parallel.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/fp8/fp8.h"
#include "engine/ops/permute/permute.h"

namespace moetrain {
namespace {

// The local-expert bounds (C + 1) of the chunks of one rank whose experts receive `load` (L) rows:
// each bound is the one whose prefix of rows lies closest to c/C of the total (ties to the lower
// expert), so chunks carry similar numbers of rows; by expert count when no rows arrive.
std::vector<int64_t> ChunkBounds(const std::vector<int64_t>& load, int chunks) {
  const int64_t experts = static_cast<int64_t>(load.size());
  std::vector<int64_t> prefix(experts + 1, 0);
  for (int64_t l = 0; l < experts; ++l) prefix[l + 1] = prefix[l] + load[l];
  const int64_t total = prefix[experts];
  std::vector<int64_t> bounds(chunks + 1, 0);
  bounds[chunks] = experts;
  for (int c = 1; c < chunks; ++c) {
    if (total == 0) {
      bounds[c] = c * experts / chunks;
      continue;
    }
    // |C·prefix − c·total| compares a prefix with c/C of the total in integers.
    auto gap = [&](int64_t l) { return std::llabs(chunks * prefix[l] - c * total); };
    int64_t best = bounds[c - 1];
    for (int64_t l = bounds[c - 1]; l <= experts; ++l) {
      if (gap(l) < gap(best)) best = l;
    }
    bounds[c] = best;
  }
  return bounds;
}

absl::Status CheckRows(const TensorView& t, const char* name, int64_t rows) {
  if (t.empty() || (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16) || t.rank() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected (", rows,
                                                   ", D) f32 or bf16 rows, got ",
                                                   t.empty() ? "none" : t.DebugString()));
  }
  return CheckDenseTensor(t, name, t.dtype(), {rows, -1});
}

std::vector<int64_t> Times(absl::Span<const int64_t> counts, int64_t factor) {
  std::vector<int64_t> out(counts.begin(), counts.end());
  for (int64_t& v : out) v *= factor;
  return out;
}

char* RowAddress(const TensorView& t, int64_t row) {
  return static_cast<char*>(t.raw()) + row * t.dim(1) * static_cast<int64_t>(DTypeSize(t.dtype()));
}

// The wire format of an FP8 dispatch: E4M3, 1×128 blocks, power-of-two scales, no amax epsilon
// (so that the blockwise recipe's expert GEMM re-quantises the received rows to the same values).
constexpr Fp8Format kWireFormat = Fp8Format::kE4M3;
constexpr ops::Fp8Scaling kWireScaling = ops::Fp8Scaling::kBlock1x128;

int64_t ScaleBlocks(int64_t cols) { return (cols + 127) / 128; }

// What an FP8 dispatch of the rows [send_begin, +R) to [recv_begin, +N) owns until Wait has
// dequantised: both sides' FP8 rows, their scales row by row, and the transposes' indices.
//
// Why the scales are transposed: kBlock1x128 keeps scale_inv as [ceil(D/128)][pad4(rows)] (the
// layout cuBLASLt reads), where one row's scales are not contiguous, but an all-to-all-v needs
// each destination's share in one block. So the sender gathers them into (R, ceil(D/128)) row
// order, a second all-to-all-v per chunk carries them beside the rows (one exchange of packed
// rows+scales records would need the same gather plus a pack of the rows, i.e. a copy of the
// whole payload), and the receiver gathers them back. The scales are 4/128 of the row bytes.
struct Fp8Wire {
  ExecContext ctx = ExecContext::Cpu();
  int64_t blocks = 0;        // B = ceil(D/128)
  int64_t padded_cols = 0;   // ops::Fp8PaddedCols(D): the bytes of one FP8 row
  ops::OwnedFp8Tensor send;  // (R, D) the quantised rows
  ops::OwnedFp8Tensor recv;  // (N, D) as they arrive, then their scales put back in place
  Tensor send_scales;        // (R·B, 1) f32: row r's block b at r·B + b
  Tensor recv_scales;        // (N·B, 1) f32, same order
  // The two transposes' gather indices, uploaded together (a host-to-device copy synchronises
  // the stream, so once, before the collectives, where the rows must be ready anyway).
  std::vector<int32_t> index_host;
  Tensor index;           // (R·B + B·pad4(N)) i32 on ctx's device
  TensorView send_index;  // (R·B) element (r, b) of the send scales from scale_inv [b][r]
  TensorView recv_index;  // (B·pad4(N)) element [b][r] of scale_inv from the received (r, b)
  TensorView received;    // (N, D) the rows of `received` this exchange writes
};

// Quantises rows [send_begin, +R) of send_order and makes the buffers of an FP8 exchange of them
// into [recv_begin, +N) of received; when it returns, a collective may read the quantised rows
// and scales.
absl::StatusOr<std::shared_ptr<Fp8Wire>> PrepareFp8Wire(const ExecContext& ctx,
                                                        const Communicator& group,
                                                        TensorView send_order, int64_t send_begin,
                                                        int64_t send_rows, TensorView received,
                                                        int64_t recv_begin, int64_t recv_rows) {
  auto wire = std::make_shared<Fp8Wire>();
  wire->ctx = ctx;
  const int64_t cols = send_order.dim(1), b = ScaleBlocks(cols);
  wire->blocks = b;
  wire->padded_cols = ops::Fp8PaddedCols(cols);
  wire->received = received.Slice(recv_begin, recv_begin + recv_rows);
  // The indices are i32 and count scales, rows padded to 4 included.
  if ((send_rows + recv_rows + 3) * b > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("fp8 dispatch: ", send_rows, " + ", recv_rows,
                                                   " rows of ", cols,
                                                   " columns have too many scales"));
  }
  MOETRAIN_ASSIGN_OR_RETURN(
      wire->send, ops::AllocateFp8Tensor(ctx, kWireFormat, kWireScaling, send_rows, cols));
  MOETRAIN_ASSIGN_OR_RETURN(
      wire->recv, ops::AllocateFp8Tensor(ctx, kWireFormat, kWireScaling, recv_rows, cols));
  MOETRAIN_ASSIGN_OR_RETURN(wire->send_scales,
                            Tensor::Allocate(ctx.allocator(), DType::kF32, {send_rows * b, 1}));
  MOETRAIN_ASSIGN_OR_RETURN(wire->recv_scales,
                            Tensor::Allocate(ctx.allocator(), DType::kF32, {recv_rows * b, 1}));

  // scale_inv [B][P] (P = pad4(rows)) ↔ row order (rows, B): element (r, block) ↔ [block][r].
  std::vector<int32_t>& index = wire->index_host;
  const int64_t send_padded = wire->send.view.scale_inv.dim(1);
  if (send_rows > 0) {
    index.resize(send_rows * b);
    for (int64_t r = 0; r < send_rows; ++r) {
      for (int64_t block = 0; block < b; ++block) {
        index[r * b + block] = static_cast<int32_t>(block * send_padded + r);
      }
    }
  }
  const int64_t send_index_size = static_cast<int64_t>(index.size());
  if (recv_rows > 0) {
    const int64_t recv_padded = wire->recv.view.scale_inv.dim(1);
    // The padding rows' scales are never read; they copy the first scale rather than stay unset.
    index.resize(send_index_size + b * recv_padded, 0);
    for (int64_t block = 0; block < b; ++block) {
      for (int64_t r = 0; r < recv_rows; ++r) {
        index[send_index_size + block * recv_padded + r] = static_cast<int32_t>(r * b + block);
      }
    }
  }
  const int64_t index_size = static_cast<int64_t>(index.size());
  if (index_size > 0) {
    MOETRAIN_ASSIGN_OR_RETURN(wire->index,
                              Tensor::Allocate(ctx.allocator(), DType::kI32, {index_size}));
    MOETRAIN_RETURN_IF_ERROR(ops::CopyTensor(
        ctx, TensorView(index.data(), DType::kI32, {index_size}), wire->index.view()));
    wire->send_index = wire->index.view().Slice(0, send_index_size);
    wire->recv_index = wire->index.view().Slice(send_index_size, index_size);
  }

  if (send_rows > 0) {
    ops::Fp8QuantizeArgs quantize;
    quantize.src = send_order.Slice(send_begin, send_begin + send_rows);
    quantize.pow2_scales = true;
    quantize.out = wire->send.view;
    MOETRAIN_RETURN_IF_ERROR(ops::Fp8Quantize(ctx, quantize));
    const TensorView scale_inv = wire->send.view.scale_inv;
    MOETRAIN_RETURN_IF_ERROR(ops::GatherRows(ctx, scale_inv.Reshape({scale_inv.numel(), 1}),
                                             wire->send_index, wire->send_scales));
  }
  // The collectives read what the ops wrote: either the group orders itself after them (NCCL's
  // event) or they must be done first.
  if (!group.orders_after_device_work()) MOETRAIN_RETURN_IF_ERROR(ctx.Synchronize());
  return wire;
}

// Once the rows have arrived: their scales back into kBlock1x128's layout, then the rows
// dequantised into `received`; queued on the wire's context.
absl::Status FinishFp8Wire(const Fp8Wire& wire) {
  if (wire.recv.view.rows == 0) return absl::OkStatus();
  const TensorView scale_inv = wire.recv.view.scale_inv;
  MOETRAIN_RETURN_IF_ERROR(ops::GatherRows(wire.ctx, wire.recv_scales, wire.recv_index,
                                           scale_inv.Reshape({scale_inv.numel(), 1})));
  return ops::Fp8Dequantize(wire.ctx, wire.recv.view, wire.received);
}

// One all-to-all-v per chunk in [first, last) of `handle` between `send_order` (R, D) and
// `received` (N, D); dispatch sends from the first, combine from the second. With `fp8` (dispatch
// only), two per chunk: the FP8 rows and their scales.
absl::StatusOr<ExchangeRequest> StartExchange(const DispatchHandle* handle, TensorView send_order,
                                              TensorView received, int chunk, bool dispatch,
                                              bool fp8 = false, const ExecContext* ctx = nullptr) {
  const char* op = dispatch ? "dispatch" : "combine";
  if (handle == nullptr || handle->group == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": no handle (or one without a group)"));
  }
  const DispatchHandle& h = *handle;
  MOETRAIN_RETURN_IF_ERROR(
      CheckRows(send_order, dispatch ? "dispatch rows" : "combine out", h.num_send_rows()));
  MOETRAIN_RETURN_IF_ERROR(
      CheckRows(received, dispatch ? "dispatch received" : "combine rows", h.num_received_rows()));
  if (received.dtype() != send_order.dtype() || received.dim(1) != send_order.dim(1)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": rows ", send_order.DebugString(), " and ",
                                                   received.DebugString(),
                                                   " differ in dtype or width"));
  }
  if (chunk != kAllChunks && (chunk < 0 || chunk >= h.num_chunks)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": chunk = ", chunk, " is outside [0, ", h.num_chunks, ")"));
  }
  if (fp8 && ctx == nullptr) {
    return absl::InvalidArgumentError("dispatch: fp8 needs the rows' ExecContext (ctx)");
  }
  const int first = chunk == kAllChunks ? 0 : chunk;
  const int last = chunk == kAllChunks ? h.num_chunks : chunk + 1;
  const int64_t cols = send_order.dim(1);
  const int ep = h.group_size;
  std::vector<std::unique_ptr<CommRequest>> requests;
  if (fp8) {
    // The chunks [first, last) send and receive contiguous row ranges.
    const int64_t send_begin = h.send_offsets[first], recv_begin = h.recv_offsets[first];
    MOETRAIN_ASSIGN_OR_RETURN(
        std::shared_ptr<Fp8Wire> wire,
        PrepareFp8Wire(*ctx, *h.group, send_order, send_begin, h.send_offsets[last] - send_begin,
                       received, recv_begin, h.recv_offsets[last] - recv_begin));
    const Fp8Wire& w = *wire;
    for (int c = first; c < last; ++c) {
      const int64_t send_row = h.send_offsets[c] - send_begin;
      const int64_t recv_row = h.recv_offsets[c] - recv_begin;
      const absl::Span<const int64_t> send_counts =
          absl::MakeConstSpan(h.send_counts).subspan(c * ep, ep);
      const absl::Span<const int64_t> recv_counts =
          absl::MakeConstSpan(h.recv_counts).subspan(c * ep, ep);
      const AllToAllVArgs exchanges[] = {
          {.send = RowAddress(w.send.view.data, send_row),
           .send_counts = Times(send_counts, w.padded_cols),
           .recv = RowAddress(w.recv.view.data, recv_row),
           .recv_counts = Times(recv_counts, w.padded_cols),
           .dtype = w.send.view.data.dtype()},
          {.send = static_cast<float*>(w.send_scales.view().raw()) + send_row * w.blocks,
           .send_counts = Times(send_counts, w.blocks),
           .recv = static_cast<float*>(w.recv_scales.view().raw()) + recv_row * w.blocks,
           .recv_counts = Times(recv_counts, w.blocks),
           .dtype = DType::kF32}};
      for (const AllToAllVArgs& args : exchanges) {
        absl::StatusOr<std::unique_ptr<CommRequest>> request = h.group->StartAllToAllV(args);
        if (!request.ok()) {
          ExchangeRequest started(std::move(requests));  // waits, then frees the wire buffers
          return request.status();
        }
        requests.push_back(*std::move(request));
      }
    }
    return ExchangeRequest(std::move(requests),
                           [wire = std::move(wire)] { return FinishFp8Wire(*wire); });
  }
  for (int c = first; c < last; ++c) {
    AllToAllVArgs args = {
        .send = RowAddress(send_order, h.send_offsets[c]),
        .send_counts = Times(absl::MakeConstSpan(h.send_counts).subspan(c * ep, ep), cols),
        .recv = RowAddress(received, h.recv_offsets[c]),
        .recv_counts = Times(absl::MakeConstSpan(h.recv_counts).subspan(c * ep, ep), cols),
        .dtype = send_order.dtype()};
    if (!dispatch) {
      std::swap(args.send_counts, args.recv_counts);
      args.send = args.recv;
      args.recv = RowAddress(send_order, h.send_offsets[c]);
    }
    absl::StatusOr<std::unique_ptr<CommRequest>> request = h.group->StartAllToAllV(args);
    if (!request.ok()) {
      ExchangeRequest started(std::move(requests));  // waits for the chunks already started
      return request.status();
    }
    requests.push_back(*std::move(request));
  }
  return ExchangeRequest(std::move(requests));
}

}  // namespace

std::vector<int64_t> DispatchHandle::SendOrderOffsets() const {
  std::vector<int64_t> offsets(num_experts + 1, 0);
  for (int64_t e = 0; e < num_experts; ++e) {
    offsets[expert_send_slot[e] + 1] = rows_sent[group_rank * num_experts + e];
  }
  for (int64_t s = 0; s < num_experts; ++s) offsets[s + 1] += offsets[s];
  return offsets;
}

std::vector<int64_t> DispatchHandle::ExpertOffsets(int c, int source) const {
  const int64_t first = chunk_first_expert(c), last = chunk_last_expert(c);
  std::vector<int64_t> offsets(last - first + 1);
  offsets[0] = recv_offsets[c];
  for (int s = 0; s < source; ++s) offsets[0] += recv_counts[c * group_size + s];
  for (int64_t l = first; l < last; ++l) {
    offsets[l - first + 1] =
        offsets[l - first] + rows_sent[source * num_experts + group_rank * num_local_experts + l];
  }
  return offsets;
}

ExchangeRequest& ExchangeRequest::operator=(ExchangeRequest&& other) noexcept {
  if (this != &other) {
    Abandon();
    requests_ = std::move(other.requests_);
    finish_ = std::move(other.finish_);
    status_ = std::move(other.status_);
    other.requests_.clear();
    other.finish_ = nullptr;
  }
  return *this;
}

ExchangeRequest::~ExchangeRequest() { Abandon(); }

void ExchangeRequest::Abandon() {
  for (std::unique_ptr<CommRequest>& request : requests_) request->Wait().IgnoreError();
  requests_.clear();
  // The wire buffers go only now, once no transfer can touch them.
  finish_ = nullptr;
}

absl::Status ExchangeRequest::Wait() {
  for (std::unique_ptr<CommRequest>& request : requests_) {
    absl::Status status = request->Wait();
    if (status_.ok()) status_ = std::move(status);
  }
  requests_.clear();
  if (finish_ != nullptr) {
    const std::function<absl::Status()> finish = std::move(finish_);
    finish_ = nullptr;
    if (status_.ok()) status_ = finish();
  }
  return status_;
}

int64_t DispatchRowBytes(int64_t cols, DType dtype, bool fp8) {
  if (!fp8) return cols * static_cast<int64_t>(DTypeSize(dtype));
  return ops::Fp8PaddedCols(cols) + ScaleBlocks(cols) * static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<DispatchHandle> PlanDispatch(const DispatchPlanArgs& args) {
  if (args.group == nullptr) return absl::InvalidArgumentError("dispatch plan: no expert group");
  const int ep = args.group->size();
  const int64_t num_experts = static_cast<int64_t>(args.rows_per_expert.size());
  if (num_experts == 0 || num_experts % ep != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.moe.num_experts = ", num_experts,
                     " is not a positive multiple of parallel.expert_parallel = ", ep));
  }
  const int64_t local = num_experts / ep;
  const int chunks = args.num_chunks;
  if (chunks < 1 || chunks > local) {
    return absl::InvalidArgumentError(absl::StrCat("num_chunks = ", chunks, " is outside [1, ",
                                                   local, "] (the experts of a rank)"));
  }
  for (int64_t e = 0; e < num_experts; ++e) {
    if (args.rows_per_expert[e] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows_per_expert[", e, "] = ", args.rows_per_expert[e], " is negative"));
    }
  }

  DispatchHandle h;
  h.group = args.group;
  h.group_size = ep;
  h.group_rank = args.group->rank();
  h.num_experts = num_experts;
  h.num_local_experts = local;
  h.num_chunks = chunks;
  h.rows_sent.resize(ep * num_experts);
  MOETRAIN_ASSIGN_OR_RETURN(
      std::unique_ptr<CommRequest> gather,
      args.group->StartAllGather(args.rows_per_expert.data(), h.rows_sent.data(), num_experts,
                                 DType::kI64));
  MOETRAIN_RETURN_IF_ERROR(gather->Wait());
  auto sent = [&](int64_t source, int64_t rank, int64_t l) {
    return h.rows_sent[source * num_experts + rank * local + l];
  };

  // Chunk bounds of every rank, from the rows its experts receive: the same on every rank.
  for (int j = 0; j < ep; ++j) {
    std::vector<int64_t> load(local, 0);
    for (int s = 0; s < ep; ++s) {
      for (int64_t l = 0; l < local; ++l) load[l] += sent(s, j, l);
    }
    const std::vector<int64_t> bounds = ChunkBounds(load, chunks);
    h.chunk_experts.insert(h.chunk_experts.end(), bounds.begin(), bounds.end());
  }
  auto bound = [&](int j, int c) { return h.chunk_experts[j * (chunks + 1) + c]; };

  // Experts in send order (chunk, destination, expert); what each chunk sends and receives.
  const int me = h.group_rank;
  h.expert_send_slot.assign(num_experts, 0);
  h.send_counts.assign(chunks * ep, 0);
  h.recv_counts.assign(chunks * ep, 0);
  h.send_offsets.assign(chunks + 1, 0);
  h.recv_offsets.assign(chunks + 1, 0);
  int32_t slot = 0;
  for (int c = 0; c < chunks; ++c) {
    for (int j = 0; j < ep; ++j) {
      for (int64_t l = bound(j, c); l < bound(j, c + 1); ++l) {
        h.expert_send_slot[j * local + l] = slot++;
        h.send_counts[c * ep + j] += sent(me, j, l);
      }
      for (int64_t l = bound(me, c); l < bound(me, c + 1); ++l) {
        h.recv_counts[c * ep + j] += sent(j, me, l);
      }
      h.send_offsets[c + 1] += h.send_counts[c * ep + j];
      h.recv_offsets[c + 1] += h.recv_counts[c * ep + j];
    }
    h.send_offsets[c + 1] += h.send_offsets[c];
    h.recv_offsets[c + 1] += h.recv_offsets[c];
  }
  return h;
}

absl::StatusOr<ExchangeRequest> StartDispatch(const DispatchArgs& args) {
  return StartExchange(args.handle, args.rows, args.received, args.chunk, /*dispatch=*/true,
                       args.fp8, args.ctx);
}

absl::StatusOr<ExchangeRequest> StartCombine(const CombineArgs& args) {
  return StartExchange(args.handle, args.out, args.rows, args.chunk, /*dispatch=*/false);
}

absl::Status Dispatch(const DispatchArgs& args) {
  MOETRAIN_ASSIGN_OR_RETURN(ExchangeRequest request, StartDispatch(args));
  return request.Wait();
}

absl::Status Combine(const CombineArgs& args) {
  MOETRAIN_ASSIGN_OR_RETURN(ExchangeRequest request, StartCombine(args));
  return request.Wait();
}

}  // namespace moetrain
