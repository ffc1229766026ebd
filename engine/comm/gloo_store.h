// Gloo's view of our KeyValueStore (gloo::rendezvous::Store): how Gloo ranks exchange the
// addresses they listen on. Internal to the Gloo communicator.
#ifndef MOETRAIN_ENGINE_COMM_GLOO_STORE_H_
#define MOETRAIN_ENGINE_COMM_GLOO_STORE_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/comm/communicator.h"
#include "gloo/rendezvous/store.h"

namespace moetrain {

// Gloo reports a failure by throwing; this adapter throws gloo::IoException and keeps the first
// failure's Status (a DeadlineExceeded naming the key nobody set), so the caller can return
// that instead of the exception's text.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  // `timeout` bounds every get and wait: the group's timeout, whatever Gloo passes (it passes its
  // context's, which the communicator shortens while connecting).
  GlooStoreAdapter(std::shared_ptr<KeyValueStore> store, absl::Duration timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // The first failure, OK if none, and the key it was about.
  absl::Status failure() const;
  std::string failed_key() const;

 private:
  // The value of `key`, from the cache of values a wait fetched or from the store.
  std::string Fetch(const std::string& key, absl::Duration timeout);
  // Records `status` (when it is the first failure) and throws it as a gloo::IoException.
  [[noreturn]] void Fail(const std::string& key, const absl::Status& status);

  const std::shared_ptr<KeyValueStore> store_;
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> fetched_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::string failed_key_ ABSL_GUARDED_BY(mu_);
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_COMM_GLOO_STORE_H_
