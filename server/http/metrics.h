// Prometheus metrics for the coordinator: a thin facade over prometheus-cpp. The metrics are
// prometheus-cpp's (Counter, Gauge, Histogram), the text is its TextSerializer's (exposition
// format 0.0.4); the facade adds what the library lacks: removing a finished job's series by
// label value, UTF-8 checks on label values, errors as absl::Status, and the naming policy.
//
//   MetricsRegistry registry;
//   MOETRAIN_ASSIGN_OR_RETURN(Family<Counter>* rpcs,
//       registry.AddCounter("moetrain_rpcs_total", "RPCs handled.", {"method", "code"}));
//   MOETRAIN_ASSIGN_OR_RETURN(Counter* get_ok, rpcs->WithLabels({"GetJob", "OK"}));
//   get_ok->Increment();                 // lock-free; keep the pointer for hot paths
//   std::string text = registry.Serialize();
//
// Families are ours rather than prometheus::Family: its Remove (1.0.1) finds the child by a scan
// over all of them, so that removing 40,000 children (one job's per-expert series of a large
// model) took 12.7 s under the family's lock, stalling updates and scrapes. Every metric and family
// is thread-safe. A child returned by WithLabels lives at the same address until it is removed
// (Family::Remove, RemoveWhere), else as long as the registry; whoever removes children makes sure
// that nobody still uses pointers to them. Errors name the metric, label or value at fault.
#ifndef MOETRAIN_SERVER_HTTP_METRICS_H_
#define MOETRAIN_SERVER_HTTP_METRICS_H_

#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

#include <algorithm>
#include <cmath>
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

// A monotonic total. An increment by a negative amount or NaN is ignored: a counter never goes
// down, and a bad sample must not take the daemon down either (prometheus-cpp ignores negative
// amounts, not NaN).
class Counter {
 public:
  void Increment(double amount = 1.0) {
    if (!std::isnan(amount)) metric_.Increment(amount);
  }
  double Value() const { return metric_.Value(); }
  prometheus::ClientMetric Collect() const { return metric_.Collect(); }

 private:
  prometheus::Counter metric_;
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double value) { metric_.Set(value); }
  void Add(double amount) { metric_.Increment(amount); }
  double Value() const { return metric_.Value(); }
  prometheus::ClientMetric Collect() const { return metric_.Collect(); }

 private:
  prometheus::Gauge metric_;
};

// Counts observations into buckets with fixed upper bounds (a value equal to a bound falls in
// that bucket) plus the +Inf bucket, and sums them. NaN is ignored: prometheus-cpp would count it
// in the lowest bucket, and it would make the sum NaN for good.
class Histogram {
 public:
  // `upper_bounds` strictly increasing and finite (the registry checks them).
  explicit Histogram(const std::vector<double>& upper_bounds) : metric_(upper_bounds) {}

  void Observe(double value) {
    if (!std::isnan(value)) metric_.Observe(value);
  }
  prometheus::ClientMetric Collect() const { return metric_.Collect(); }

 private:
  prometheus::Histogram metric_;
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

// What a family of any type has: its name, type and label names, and its samples.
class FamilyBase : public prometheus::Collectable {
 public:
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  const std::string& name() const { return family_.name; }
  prometheus::MetricType type() const { return family_.type; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  // Removes every child whose label `label_name` has `value` (a job's series once the job is
  // gone) and returns how many; 0 when the family has no such label. Pointers to the removed
  // children dangle from here on.
  virtual int RemoveWhere(absl::string_view label_name, absl::string_view value) = 0;

 protected:
  FamilyBase(std::string name, std::string help, prometheus::MetricType type,
             std::vector<std::string> label_names);

  // InvalidArgument unless there is one value per label name, each valid UTF-8.
  absl::Status CheckLabelValues(absl::Span<const absl::string_view> label_values) const;
  // The family without samples (name, escaped help, type), to fill in Collect.
  const prometheus::MetricFamily& header() const { return family_; }

 private:
  prometheus::MetricFamily family_;
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

  int RemoveWhere(absl::string_view label_name, absl::string_view value) override;

  // The children in label-value order, labels in label-name order as declared; nothing when the
  // family has no child.
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  friend class MetricsRegistry;

  Family(std::string name, std::string help, prometheus::MetricType type,
         std::vector<std::string> label_names, std::vector<double> upper_bounds);

  const std::vector<double> upper_bounds_;  // histograms only
  mutable std::shared_mutex mu_;
  // Map nodes do not move, so a child's address is stable until it is erased.
  std::map<std::vector<std::string>, T, metrics_internal::LabelValuesLess> children_
      ABSL_GUARDED_BY(mu_);
};

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

// Owns the families of one process and writes them out. The naming policy, checked at
// registration: names are valid Prometheus names that start with `moetrain_` and are unique; a
// counter's name ends in `_total` and no other's does; `_bucket`, `_count` and `_sum` endings are
// left to histogram series; units are base units (no `_ms`, `_minutes`, `_kilobytes`,
// `_percent`, ...). Label names are valid Prometheus label names (not starting with `__`) and
// distinct; a histogram may not have the label `le`. Help text is non-empty UTF-8.
class MetricsRegistry : public prometheus::Collectable {
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

  // Every registered family, by name, children or not (to check the names of a whole process).
  std::vector<const FamilyBase*> Families() const;

  // The families with children, by name; does not run the collectors.
  std::vector<prometheus::MetricFamily> Collect() const override;

  // Runs the collectors, then prometheus-cpp's TextSerializer over Collect(): the text
  // exposition format 0.0.4. Numbers have up to 16 significant digits (integers up to 2^53 are
  // exact), NaN is written "Nan".
  std::string Serialize() const;

 private:
  template <typename T>
  absl::StatusOr<Family<T>*> Add(absl::string_view name, absl::string_view help,
                                 prometheus::MetricType type, std::vector<std::string> label_names,
                                 std::vector<double> upper_bounds);

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<FamilyBase>, std::less<>> families_ ABSL_GUARDED_BY(mu_);
  // Held through a whole Serialize, so that one scrape's collectors and text go together.
  mutable std::mutex collect_mu_;
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(collect_mu_);
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_HTTP_METRICS_H_
