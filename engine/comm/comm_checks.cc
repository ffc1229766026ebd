#include "engine/comm/comm_checks.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/core/status.h"

namespace moetrain {
namespace {

std::string Prefix(const OpContext& context) {
  return absl::StrCat(context.backend, " ", context.op, " (rank ", context.rank, " of ",
                      context.size, "): ");
}

absl::Status Invalid(const OpContext& context, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(Prefix(context), message));
}

// `counts` has one non-negative entry per rank; their sum in *total.
absl::Status CheckCounts(const OpContext& context, absl::string_view name,
                         absl::Span<const int64_t> counts, int64_t* total) {
  if (static_cast<int64_t>(counts.size()) != context.size) {
    return Invalid(context, absl::StrCat(name, " has ", counts.size(),
                                         " entries, expected size = ", context.size));
  }
  *total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] < 0) {
      return Invalid(context, absl::StrCat(name, "[", i, "] = ", counts[i], " is negative"));
    }
    *total += counts[i];
  }
  return absl::OkStatus();
}

absl::Status CheckCount(const OpContext& context, int64_t count) {
  if (count < 0) return Invalid(context, absl::StrCat("count = ", count, " is negative"));
  return absl::OkStatus();
}

absl::Status CheckBuffer(const OpContext& context, absl::string_view name, const void* buffer,
                         int64_t count) {
  if (buffer == nullptr && count > 0) {
    return Invalid(context, absl::StrCat(name, " is null but holds ", count, " elements"));
  }
  return absl::OkStatus();
}

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool Overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  if (a_bytes <= 0 || b_bytes <= 0) return false;
  const auto a_begin = reinterpret_cast<uintptr_t>(a), b_begin = reinterpret_cast<uintptr_t>(b);
  return a_begin < b_begin + static_cast<uintptr_t>(b_bytes) &&
         b_begin < a_begin + static_cast<uintptr_t>(a_bytes);
}

absl::Status CheckSummable(const OpContext& context, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kI32 &&
      dtype != DType::kI64) {
    return Invalid(context, absl::StrCat("dtype = ", std::string(DTypeName(dtype)),
                                         " is not summable here (f32, bf16, i32 or i64)"));
  }
  return absl::OkStatus();
}

class CompletedCommRequest : public CommRequest {
 public:
  explicit CompletedCommRequest(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }

 private:
  const absl::Status status_;
};

}  // namespace

absl::Status CheckAllToAllV(const OpContext& context, const AllToAllVArgs& args) {
  int64_t send_total = 0, recv_total = 0;
  MOETRAIN_RETURN_IF_ERROR(CheckCounts(context, "send_counts", args.send_counts, &send_total));
  MOETRAIN_RETURN_IF_ERROR(CheckCounts(context, "recv_counts", args.recv_counts, &recv_total));
  MOETRAIN_RETURN_IF_ERROR(CheckBuffer(context, "send", args.send, send_total));
  MOETRAIN_RETURN_IF_ERROR(CheckBuffer(context, "recv", args.recv, recv_total));
  const int64_t own_send = args.send_counts[context.rank];
  const int64_t own_recv = args.recv_counts[context.rank];
  if (own_send != own_recv) {
    return Invalid(context, absl::StrCat("send_counts[", context.rank, "] = ", own_send,
                                         " differs from recv_counts[", context.rank,
                                         "] = ", own_recv, " (this rank's own chunk)"));
  }
  const int64_t element = static_cast<int64_t>(DTypeSize(args.dtype));
  if (Overlap(args.send, send_total * element, args.recv, recv_total * element)) {
    return Invalid(context, "send and recv overlap");
  }
  return absl::OkStatus();
}

absl::Status CheckAllReduceSum(const OpContext& context, const void* data, int64_t count,
                               DType dtype) {
  MOETRAIN_RETURN_IF_ERROR(CheckCount(context, count));
  MOETRAIN_RETURN_IF_ERROR(CheckBuffer(context, "data", data, count));
  return CheckSummable(context, dtype);
}

absl::Status CheckBlocks(const OpContext& context, const void* data,
                         absl::Span<const int64_t> counts, DType dtype, bool summed,
                         int64_t* total) {
  MOETRAIN_RETURN_IF_ERROR(CheckCounts(context, "counts", counts, total));
  MOETRAIN_RETURN_IF_ERROR(CheckBuffer(context, "data", data, *total));
  return summed ? CheckSummable(context, dtype) : absl::OkStatus();
}

absl::Status CheckAllGather(const OpContext& context, const void* send, const void* recv,
                            int64_t count, DType dtype) {
  MOETRAIN_RETURN_IF_ERROR(CheckCount(context, count));
  MOETRAIN_RETURN_IF_ERROR(CheckBuffer(context, "send", send, count));
  MOETRAIN_RETURN_IF_ERROR(CheckBuffer(context, "recv", recv, count));
  const int64_t bytes = count * static_cast<int64_t>(DTypeSize(dtype));
  if (Overlap(send, bytes, recv, bytes * context.size)) {
    return Invalid(context, "send overlaps recv");
  }
  return absl::OkStatus();
}

absl::Status CheckBroadcast(const OpContext& context, const void* data, int64_t count, DType dtype,
                            int root) {
  MOETRAIN_RETURN_IF_ERROR(CheckCount(context, count));
  MOETRAIN_RETURN_IF_ERROR(CheckBuffer(context, "data", data, count));
  if (root < 0 || root >= context.size) {
    return Invalid(context,
                   absl::StrCat("root = ", root, " is outside [0, size = ", context.size, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> CheckSubgroup(const OpContext& context, const std::vector<int>& ranks) {
  const std::string listed = absl::StrCat("ranks {", absl::StrJoin(ranks, ", "), "}");
  int index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= context.size) {
      return Invalid(context, absl::StrCat(listed, ": ", ranks[i],
                                           " is outside [0, size = ", context.size, ")"));
    }
    if (i > 0 && ranks[i] <= ranks[i - 1]) {
      return Invalid(context, absl::StrCat(listed, " are not strictly ascending"));
    }
    if (ranks[i] == context.rank) index = static_cast<int>(i);
  }
  if (index < 0) return Invalid(context, absl::StrCat(listed, " do not include this rank"));
  return index;
}

std::unique_ptr<CommRequest> CompletedRequest(absl::Status status) {
  return std::make_unique<CompletedCommRequest>(std::move(status));
}

}  // namespace moetrain
