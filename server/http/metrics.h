// Prometheus metrics for the coordinator: a registry of metric families (counters, gauges,
// histograms) with fixed label names, written out in the text exposition format 0.0.4 for
// `/metrics`.
//
//   MetricsRegistry registry;
//   MOETRAIN_ASSIGN_OR_RETURN(Family<Counter>* rpcs,
//       registry.AddCounter("moetrain_rpcs_total", "RPCs handled.", {"method", "code"}));
//   MOETRAIN_ASSIGN_OR_RETURN(Counter* get_ok, rpcs->WithLabels({"GetJob", "OK"}));
//   get_ok->Increment();                 // lock-free; keep the pointer for hot paths
//   std::string text = registry.Serialize();
//
// Every metric and family is thread-safe. A child returned by WithLabels lives at the same
// address until it is removed (Family::Remove, RemoveWhere), else as long as the registry; whoever
// removes children makes sure that nobody still uses pointers to them. Errors name the metric,
// label or value at fault.
#ifndef MOETRAIN_SERVER_HTTP_METRICS_H_
#define MOETRAIN_SERVER_HTTP_METRICS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace moetrain::server {

enum class MetricType { kCounter, kGauge, kHistogram };

// "counter", "gauge" or "histogram", as on a `# TYPE` line.
const char* MetricTypeName(MetricType type);

// A monotonic total. Increment by a negative amount or NaN is ignored: a counter never goes down,
// and a bad sample must not take the daemon down either.
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  void Increment(double amount = 1.0) {
    if (!(amount >= 0.0)) return;
    value_.fetch_add(amount, std::memory_order_relaxed);
  }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down.
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double amount) { value_.fetch_add(amount, std::memory_order_relaxed); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Counts observations into buckets with fixed upper bounds (a value equal to a bound falls in
// that bucket) plus an implicit +Inf bucket, and sums them. NaN counts only in +Inf.
class Histogram {
 public:
  // `upper_bounds` are strictly increasing and finite, and outlive the histogram (the family
  // owns them).
  explicit Histogram(absl::Span<const double> upper_bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void Observe(double value);

  absl::Span<const double> upper_bounds() const { return upper_bounds_; }
  // Observations per bucket, not cumulative; the last entry is the +Inf bucket.
  std::vector<uint64_t> BucketCounts() const;
  double Sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  absl::Span<const double> upper_bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> bucket_counts_;  // (upper_bounds_.size() + 1)
  std::atomic<double> sum_{0.0};
};

// `count` bounds start, start·factor, start·factor², … (start > 0, factor > 1).
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// `count` bounds start, start + width, start + 2·width, … (width > 0).
std::vector<double> LinearBuckets(double start, double width, int count);

namespace metrics_internal {

// Orders children by their label values, and finds them without building a key.
struct LabelValuesLess {
  using is_transparent = void;
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return std::lexicographical_compare(
        a.begin(), a.end(), b.begin(), b.end(),
        [](absl::string_view x, absl::string_view y) { return x < y; });
  }
};

}  // namespace metrics_internal

// What a family of any type has: its name, help, type and label names, and its text.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  // Appends `# HELP`, `# TYPE` and the samples of every child, in label-value order; nothing
  // when the family has no child yet.
  virtual void AppendText(std::string* out) const = 0;

  // Removes every child whose label `label_name` has `value` (a job's series once the job is
  // gone) and returns how many; 0 when the family has no such label. Pointers to the removed
  // children dangle from here on.
  virtual int RemoveWhere(absl::string_view label_name, absl::string_view value) = 0;

 protected:
  FamilyBase(std::string name, std::string help, MetricType type,
             std::vector<std::string> label_names);

  // Checks the values against the label names and escapes them into `a="x",b="y"`.
  absl::StatusOr<std::string> LabelText(absl::Span<const absl::string_view> label_values) const;
  // Appends the two comment lines.
  void AppendHeader(std::string* out) const;

 private:
  std::string name_;
  std::string help_;
  MetricType type_;
  std::vector<std::string> label_names_;
};

// The metrics of one name, one child per distinct tuple of label values. T is Counter, Gauge or
// Histogram.
template <typename T>
class Family final : public FamilyBase {
 public:
  // The child for these label values (one per label name, in order), created on first use.
  // InvalidArgument on the wrong number of values or a value that is not UTF-8. The pointer is
  // stable: look a child up once and keep it where it is updated often.
  absl::StatusOr<T*> WithLabels(absl::Span<const absl::string_view> label_values);

  // Removes the child for these label values, so that it is no longer written; a later
  // WithLabels makes a new one from zero. False when there is no such child (nothing to do);
  // the one child of an unlabelled family is never removed. A pointer to the removed child
  // dangles from here on.
  bool Remove(absl::Span<const absl::string_view> label_values);

  void AppendText(std::string* out) const override;
  int RemoveWhere(absl::string_view label_name, absl::string_view value) override;

 private:
  friend class MetricsRegistry;
  struct Child {
    std::string label_text;  // `a="x",b="y"`, escaped; empty without labels
    std::unique_ptr<T> metric;
  };

  Family(std::string name, std::string help, MetricType type, std::vector<std::string> label_names,
         std::vector<double> upper_bounds);

  const std::vector<double> upper_bounds_;  // histograms only
  mutable std::shared_mutex mu_;
  std::map<std::vector<std::string>, Child, metrics_internal::LabelValuesLess> children_
      ABSL_GUARDED_BY(mu_);
};

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

// Owns the families of one process and writes them out. Names must match
// [a-zA-Z_:][a-zA-Z0-9_:]*, start with `moetrain_`, and be unique; a counter's name ends in
// `_total` and no other's does; `_bucket`, `_count` and `_sum` endings are left to histogram
// series. Label names match [a-zA-Z_][a-zA-Z0-9_]*, do not start with `__`, and are distinct;
// a histogram may not have the label `le`. Help text is non-empty UTF-8.
class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // InvalidArgument for a bad name, label name or help; AlreadyExists for a name taken. An
  // unlabelled family has its one child from the start, so it is written as 0 before any update.
  absl::StatusOr<Family<Counter>*> AddCounter(absl::string_view name, absl::string_view help,
                                              std::vector<std::string> label_names = {});
  absl::StatusOr<Family<Gauge>*> AddGauge(absl::string_view name, absl::string_view help,
                                          std::vector<std::string> label_names = {});
  // `upper_bounds` strictly increasing and finite; a last +Inf is accepted and dropped (+Inf is
  // always there).
  absl::StatusOr<Family<Histogram>*> AddHistogram(absl::string_view name, absl::string_view help,
                                                  std::vector<std::string> label_names,
                                                  std::vector<double> upper_bounds);

  // Runs `collect` at the start of every Serialize, to set gauges from state read elsewhere
  // (jobs by state from the store). Collectors run one scrape at a time, in the order added;
  // one must not call Serialize or AddCollector.
  void AddCollector(std::function<void()> collect);

  // The text exposition format 0.0.4: families by name, children by label values, numbers in
  // the shortest form that parses back to the same double (+Inf, -Inf, NaN spelled so).
  std::string Serialize() const;

 private:
  absl::Status CheckNewFamily(absl::string_view name, absl::string_view help, MetricType type,
                              const std::vector<std::string>& label_names) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  template <typename T>
  absl::StatusOr<Family<T>*> Add(absl::string_view name, absl::string_view help, MetricType type,
                                 std::vector<std::string> label_names,
                                 std::vector<double> upper_bounds);

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<FamilyBase>, std::less<>> families_ ABSL_GUARDED_BY(mu_);
  // Held through a whole Serialize, so that one scrape's collectors and text go together.
  mutable std::mutex collect_mu_;
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(collect_mu_);
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_HTTP_METRICS_H_
