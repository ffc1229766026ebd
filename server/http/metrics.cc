#include "server/http/metrics.h"

#include <prometheus/check_names.h>
#include <prometheus/text_serializer.h>

#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace moetrain::server {
namespace {

constexpr absl::string_view kNamePrefix = "moetrain_";

// Name parts that are not base units (the base unit: seconds, bytes, ratio).
constexpr absl::string_view kNonBaseUnits[] = {
    "ms",    "milliseconds", "us",        "microseconds", "ns",   "nanoseconds", "minutes",
    "hours", "days",         "kb",        "kilobytes",    "kib",  "mb",          "megabytes",
    "mib",   "gb",           "gigabytes", "gib",          "bits", "percent",     "percentage"};

// Prometheus rejects a whole scrape over one label value that is not UTF-8 (a job name from a
// user, say), so values are checked once, when their child is made.
bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char lead = static_cast<unsigned char>(s[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t continuation;
    uint32_t code_point, smallest;
    if ((lead & 0xE0) == 0xC0) {
      continuation = 1, code_point = lead & 0x1F, smallest = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      continuation = 2, code_point = lead & 0x0F, smallest = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      continuation = 3, code_point = lead & 0x07, smallest = 0x10000;
    } else {
      return false;
    }
    if (s.size() - i <= continuation) return false;
    for (size_t k = 1; k <= continuation; ++k) {
      const unsigned char byte = static_cast<unsigned char>(s[i + k]);
      if ((byte & 0xC0) != 0x80) return false;
      code_point = (code_point << 6) | (byte & 0x3F);
    }
    // Overlong forms, surrogates and values past Unicode are not UTF-8 either.
    if (code_point < smallest || code_point > 0x10FFFF ||
        (code_point >= 0xD800 && code_point <= 0xDFFF)) {
      return false;
    }
    i += continuation + 1;
  }
  return true;
}

// prometheus-cpp 1.0.1's TextSerializer escapes label values but writes help text as it is, so
// the help's backslashes and newlines are escaped here, once, at registration.
std::string EscapeHelp(absl::string_view help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out.append("\\\\");
    } else if (c == '\n') {
      out.append("\\n");
    } else {
      out.push_back(c);
    }
  }
  return out;
}

absl::Status CheckName(absl::string_view name, prometheus::MetricType type) {
  if (!prometheus::CheckMetricName(std::string(name))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metric name \"", name, "\" is not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)"));
  }
  if (!absl::StartsWith(name, kNamePrefix)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric name \"", name, "\" does not start with \"", kNamePrefix, "\""));
  }
  const bool ends_in_total = absl::EndsWith(name, "_total");
  if (type == prometheus::MetricType::Counter && !ends_in_total) {
    return absl::InvalidArgumentError(
        absl::StrCat("counter name \"", name, "\" does not end in \"_total\""));
  }
  if (type != prometheus::MetricType::Counter && ends_in_total) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric name \"", name, "\" ends in \"_total\", kept for counters"));
  }
  for (absl::string_view suffix : {"_bucket", "_count", "_sum"}) {
    if (absl::EndsWith(name, suffix)) {
      return absl::InvalidArgumentError(absl::StrCat("metric name \"", name, "\" ends in \"",
                                                     suffix, "\", kept for histogram series"));
    }
  }
  for (absl::string_view part : absl::StrSplit(name, absl::ByAnyChar("_:"))) {
    for (absl::string_view unit : kNonBaseUnits) {
      if (absl::EqualsIgnoreCase(part, unit)) {
        return absl::InvalidArgumentError(
            absl::StrCat("metric name \"", name, "\" has the unit \"", part,
                         "\": use base units (seconds, bytes, a 0-1 ratio)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLabelNames(absl::string_view name, prometheus::MetricType type,
                             const std::vector<std::string>& label_names) {
  for (size_t i = 0; i < label_names.size(); ++i) {
    const std::string& label = label_names[i];
    if (!prometheus::CheckLabelName(label)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label name \"", label, "\" of metric ", name,
          " is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with \"__\")"));
    }
    if (type == prometheus::MetricType::Histogram && label == "le") {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram ", name, " may not have the label \"le\": it names buckets"));
    }
    if (std::find(label_names.begin(), label_names.begin() + i, label) != label_names.begin() + i) {
      return absl::InvalidArgumentError(
          absl::StrCat("label name \"", label, "\" of metric ", name, " appears twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> bounds;
  for (int i = 0; i < count; ++i) bounds.push_back(start + i * width);
  return bounds;
}

// ---- Families ----------------------------------------------------------------------------

FamilyBase::FamilyBase(std::string name, std::string help, prometheus::MetricType type,
                       std::vector<std::string> label_names)
    : label_names_(std::move(label_names)) {
  family_.name = std::move(name);
  family_.help = EscapeHelp(help);
  family_.type = type;
}

absl::Status FamilyBase::CheckLabelValues(absl::Span<const absl::string_view> label_values) const {
  if (label_values.size() != label_names_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name(), " has ", label_names_.size(), " labels (", absl::StrJoin(label_names_, ", "),
        "), got ", label_values.size(), " values (", absl::StrJoin(label_values, ", "), ")"));
  }
  for (size_t i = 0; i < label_values.size(); ++i) {
    if (!IsValidUtf8(label_values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(), " label ", label_names_[i], ": value is not valid UTF-8"));
    }
  }
  return absl::OkStatus();
}

template <typename T>
Family<T>::Family(std::string name, std::string help, prometheus::MetricType type,
                  std::vector<std::string> label_names, std::vector<double> upper_bounds)
    : FamilyBase(std::move(name), std::move(help), type, std::move(label_names)),
      upper_bounds_(std::move(upper_bounds)) {}

template <typename T>
absl::StatusOr<T*> Family<T>::WithLabels(absl::Span<const absl::string_view> label_values) {
  {
    std::shared_lock lock(mu_);
    auto it = children_.find(label_values);
    if (it != children_.end()) return &it->second;
  }
  if (absl::Status status = CheckLabelValues(label_values); !status.ok()) return status;
  std::unique_lock lock(mu_);
  // Another thread may have made it since the shared lock was let go; then its child is kept.
  auto it = children_.find(label_values);
  if (it == children_.end()) {
    std::vector<std::string> key(label_values.begin(), label_values.end());
    if constexpr (std::is_same_v<T, Histogram>) {
      it = children_
               .emplace(std::piecewise_construct, std::forward_as_tuple(std::move(key)),
                        std::forward_as_tuple(upper_bounds_))
               .first;
    } else {
      it = children_.try_emplace(std::move(key)).first;
    }
  }
  return &it->second;
}

template <typename T>
bool Family<T>::Remove(absl::Span<const absl::string_view> label_values) {
  if (label_names().empty()) return false;
  std::unique_lock lock(mu_);
  auto it = children_.find(label_values);
  if (it == children_.end()) return false;
  children_.erase(it);
  return true;
}

template <typename T>
int Family<T>::RemoveWhere(absl::string_view label_name, absl::string_view value) {
  const std::vector<std::string>& names = label_names();
  const size_t index = std::find(names.begin(), names.end(), label_name) - names.begin();
  if (index == names.size()) return 0;
  int removed = 0;
  std::unique_lock lock(mu_);
  if (index == 0) {
    // Children are ordered by their values, so those whose first value is `value` are one run,
    // starting at the one-value prefix: no scan over every job's series.
    const absl::string_view prefix[] = {value};
    auto it = children_.lower_bound(absl::MakeConstSpan(prefix));
    while (it != children_.end() && it->first[0] == value) {
      it = children_.erase(it);
      ++removed;
    }
    return removed;
  }
  for (auto it = children_.begin(); it != children_.end();) {
    if (it->first[index] == value) {
      it = children_.erase(it);
      ++removed;
    } else {
      ++it;
    }
  }
  return removed;
}

template <typename T>
std::vector<prometheus::MetricFamily> Family<T>::Collect() const {
  std::shared_lock lock(mu_);
  if (children_.empty()) return {};
  prometheus::MetricFamily family = header();
  family.metric.reserve(children_.size());
  for (const auto& [values, child] : children_) {
    prometheus::ClientMetric& metric = family.metric.emplace_back(child.Collect());
    metric.label.reserve(values.size());
    for (size_t i = 0; i < values.size(); ++i)
      metric.label.push_back({label_names()[i], values[i]});
  }
  return {std::move(family)};
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- Registry ----------------------------------------------------------------------------

template <typename T>
absl::StatusOr<Family<T>*> MetricsRegistry::Add(absl::string_view name, absl::string_view help,
                                                prometheus::MetricType type,
                                                std::vector<std::string> label_names,
                                                std::vector<double> upper_bounds) {
  if (absl::Status status = CheckName(name, type); !status.ok()) return status;
  if (help.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("metric ", name, " has no help text"));
  }
  if (!IsValidUtf8(help)) {
    return absl::InvalidArgumentError(
        absl::StrCat("help text of metric ", name, " is not valid UTF-8"));
  }
  if (absl::Status status = CheckLabelNames(name, type, label_names); !status.ok()) return status;
  std::lock_guard lock(mu_);
  if (families_.find(name) != families_.end()) {
    return absl::AlreadyExistsError(absl::StrCat("metric ", name, " is already registered"));
  }
  const bool unlabelled = label_names.empty();
  // The constructor is private to the registry, so no make_unique.
  std::unique_ptr<Family<T>> family(new Family<T>(std::string(name), std::string(help), type,
                                                  std::move(label_names), std::move(upper_bounds)));
  Family<T>* result = family.get();
  if (unlabelled) {
    absl::StatusOr<T*> child = result->WithLabels({});
    if (!child.ok()) return child.status();
  }
  families_.emplace(std::string(name), std::move(family));
  return result;
}

absl::StatusOr<Family<Counter>*> MetricsRegistry::AddCounter(absl::string_view name,
                                                             absl::string_view help,
                                                             std::vector<std::string> label_names) {
  return Add<Counter>(name, help, prometheus::MetricType::Counter, std::move(label_names), {});
}

absl::StatusOr<Family<Gauge>*> MetricsRegistry::AddGauge(absl::string_view name,
                                                         absl::string_view help,
                                                         std::vector<std::string> label_names) {
  return Add<Gauge>(name, help, prometheus::MetricType::Gauge, std::move(label_names), {});
}

absl::StatusOr<Family<Histogram>*> MetricsRegistry::AddHistogram(
    absl::string_view name, absl::string_view help, std::vector<std::string> label_names,
    std::vector<double> upper_bounds) {
  if (!upper_bounds.empty() && upper_bounds.back() == INFINITY) upper_bounds.pop_back();
  for (size_t i = 0; i < upper_bounds.size(); ++i) {
    if (!std::isfinite(upper_bounds[i])) {
      return absl::InvalidArgumentError(absl::StrCat("histogram ", name, " bucket bound ", i, " = ",
                                                     upper_bounds[i], " is not finite"));
    }
    // prometheus::Histogram throws on bounds out of order; they are refused here instead.
    if (i > 0 && !(upper_bounds[i] > upper_bounds[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("histogram ", name, " bucket bound ", i, " = ",
                                                     upper_bounds[i], " is not above bound ", i - 1,
                                                     " = ", upper_bounds[i - 1]));
    }
  }
  return Add<Histogram>(name, help, prometheus::MetricType::Histogram, std::move(label_names),
                        std::move(upper_bounds));
}

void MetricsRegistry::AddCollector(std::function<void()> collect) {
  std::lock_guard lock(collect_mu_);
  collectors_.push_back(std::move(collect));
}

std::vector<const FamilyBase*> MetricsRegistry::Families() const {
  std::lock_guard lock(mu_);
  std::vector<const FamilyBase*> families;
  families.reserve(families_.size());
  for (const auto& [name, family] : families_) families.push_back(family.get());
  return families;
}

std::vector<prometheus::MetricFamily> MetricsRegistry::Collect() const {
  std::vector<prometheus::MetricFamily> collected;
  std::lock_guard lock(mu_);
  for (const auto& [name, family] : families_) {
    for (prometheus::MetricFamily& one : family->Collect()) collected.push_back(std::move(one));
  }
  return collected;
}

std::string MetricsRegistry::Serialize() const {
  std::lock_guard collect_lock(collect_mu_);
  // Not under mu_: a collector may register a family or make children as it goes.
  for (const std::function<void()>& collect : collectors_) collect();
  return prometheus::TextSerializer().Serialize(Collect());
}

}  // namespace moetrain::server
