#include "engine/comm/gloo_store.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gloo/common/error.h"

namespace moetrain {

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  const absl::Status status = store_->Set(key, std::string(data.begin(), data.end()));
  if (!status.ok()) Fail(key, status);
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  const std::string value = Fetch(key, timeout_);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& /*timeout*/) {
  wait(keys);
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) {
  const absl::Time deadline = absl::Now() + timeout_;
  for (const std::string& key : keys) {
    Fetch(key, std::max(deadline - absl::Now(), absl::ZeroDuration()));
  }
}

absl::Status GlooStoreAdapter::failure() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

std::string GlooStoreAdapter::Fetch(const std::string& key, absl::Duration timeout) {
  {
    absl::MutexLock lock(&mu_);
    auto it = fetched_.find(key);
    if (it != fetched_.end()) return it->second;
  }
  absl::StatusOr<std::string> value = store_->Get(key, timeout);
  if (!value.ok()) Fail(key, value.status());
  absl::MutexLock lock(&mu_);
  return fetched_.emplace(key, *std::move(value)).first->second;
}

std::string GlooStoreAdapter::failed_key() const {
  absl::MutexLock lock(&mu_);
  return failed_key_;
}

void GlooStoreAdapter::Fail(const std::string& key, const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (failure_.ok()) {
      failure_ = status;
      failed_key_ = key;
    }
  }
  throw gloo::IoException(std::string(status.message()));
}

}  // namespace moetrain
