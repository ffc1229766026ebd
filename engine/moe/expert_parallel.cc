#include "engine/moe/expert_parallel.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"

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

// One all-to-all-v per chunk in [first, last) of `handle` between `send_order` (R, D) and
// `received` (N, D); dispatch sends from the first, combine from the second.
absl::StatusOr<ExchangeRequest> StartExchange(const DispatchHandle* handle, TensorView send_order,
                                              TensorView received, int chunk, bool dispatch) {
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
  const int first = chunk == kAllChunks ? 0 : chunk;
  const int last = chunk == kAllChunks ? h.num_chunks : chunk + 1;
  const int64_t cols = send_order.dim(1);
  const int ep = h.group_size;
  std::vector<std::unique_ptr<CommRequest>> requests;
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
    Wait().IgnoreError();
    requests_ = std::move(other.requests_);
    status_ = std::move(other.status_);
    other.requests_.clear();
  }
  return *this;
}

ExchangeRequest::~ExchangeRequest() { Wait().IgnoreError(); }

absl::Status ExchangeRequest::Wait() {
  for (std::unique_ptr<CommRequest>& request : requests_) {
    absl::Status status = request->Wait();
    if (status_.ok()) status_ = std::move(status);
  }
  requests_.clear();
  return status_;
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
  return StartExchange(args.handle, args.rows, args.received, args.chunk, /*dispatch=*/true);
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
