#include "engine/comm/gloo_communicator.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/comm/comm_checks.h"
#include "engine/comm/gloo_store.h"
#include "engine/comm/local_communicator.h"
#include "engine/core/dtype_math.h"
#include "engine/core/status.h"
#include "gloo/allgather.h"
#include "gloo/allgatherv.h"
#include "gloo/alltoallv.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"

namespace moetrain {
namespace {

// Where a zero-length buffer points when the caller passed null: Gloo copies and sends 0 bytes
// from it, and memcpy wants a valid pointer even then.
uint8_t kEmptyBuffer[1];

uint8_t* Bytes(const void* pointer) {
  return pointer == nullptr ? kEmptyBuffer : static_cast<uint8_t*>(const_cast<void*>(pointer));
}

std::vector<int64_t> ToBytes(const std::vector<int64_t>& counts, DType dtype) {
  std::vector<int64_t> bytes(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) bytes[i] = counts[i] * DTypeSize(dtype);
  return bytes;
}

std::chrono::milliseconds ToMillis(absl::Duration duration) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(duration)));
}

// A write to a peer that died raises SIGPIPE, which would kill the process; blocked on the queue's
// thread, Gloo sees EPIPE instead. Gloo's event-loop thread, started from the queue's thread when
// it connects, inherits the mask.
void BlockSigpipe() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

// The numeric address `host` resolves to (the first of getaddrinfo's answers). Gloo resolves names
// itself but dereferences a failed lookup's result, so a name that does not resolve must never
// reach it.
absl::StatusOr<std::string> ResolveHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (error != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen_host '", host, "' does not resolve: ", gai_strerror(error)));
  }
  char text[INET6_ADDRSTRLEN] = {};
  const void* address =
      found->ai_family == AF_INET6
          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(found->ai_addr)->sin6_addr)
          : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr);
  const bool printed = inet_ntop(found->ai_family, address, text, sizeof(text)) != nullptr;
  freeaddrinfo(found);
  if (!printed)
    return absl::InvalidArgumentError(absl::StrCat("listen_host '", host, "': inet_ntop failed"));
  return std::string(text);
}

// Converts the exception in flight into a Status: Gloo's timeouts become DeadlineExceeded, its
// other I/O errors (a peer closed the connection, was refused, reset) Unavailable.
absl::Status CurrentExceptionToStatus(const std::string& what_failed) {
  try {
    throw;
  } catch (const gloo::IoException& e) {
    const std::string text = e.what();
    if (absl::StrContains(text, "Timed out") || absl::StrContains(text, "timeout")) {
      return absl::DeadlineExceededError(absl::StrCat(what_failed, " timed out: ", text));
    }
    return absl::UnavailableError(absl::StrCat(what_failed, " lost a peer: ", text));
  } catch (const gloo::EnforceNotMet& e) {
    return absl::InternalError(absl::StrCat(what_failed, " failed a Gloo check: ", e.what()));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(what_failed, " failed: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what_failed, " threw an unknown exception"));
  }
}

// The rank whose key `key` ("<prefix>/<rank>") is, or -1.
int RankOfKey(const std::string& key) {
  int rank = -1;
  const size_t slash = key.rfind('/');
  if (!absl::SimpleAtoi(key.substr(slash == std::string::npos ? 0 : slash + 1), &rank)) return -1;
  return rank;
}

// The options of one collective on `context`: its tag and its timeout set.
template <typename Options>
Options CollectiveOptions(const std::shared_ptr<gloo::Context>& context, uint32_t tag,
                          absl::Duration timeout) {
  Options options(context);
  options.setTag(tag);
  options.setTimeout(ToMillis(timeout));
  return options;
}

// out[i] ← ((in[0][i] + in[1][i]) + in[2][i]) + …: the n copies of a block of `count` elements,
// added in rank order (the same bits on every run and for every way of cutting the blocks).
template <typename T>
void SumInRankOrder(const uint8_t* in, int n, int64_t count, uint8_t* out) {
  const T* copies = reinterpret_cast<const T*>(in);
  T* sum = reinterpret_cast<T*>(out);
  std::copy(copies, copies + count, sum);
  for (int q = 1; q < n; ++q) {
    const T* copy = copies + q * count;
    for (int64_t i = 0; i < count; ++i) sum[i] += copy[i];
  }
}

// bf16 copies: widened to f32, added in rank order, the sum rounded once to nearest even.
void SumBf16InRankOrder(const uint8_t* in, int n, int64_t count, uint8_t* out) {
  const uint16_t* copies = reinterpret_cast<const uint16_t*>(in);
  uint16_t* sum = reinterpret_cast<uint16_t*>(out);
  for (int64_t i = 0; i < count; ++i) {
    float total = BF16BitsToFloat(copies[i]);
    for (int q = 1; q < n; ++q) total += BF16BitsToFloat(copies[q * count + i]);
    sum[i] = FloatToBF16Bits(total);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    const GlooOptions& options) {
  MOETRAIN_RETURN_IF_ERROR(options.group.Validate());
  if (options.listen_host.empty()) return absl::InvalidArgumentError("gloo listen_host is empty");
  std::unique_ptr<GlooCommunicator> communicator(new GlooCommunicator(options));
  MOETRAIN_RETURN_IF_ERROR(communicator->queue_->Run([&] { return communicator->Connect(); }));
  return communicator;
}

GlooCommunicator::GlooCommunicator(GlooOptions options)
    : options_(std::move(options)), queue_(std::make_unique<OpQueue>(&BlockSigpipe)) {}

GlooCommunicator::~GlooCommunicator() {
  queue_.reset();  // before the context it runs on
}

absl::Status GlooCommunicator::Connect() {
  const GroupOptions& group = options_.group;
  const std::string where = Describe("rendezvous");
  absl::StatusOr<std::string> address = ResolveHost(options_.listen_host);
  if (!address.ok()) {
    return absl::Status(address.status().code(),
                        absl::StrCat(where, ": ", address.status().message()));
  }
  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = *address;
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (...) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": cannot listen on listen_host '", options_.listen_host,
                     "': ", CurrentExceptionToStatus("tcp device").message()));
  }
  store_adapter_ = std::make_unique<GlooStoreAdapter>(group.store, group.timeout);
  prefix_store_ = std::make_unique<gloo::rendezvous::PrefixStore>(group.prefix, *store_adapter_);
  auto context = std::make_shared<gloo::rendezvous::Context>(group.rank, group.size);
  // Gloo waits five times its timeout for a peer to connect (one that published its address and
  // died would hold us that long), so connect under a fifth of ours; the store keeps the full
  // timeout, and every collective passes it explicitly.
  context->setTimeout(ToMillis(group.timeout / 5));
  try {
    context->connectFullMesh(*prefix_store_, device);
  } catch (...) {
    const absl::Status store_failure = store_adapter_->failure();
    if (absl::IsDeadlineExceeded(store_failure)) {
      // The key nobody set tells which rank did not show up.
      const int missing = RankOfKey(store_adapter_->failed_key());
      return absl::DeadlineExceededError(absl::StrCat(
          where, ": ", missing >= 0 ? absl::StrCat("rank ", missing) : std::string("a peer"),
          " did not join within ", absl::FormatDuration(group.timeout), " (",
          store_failure.message(), ")"));
    }
    if (!store_failure.ok()) {
      return absl::Status(store_failure.code(), absl::StrCat(where, ": ", store_failure.message()));
    }
    return CurrentExceptionToStatus(where);
  }
  context->setTimeout(ToMillis(group.timeout));
  context_ = std::move(context);
  return absl::OkStatus();
}

OpContext GlooCommunicator::Op(absl::string_view op) const {
  return {.backend = "gloo", .op = op, .rank = rank(), .size = size()};
}

std::string GlooCommunicator::Describe(absl::string_view op) const {
  return absl::StrCat("gloo ", op, " on rank ", rank(), " of ", size(), " (group '",
                      options_.group.prefix, "')");
}

absl::Status GlooCommunicator::Broken(absl::string_view op) const {
  absl::MutexLock lock(&mu_);
  if (failure_.ok()) return absl::OkStatus();
  return absl::Status(
      failure_.code(),
      absl::StrCat(Describe(op), ": the communicator failed earlier: ", failure_.message()));
}

absl::StatusOr<std::unique_ptr<CommRequest>> GlooCommunicator::Submit(
    absl::string_view op, std::function<void(uint32_t tag)> body) {
  MOETRAIN_RETURN_IF_ERROR(Broken(op));
  return queue_->Enqueue([this, op = std::string(op), body = std::move(body)]() -> absl::Status {
    MOETRAIN_RETURN_IF_ERROR(Broken(op));
    absl::Status status;
    try {
      body(next_tag_++);
    } catch (...) {
      status = CurrentExceptionToStatus(Describe(op));
      absl::MutexLock lock(&mu_);
      if (failure_.ok()) failure_ = status;
    }
    return status;
  });
}

absl::StatusOr<std::unique_ptr<CommRequest>> GlooCommunicator::StartAllToAllV(
    const AllToAllVArgs& args) {
  MOETRAIN_RETURN_IF_ERROR(CheckAllToAllV(Op("all_to_all_v"), args));
  return Submit("all_to_all_v", [this, send = Bytes(args.send), recv = Bytes(args.recv),
                                 send_bytes = ToBytes(args.send_counts, args.dtype),
                                 recv_bytes = ToBytes(args.recv_counts, args.dtype)](uint32_t tag) {
    auto options = CollectiveOptions<gloo::AlltoallvOptions>(context_, tag, options_.group.timeout);
    options.setInput(send, send_bytes);
    options.setOutput(recv, recv_bytes);
    gloo::alltoallv(options);
  });
}

absl::StatusOr<std::unique_ptr<CommRequest>> GlooCommunicator::StartAllReduceSum(void* data,
                                                                                 int64_t count,
                                                                                 DType dtype) {
  MOETRAIN_RETURN_IF_ERROR(CheckAllReduceSum(Op("all_reduce_sum"), data, count, dtype));
  MOETRAIN_RETURN_IF_ERROR(Broken("all_reduce_sum"));
  // Every rank sees the same count, so every rank skips the same collectives.
  if (count == 0) return CompletedRequest(absl::OkStatus());
  std::vector<int64_t> counts(size());
  for (int j = 0; j < size(); ++j) counts[j] = count / size() + (j < count % size() ? 1 : 0);
  return Submit("all_reduce_sum", [this, data = Bytes(data), counts, dtype](uint32_t tag) {
    ReduceScatterOn(tag, data, counts, dtype);
    AllGatherVOn(next_tag_++, data, counts, dtype);
  });
}

absl::StatusOr<std::unique_ptr<CommRequest>> GlooCommunicator::StartReduceScatterSum(
    void* data, absl::Span<const int64_t> counts, DType dtype) {
  int64_t total = 0;
  MOETRAIN_RETURN_IF_ERROR(
      CheckBlocks(Op("reduce_scatter_sum"), data, counts, dtype, /*summed=*/true, &total));
  MOETRAIN_RETURN_IF_ERROR(Broken("reduce_scatter_sum"));
  if (total == 0) return CompletedRequest(absl::OkStatus());
  return Submit(
      "reduce_scatter_sum",
      [this, data = Bytes(data), counts = std::vector<int64_t>(counts.begin(), counts.end()),
       dtype](uint32_t tag) { ReduceScatterOn(tag, data, counts, dtype); });
}

absl::StatusOr<std::unique_ptr<CommRequest>> GlooCommunicator::StartAllGatherV(
    void* data, absl::Span<const int64_t> counts, DType dtype) {
  int64_t total = 0;
  MOETRAIN_RETURN_IF_ERROR(
      CheckBlocks(Op("all_gather_v"), data, counts, dtype, /*summed=*/false, &total));
  MOETRAIN_RETURN_IF_ERROR(Broken("all_gather_v"));
  if (total == 0) return CompletedRequest(absl::OkStatus());
  return Submit("all_gather_v", [this, data = Bytes(data),
                                 counts = std::vector<int64_t>(counts.begin(), counts.end()),
                                 dtype](uint32_t tag) { AllGatherVOn(tag, data, counts, dtype); });
}

void GlooCommunicator::ReduceScatterOn(uint32_t tag, uint8_t* data,
                                       const std::vector<int64_t>& counts, DType dtype) {
  const int n = size(), r = rank();
  const int64_t own = counts[r];
  int64_t offset = 0;
  for (int j = 0; j < r; ++j) offset += counts[j];
  // Every rank's copy of this rank's block, rank by rank.
  std::vector<uint8_t> received(std::max<int64_t>(1, n * own * DTypeSize(dtype)));
  auto options = CollectiveOptions<gloo::AlltoallvOptions>(context_, tag, options_.group.timeout);
  options.setInput(data, ToBytes(counts, dtype));
  options.setOutput(received.data(), std::vector<int64_t>(n, own * DTypeSize(dtype)));
  gloo::alltoallv(options);
  uint8_t* block = data + offset * DTypeSize(dtype);
  if (dtype == DType::kF32) SumInRankOrder<float>(received.data(), n, own, block);
  if (dtype == DType::kBF16) SumBf16InRankOrder(received.data(), n, own, block);
  if (dtype == DType::kI32) SumInRankOrder<int32_t>(received.data(), n, own, block);
  if (dtype == DType::kI64) SumInRankOrder<int64_t>(received.data(), n, own, block);
}

void GlooCommunicator::AllGatherVOn(uint32_t tag, uint8_t* data, const std::vector<int64_t>& counts,
                                    DType dtype) {
  const size_t element = DTypeSize(dtype);
  int64_t offset = 0;
  for (int j = 0; j < rank(); ++j) offset += counts[j];
  // Gloo copies the input into the output: this rank's block goes in as a copy, so that the copy's
  // source and destination are not the same bytes.
  std::vector<uint8_t> own(data + offset * element, data + (offset + counts[rank()]) * element);
  own.resize(std::max<size_t>(own.size(), 1));
  std::vector<size_t> bytes(counts.size());
  for (size_t j = 0; j < counts.size(); ++j) bytes[j] = counts[j] * element;
  auto options = CollectiveOptions<gloo::AllgathervOptions>(context_, tag, options_.group.timeout);
  options.setInput(own.data(), bytes[rank()]);
  options.setOutput(data, std::move(bytes));
  gloo::allgatherv(options);
}

absl::StatusOr<std::unique_ptr<CommRequest>> GlooCommunicator::StartAllGather(const void* send,
                                                                              void* recv,
                                                                              int64_t count,
                                                                              DType dtype) {
  MOETRAIN_RETURN_IF_ERROR(CheckAllGather(Op("all_gather"), send, recv, count, dtype));
  MOETRAIN_RETURN_IF_ERROR(Broken("all_gather"));
  if (count == 0) return CompletedRequest(absl::OkStatus());
  const size_t bytes = count * DTypeSize(dtype);
  return Submit("all_gather", [this, send = Bytes(send), recv = Bytes(recv), bytes](uint32_t tag) {
    auto options = CollectiveOptions<gloo::AllgatherOptions>(context_, tag, options_.group.timeout);
    options.setInput(send, bytes);
    options.setOutput(recv, bytes * size());
    gloo::allgather(options);
  });
}

absl::StatusOr<std::unique_ptr<CommRequest>> GlooCommunicator::StartBroadcast(void* data,
                                                                              int64_t count,
                                                                              DType dtype,
                                                                              int root) {
  MOETRAIN_RETURN_IF_ERROR(CheckBroadcast(Op("broadcast"), data, count, dtype, root));
  MOETRAIN_RETURN_IF_ERROR(Broken("broadcast"));
  if (count == 0) return CompletedRequest(absl::OkStatus());
  const size_t bytes = count * DTypeSize(dtype);
  return Submit("broadcast", [this, data = Bytes(data), bytes, root](uint32_t tag) {
    auto options = CollectiveOptions<gloo::BroadcastOptions>(context_, tag, options_.group.timeout);
    options.setOutput(data, bytes);
    options.setRoot(root);
    gloo::broadcast(options);
  });
}

absl::StatusOr<std::unique_ptr<CommRequest>> GlooCommunicator::StartBarrier() {
  return Submit("barrier", [this](uint32_t tag) {
    auto options = CollectiveOptions<gloo::BarrierOptions>(context_, tag, options_.group.timeout);
    gloo::barrier(options);
  });
}

absl::StatusOr<std::unique_ptr<Communicator>> GlooCommunicator::Subgroup(
    const std::vector<int>& ranks) {
  MOETRAIN_ASSIGN_OR_RETURN(const int group_rank, CheckSubgroup(Op("subgroup"), ranks));
  MOETRAIN_RETURN_IF_ERROR(Broken("subgroup"));
  int serial;
  {
    absl::MutexLock lock(&mu_);
    serial = subgroups_made_++;
  }
  if (ranks.size() == 1) return std::make_unique<LocalCommunicator>();
  GlooOptions options = options_;
  options.group.prefix =
      absl::StrCat(options_.group.prefix, "/group", serial, "/", absl::StrJoin(ranks, ","));
  options.group.rank = group_rank;
  options.group.size = static_cast<int>(ranks.size());
  MOETRAIN_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> group, Create(options));
  return group;
}

}  // namespace moetrain
