#include "server/http/metrics.h"

#include <charconv>
#include <cmath>
#include <type_traits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace moetrain::server {
namespace {

constexpr absl::string_view kNamePrefix = "moetrain_";

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

bool IsValidMetricName(absl::string_view name) {
  if (name.empty() || !(IsNameStart(name[0]) || name[0] == ':')) return false;
  for (char c : name) {
    if (!(IsNameStart(c) || IsDigit(c) || c == ':')) return false;
  }
  return true;
}

bool IsValidLabelName(absl::string_view name) {
  if (name.empty() || !IsNameStart(name[0])) return false;
  for (char c : name) {
    if (!(IsNameStart(c) || IsDigit(c))) return false;
  }
  return true;
}

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

// HELP text escapes backslash and newline; label values also escape the double quote.
void AppendEscaped(absl::string_view s, bool escape_quote, std::string* out) {
  for (char c : s) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '"' && escape_quote) {
      out->append("\\\"");
    } else {
      out->push_back(c);
    }
  }
}

// The shortest text that parses back to `value`. Plain decimals where those read best (0.0003,
// 100000), exponents beyond; to_chars alone takes whichever is shorter, "3e-04" and "1e+05".
void AppendNumber(double value, std::string* out) {
  if (std::isnan(value)) {
    out->append("NaN");
    return;
  }
  if (std::isinf(value)) {
    out->append(value > 0 ? "+Inf" : "-Inf");
    return;
  }
  char buffer[64];
  const double magnitude = std::fabs(value);
  const std::to_chars_result result =
      magnitude == 0.0 || (magnitude >= 1e-4 && magnitude < 1e15)
          ? std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::fixed)
          : std::to_chars(buffer, buffer + sizeof(buffer), value);
  out->append(buffer, result.ptr);
}

void AppendCount(uint64_t count, std::string* out) {
  char buffer[24];
  const std::to_chars_result result = std::to_chars(buffer, buffer + sizeof(buffer), count);
  out->append(buffer, result.ptr);
}

// One sample line: `<name><suffix>{<labels>[,<extra>]} <value>`.
void AppendSampleStart(absl::string_view name, absl::string_view suffix,
                       absl::string_view label_text, absl::string_view extra_label,
                       std::string* out) {
  absl::StrAppend(out, name, suffix);
  if (!label_text.empty() || !extra_label.empty()) {
    out->push_back('{');
    out->append(label_text.data(), label_text.size());
    if (!label_text.empty() && !extra_label.empty()) out->push_back(',');
    out->append(extra_label.data(), extra_label.size());
    out->push_back('}');
  }
  out->push_back(' ');
}

void AppendSample(absl::string_view name, absl::string_view label_text, double value,
                  std::string* out) {
  AppendSampleStart(name, "", label_text, "", out);
  AppendNumber(value, out);
  out->push_back('\n');
}

void AppendHistogramSamples(absl::string_view name, absl::string_view label_text,
                            const Histogram& histogram, std::string* out) {
  // _count is the +Inf bucket, so the two agree even while observations land.
  const std::vector<uint64_t> counts = histogram.BucketCounts();
  const absl::Span<const double> upper_bounds = histogram.upper_bounds();
  uint64_t cumulative = 0;
  std::string le;
  for (size_t i = 0; i < counts.size(); ++i) {
    cumulative += counts[i];
    le = "le=\"";
    if (i < upper_bounds.size()) {
      AppendNumber(upper_bounds[i], &le);
    } else {
      le.append("+Inf");
    }
    le.push_back('"');
    AppendSampleStart(name, "_bucket", label_text, le, out);
    AppendCount(cumulative, out);
    out->push_back('\n');
  }
  AppendSampleStart(name, "_sum", label_text, "", out);
  AppendNumber(histogram.Sum(), out);
  out->push_back('\n');
  AppendSampleStart(name, "_count", label_text, "", out);
  AppendCount(cumulative, out);
  out->push_back('\n');
}

template <typename T>
std::unique_ptr<T> NewMetric(absl::Span<const double> upper_bounds) {
  if constexpr (std::is_same_v<T, Histogram>) {
    return std::make_unique<Histogram>(upper_bounds);
  } else {
    return std::make_unique<T>();
  }
}

}  // namespace

const char* MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// ---- Histogram ---------------------------------------------------------------------------

Histogram::Histogram(absl::Span<const double> upper_bounds)
    : upper_bounds_(upper_bounds),
      bucket_counts_(std::make_unique<std::atomic<uint64_t>[]>(upper_bounds.size() + 1)) {}

void Histogram::Observe(double value) {
  // The first bound >= value: a value equal to a bound counts in that bound's bucket.
  const size_t bucket = std::isnan(value)
                            ? upper_bounds_.size()
                            : std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) -
                                  upper_bounds_.begin();
  bucket_counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> counts(upper_bounds_.size() + 1);
  for (size_t i = 0; i < counts.size(); ++i) {
    counts[i] = bucket_counts_[i].load(std::memory_order_relaxed);
  }
  return counts;
}

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

FamilyBase::FamilyBase(std::string name, std::string help, MetricType type,
                       std::vector<std::string> label_names)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)) {}

absl::StatusOr<std::string> FamilyBase::LabelText(
    absl::Span<const absl::string_view> label_values) const {
  if (label_values.size() != label_names_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, " has ", label_names_.size(), " labels (", absl::StrJoin(label_names_, ", "),
        "), got ", label_values.size(), " values (", absl::StrJoin(label_values, ", "), ")"));
  }
  std::string text;
  for (size_t i = 0; i < label_values.size(); ++i) {
    if (!IsValidUtf8(label_values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, " label ", label_names_[i], ": value is not valid UTF-8"));
    }
    absl::StrAppend(&text, i == 0 ? "" : ",", label_names_[i], "=\"");
    AppendEscaped(label_values[i], /*escape_quote=*/true, &text);
    text.push_back('"');
  }
  return text;
}

void FamilyBase::AppendHeader(std::string* out) const {
  absl::StrAppend(out, "# HELP ", name_, " ");
  AppendEscaped(help_, /*escape_quote=*/false, out);
  absl::StrAppend(out, "\n# TYPE ", name_, " ", MetricTypeName(type_), "\n");
}

template <typename T>
Family<T>::Family(std::string name, std::string help, MetricType type,
                  std::vector<std::string> label_names, std::vector<double> upper_bounds)
    : FamilyBase(std::move(name), std::move(help), type, std::move(label_names)),
      upper_bounds_(std::move(upper_bounds)) {}

template <typename T>
absl::StatusOr<T*> Family<T>::WithLabels(absl::Span<const absl::string_view> label_values) {
  {
    std::shared_lock lock(mu_);
    auto it = children_.find(label_values);
    if (it != children_.end()) return it->second.metric.get();
  }
  absl::StatusOr<std::string> label_text = LabelText(label_values);
  if (!label_text.ok()) return label_text.status();
  std::unique_lock lock(mu_);
  // Another thread may have made it since the shared lock was let go; then its child is kept.
  auto it = children_.find(label_values);
  if (it == children_.end()) {
    it = children_
             .emplace(std::vector<std::string>(label_values.begin(), label_values.end()),
                      Child{*std::move(label_text), NewMetric<T>(upper_bounds_)})
             .first;
  }
  return it->second.metric.get();
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
void Family<T>::AppendText(std::string* out) const {
  std::shared_lock lock(mu_);
  if (children_.empty()) return;
  AppendHeader(out);
  for (const auto& [values, child] : children_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      AppendHistogramSamples(name(), child.label_text, *child.metric, out);
    } else {
      AppendSample(name(), child.label_text, child.metric->Value(), out);
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- Registry ----------------------------------------------------------------------------

absl::Status MetricsRegistry::CheckNewFamily(absl::string_view name, absl::string_view help,
                                             MetricType type,
                                             const std::vector<std::string>& label_names) const {
  if (!IsValidMetricName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric name \"", name, "\" does not match [a-zA-Z_:][a-zA-Z0-9_:]*"));
  }
  if (!absl::StartsWith(name, kNamePrefix)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric name \"", name, "\" does not start with \"", kNamePrefix, "\""));
  }
  const bool ends_in_total = absl::EndsWith(name, "_total");
  if (type == MetricType::kCounter && !ends_in_total) {
    return absl::InvalidArgumentError(
        absl::StrCat("counter name \"", name, "\" does not end in \"_total\""));
  }
  if (type != MetricType::kCounter && ends_in_total) {
    return absl::InvalidArgumentError(absl::StrCat(MetricTypeName(type), " name \"", name,
                                                   "\" ends in \"_total\", kept for counters"));
  }
  for (absl::string_view suffix : {"_bucket", "_count", "_sum"}) {
    if (absl::EndsWith(name, suffix)) {
      return absl::InvalidArgumentError(absl::StrCat("metric name \"", name, "\" ends in \"",
                                                     suffix, "\", kept for histogram series"));
    }
  }
  if (help.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("metric ", name, " has no help text"));
  }
  if (!IsValidUtf8(help)) {
    return absl::InvalidArgumentError(
        absl::StrCat("help text of metric ", name, " is not valid UTF-8"));
  }
  for (size_t i = 0; i < label_names.size(); ++i) {
    const std::string& label = label_names[i];
    if (!IsValidLabelName(label)) {
      return absl::InvalidArgumentError(absl::StrCat("label name \"", label, "\" of metric ", name,
                                                     " does not match [a-zA-Z_][a-zA-Z0-9_]*"));
    }
    if (absl::StartsWith(label, "__")) {
      return absl::InvalidArgumentError(absl::StrCat("label name \"", label, "\" of metric ", name,
                                                     " starts with \"__\", kept for Prometheus"));
    }
    if (type == MetricType::kHistogram && label == "le") {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram ", name, " may not have the label \"le\": it names buckets"));
    }
    if (std::find(label_names.begin(), label_names.begin() + i, label) != label_names.begin() + i) {
      return absl::InvalidArgumentError(
          absl::StrCat("label name \"", label, "\" of metric ", name, " appears twice"));
    }
  }
  if (families_.find(name) != families_.end()) {
    return absl::AlreadyExistsError(absl::StrCat("metric ", name, " is already registered"));
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<Family<T>*> MetricsRegistry::Add(absl::string_view name, absl::string_view help,
                                                MetricType type,
                                                std::vector<std::string> label_names,
                                                std::vector<double> upper_bounds) {
  std::lock_guard lock(mu_);
  if (absl::Status status = CheckNewFamily(name, help, type, label_names); !status.ok()) {
    return status;
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
  return Add<Counter>(name, help, MetricType::kCounter, std::move(label_names), {});
}

absl::StatusOr<Family<Gauge>*> MetricsRegistry::AddGauge(absl::string_view name,
                                                         absl::string_view help,
                                                         std::vector<std::string> label_names) {
  return Add<Gauge>(name, help, MetricType::kGauge, std::move(label_names), {});
}

absl::StatusOr<Family<Histogram>*> MetricsRegistry::AddHistogram(
    absl::string_view name, absl::string_view help, std::vector<std::string> label_names,
    std::vector<double> upper_bounds) {
  if (!upper_bounds.empty() && upper_bounds.back() == INFINITY) upper_bounds.pop_back();
  for (size_t i = 0; i < upper_bounds.size(); ++i) {
    if (!std::isfinite(upper_bounds[i])) {
      std::string bound;
      AppendNumber(upper_bounds[i], &bound);
      return absl::InvalidArgumentError(
          absl::StrCat("histogram ", name, " bucket bound ", i, " = ", bound, " is not finite"));
    }
    if (i > 0 && !(upper_bounds[i] > upper_bounds[i - 1])) {
      std::string bound, previous;
      AppendNumber(upper_bounds[i], &bound);
      AppendNumber(upper_bounds[i - 1], &previous);
      return absl::InvalidArgumentError(absl::StrCat("histogram ", name, " bucket bound ", i, " = ",
                                                     bound, " is not above bound ", i - 1, " = ",
                                                     previous));
    }
  }
  return Add<Histogram>(name, help, MetricType::kHistogram, std::move(label_names),
                        std::move(upper_bounds));
}

void MetricsRegistry::AddCollector(std::function<void()> collect) {
  std::lock_guard lock(collect_mu_);
  collectors_.push_back(std::move(collect));
}

std::string MetricsRegistry::Serialize() const {
  std::lock_guard collect_lock(collect_mu_);
  // Not under mu_: a collector may register a family or make children as it goes.
  for (const std::function<void()>& collect : collectors_) collect();
  std::string out;
  std::lock_guard lock(mu_);
  for (const auto& [name, family] : families_) family->AppendText(&out);
  return out;
}

}  // namespace moetrain::server
