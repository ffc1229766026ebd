#include "worker/rendezvous_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "moetrain/v1/backoff.h"
#include "moetrain/v1/proto_time.h"

namespace moetrain {
namespace {

constexpr absl::Duration kInitialBackoff = absl::Milliseconds(50);
constexpr absl::Duration kMaxBackoff = absl::Seconds(2);
// One long poll at most this long, so that a coordinator restart is noticed soon.
constexpr absl::Duration kLongestPoll = absl::Seconds(10);
// One long poll at least this long: the coordinator refuses a KvWait without a timeout
// (INVALID_ARGUMENT), and a Get with no time left still asks once.
constexpr absl::Duration kShortestPoll = absl::Milliseconds(1);
// What a call may take beyond its wait at the coordinator.
constexpr absl::Duration kCallSlack = absl::Seconds(5);

bool Retryable(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsResourceExhausted(status) ||
         absl::IsAborted(status);
}

}  // namespace

CoordinatorKeyValueStore::CoordinatorKeyValueStore(Connection connection, std::string job_id,
                                                   int64_t attempt)
    : connection_(std::move(connection)),
      stub_(v1::WorkerService::NewStub(connection_.channel)),
      job_id_(std::move(job_id)),
      attempt_(attempt) {}

std::string CoordinatorKeyValueStore::Describe(const std::string& key) const {
  return absl::StrCat("rendezvous key '", key, "' of job ", job_id_, " attempt ", attempt_);
}

absl::Status CoordinatorKeyValueStore::Set(const std::string& key, const std::string& value) {
  v1::KvSetRequest request;
  request.set_job_id(job_id_);
  request.set_attempt(attempt_);
  request.set_key(key);
  request.set_value(value);
  Backoff backoff(
      {.initial = kInitialBackoff, .max = kMaxBackoff, .deadline = absl::Now() + set_timeout});
  while (true) {
    grpc::ClientContext context;
    connection_.Prepare(&context, kCallSlack);
    v1::KvSetResponse response;
    const absl::Status status = FromGrpcStatus(stub_->KvSet(&context, request, &response));
    if (status.ok()) return status;
    if (!Retryable(status) || backoff.Expired()) {
      return absl::Status(status.code(),
                          absl::StrCat("setting ", Describe(key), ": ", status.message()));
    }
    absl::SleepFor(backoff.Next());
  }
}

absl::StatusOr<std::string> CoordinatorKeyValueStore::Get(const std::string& key,
                                                          absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Backoff backoff({.initial = kInitialBackoff, .max = kMaxBackoff, .deadline = deadline});
  // The first round asks even when no time is left: a key already set is returned, as
  // KeyValueStore promises (GlooStoreAdapter::wait hands later keys what is left of one deadline).
  for (bool first = true;; first = false) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration() && !first) {
      return absl::DeadlineExceededError(
          absl::StrCat(Describe(key), " was not set within ", absl::FormatDuration(timeout),
                       " (a rank of the gang did not start or could not reach the coordinator)"));
    }
    v1::KvWaitRequest request;
    request.set_job_id(job_id_);
    request.set_attempt(attempt_);
    request.set_key(key);
    const absl::Duration wait = std::clamp(left, kShortestPoll, kLongestPoll);
    ToProtoDuration(wait, request.mutable_timeout());
    grpc::ClientContext context;
    connection_.Prepare(&context, wait + kCallSlack);
    v1::KvWaitResponse response;
    const absl::Status status = FromGrpcStatus(stub_->KvWait(&context, request, &response));
    if (status.ok()) return std::move(*response.mutable_value());
    if (absl::IsDeadlineExceeded(status)) continue;  // not set yet: poll again
    if (!Retryable(status)) {
      return absl::Status(status.code(),
                          absl::StrCat("reading ", Describe(key), ": ", status.message()));
    }
    absl::SleepFor(backoff.Next());
  }
}

absl::StatusOr<std::string> LocalAddressToward(const std::string& target) {
  absl::string_view address = target;
  for (absl::string_view scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::ConsumePrefix(&address, scheme)) break;
  }
  if (absl::StartsWith(address, "unix:")) return std::string("127.0.0.1");
  std::string host, port = "7070";
  if (absl::ConsumePrefix(&address, "[")) {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("address '", target, "': no closing ]"));
    }
    host = std::string(address.substr(0, close));
    if (address.size() > close + 2) port = std::string(address.substr(close + 2));
  } else {
    const size_t colon = address.rfind(':');
    host = std::string(address.substr(0, colon));
    if (colon != absl::string_view::npos) port = std::string(address.substr(colon + 1));
  }
  addrinfo hints = {};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); error != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve '", host, "' of address '", target,
                                               "': ", gai_strerror(error)));
  }
  std::string local;
  for (addrinfo* candidate = found; candidate != nullptr && local.empty();
       candidate = candidate->ai_next) {
    const int fd = socket(candidate->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage self = {};
    socklen_t length = sizeof(self);
    char text[INET6_ADDRSTRLEN] = {};
    if (connect(fd, candidate->ai_addr, candidate->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&self), &length) == 0) {
      const void* raw =
          self.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&self)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&self)->sin6_addr);
      if (inet_ntop(self.ss_family, raw, text, sizeof(text)) != nullptr) local = text;
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (local.empty()) {
    return absl::UnavailableError(absl::StrCat("no route to '", target, "'"));
  }
  return local;
}

}  // namespace moetrain
