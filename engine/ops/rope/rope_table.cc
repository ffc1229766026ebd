#include "engine/ops/rope/rope_table.h"

#include <cmath>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "engine/ops/rope/rope_math.h"

namespace moetrain::ops {
namespace {

class RopeCache {
 public:
  std::shared_ptr<const RopeTable> Get(int64_t seq_len, int64_t head_dim, float theta) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& table : tables_) {
      if (table->seq_len == seq_len && table->head_dim == head_dim && table->theta == theta) {
        return table;
      }
    }
    auto table = std::make_shared<RopeTable>();
    *table = {seq_len, head_dim, theta, {}, {}};
    const int64_t half = head_dim / 2;
    table->cos.resize(seq_len * half);
    table->sin.resize(seq_len * half);
    for (int64_t p = 0; p < seq_len; ++p) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = RopeAngle(p, i, head_dim, theta);
        table->cos[p * half + i] = static_cast<float>(std::cos(angle));
        table->sin[p * half + i] = static_cast<float>(std::sin(angle));
      }
    }
    if (tables_.size() >= kMaxTables) tables_.erase(tables_.begin());
    tables_.push_back(table);
    return table;
  }

 private:
  static constexpr size_t kMaxTables = 8;
  std::mutex mu_;
  std::vector<std::shared_ptr<const RopeTable>> tables_ ABSL_GUARDED_BY(mu_);  // oldest first
};

}  // namespace

std::shared_ptr<const RopeTable> CachedRopeTable(int64_t seq_len, int64_t head_dim, float theta) {
  static RopeCache* cache = new RopeCache();
  return cache->Get(seq_len, head_dim, theta);
}

}  // namespace moetrain::ops
