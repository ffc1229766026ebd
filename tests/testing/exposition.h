// A reader of the Prometheus text exposition format 0.0.4, for tests: what a /metrics body says
// (families' HELP and TYPE, samples as name, labels and value), compared on that rather than on
// the exact text, whose label order, number spelling and line order are the serializer's choice.
//
//   absl::StatusOr<Exposition> parsed = ParseExposition(registry.Serialize());
//   EXPECT_EQ(parsed->Value("moetrain_rpcs_total", {{"method", "GetJob"}, {"code", "OK"}}), 3);
//   EXPECT_EQ(SeriesValue(*parsed, R"(moetrain_rpcs_total{code="OK",method="GetJob"})"), 3);
//
// Header-only, beside testing.h: any test includes it as "tests/testing/exposition.h".
#ifndef MOETRAIN_TESTS_TESTING_EXPOSITION_H_
#define MOETRAIN_TESTS_TESTING_EXPOSITION_H_

#include <cstdlib>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace moetrain::testutil {

using ExpositionLabels = std::map<std::string, std::string>;

struct ExpositionSample {
  std::string name;         // as written: a histogram's series end in _bucket, _sum, _count
  ExpositionLabels labels;  // unescaped values
  double value = 0;
};

struct Exposition {
  std::map<std::string, std::string> help;  // family name → help, unescaped
  std::map<std::string, std::string> type;  // family name → "counter", "gauge", "histogram", ...
  std::vector<ExpositionSample> samples;    // in the order written

  // The family's # TYPE, or "" when it has none.
  std::string TypeOf(const std::string& family) const {
    auto it = type.find(family);
    return it == type.end() ? "" : it->second;
  }

  // The value of the one sample with this name and exactly these labels, if written.
  std::optional<double> Value(absl::string_view name, const ExpositionLabels& labels = {}) const {
    for (const ExpositionSample& sample : samples) {
      if (sample.name == name && sample.labels == labels) return sample.value;
    }
    return std::nullopt;
  }

  // One histogram child's series: the cumulative bucket counts by bound as written ("+Inf"
  // included), its _sum and _count, for the child with exactly `labels` (le aside).
  struct HistogramSeries {
    std::map<std::string, double> buckets;
    std::optional<double> sum;
    std::optional<double> count;
  };
  HistogramSeries Histogram(const std::string& name, const ExpositionLabels& labels = {}) const {
    HistogramSeries out;
    for (const ExpositionSample& sample : samples) {
      ExpositionLabels others = sample.labels;
      const auto le = others.find("le");
      std::string bound;
      if (le != others.end()) {
        bound = le->second;
        others.erase(le);
      }
      if (others != labels) continue;
      if (sample.name == name + "_bucket" && !bound.empty()) out.buckets[bound] = sample.value;
      if (sample.name == name + "_sum") out.sum = sample.value;
      if (sample.name == name + "_count") out.count = sample.value;
    }
    return out;
  }

  // The samples that have the label `label_name` = `value` (say, every series of one job).
  std::vector<ExpositionSample> WithLabel(absl::string_view label_name,
                                          absl::string_view value) const {
    std::vector<ExpositionSample> found;
    for (const ExpositionSample& sample : samples) {
      auto it = sample.labels.find(std::string(label_name));
      if (it != sample.labels.end() && it->second == value) found.push_back(sample);
    }
    return found;
  }
};

// For gtest's messages: `name{a="x",b="y"} value`.
inline void PrintTo(const ExpositionSample& sample, std::ostream* out) {
  const char* separator = "";
  *out << sample.name << "{";
  for (const auto& [name, value] : sample.labels) {
    *out << separator << name << "=\"" << value << "\"";
    separator = ",";
  }
  *out << "} " << sample.value;
}

inline bool operator==(const ExpositionSample& a, const ExpositionSample& b) {
  // NaN equals NaN here: the same text read twice is the same exposition.
  const bool same_value = a.value == b.value || (a.value != a.value && b.value != b.value);
  return a.name == b.name && a.labels == b.labels && same_value;
}

namespace exposition_internal {

inline bool IsNameChar(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
         (!first && c >= '0' && c <= '9');
}

// Reads a name off the front of `text`; empty when there is none.
inline std::string ConsumeName(absl::string_view* text) {
  size_t n = 0;
  while (n < text->size() && IsNameChar((*text)[n], n == 0)) ++n;
  std::string name(text->substr(0, n));
  text->remove_prefix(n);
  return name;
}

// Undoes \\, \" (label values only) and \n.
inline absl::StatusOr<std::string> Unescape(absl::string_view text, bool quote) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\') {
      out.push_back(text[i]);
      continue;
    }
    if (++i == text.size()) return absl::InvalidArgumentError("a trailing backslash");
    if (text[i] == '\\' || (quote && text[i] == '"')) {
      out.push_back(text[i]);
    } else if (text[i] == 'n') {
      out.push_back('\n');
    } else {
      return absl::InvalidArgumentError(absl::StrCat("the escape \\", text.substr(i, 1)));
    }
  }
  return out;
}

// `{a="x",b="y"}` off the front of `text`, into `labels`.
inline absl::Status ConsumeLabels(absl::string_view* text, ExpositionLabels* labels) {
  if (!absl::ConsumePrefix(text, "{")) return absl::OkStatus();
  while (!absl::ConsumePrefix(text, "}")) {
    const std::string name = ConsumeName(text);
    if (name.empty() || !absl::ConsumePrefix(text, "=\"")) {
      return absl::InvalidArgumentError(absl::StrCat("a label at \"", *text, "\""));
    }
    size_t end = 0;
    while (end < text->size() && (*text)[end] != '"') end += (*text)[end] == '\\' ? 2 : 1;
    if (end >= text->size()) return absl::InvalidArgumentError("an unterminated label value");
    absl::StatusOr<std::string> value = Unescape(text->substr(0, end), /*quote=*/true);
    if (!value.ok()) return value.status();
    if (!labels->emplace(name, *value).second) {
      return absl::InvalidArgumentError(absl::StrCat("the label ", name, " twice"));
    }
    text->remove_prefix(end + 1);
    absl::ConsumePrefix(text, ",");
  }
  return absl::OkStatus();
}

}  // namespace exposition_internal

// InvalidArgument, naming the line, for text that is not the format: a sample line that does not
// parse, a number that is not one, a # TYPE or # HELP given twice, a series (name and labels)
// written twice.
inline absl::StatusOr<Exposition> ParseExposition(absl::string_view text) {
  using namespace exposition_internal;
  Exposition parsed;
  std::set<std::pair<std::string, ExpositionLabels>> series;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("exposition line ", line_number, " \"", line, "\": ", what));
    };
    if (line.empty()) continue;
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "# HELP ") || absl::ConsumePrefix(&rest, "# TYPE ")) {
      const bool help = absl::StartsWith(line, "# HELP ");
      const std::string name = ConsumeName(&rest);
      if (name.empty() || !absl::ConsumePrefix(&rest, " ")) return error("no metric name");
      absl::StatusOr<std::string> value =
          help ? Unescape(rest, /*quote=*/false) : absl::StatusOr<std::string>(std::string(rest));
      if (!value.ok()) return error(value.status().message());
      if (!(help ? parsed.help : parsed.type).emplace(name, *value).second) {
        return error("a second one for the family");
      }
      continue;
    }
    if (absl::StartsWith(line, "#")) continue;
    ExpositionSample sample;
    sample.name = ConsumeName(&rest);
    if (sample.name.empty()) return error("no metric name");
    if (absl::Status status = ConsumeLabels(&rest, &sample.labels); !status.ok()) {
      return error(status.message());
    }
    if (!absl::ConsumePrefix(&rest, " ")) return error("no space before the value");
    // An optional timestamp follows the value.
    const std::string value(rest.substr(0, rest.find(' ')));
    char* end = nullptr;
    sample.value = std::strtod(value.c_str(), &end);
    if (value.empty() || end != value.c_str() + value.size()) return error("a bad value");
    if (!series.emplace(sample.name, sample.labels).second) return error("the series twice");
    parsed.samples.push_back(std::move(sample));
  }
  return parsed;
}

// ParseExposition for a test: an error fails it, and leaves an empty Exposition.
inline Exposition MustParseExposition(absl::string_view text) {
  absl::StatusOr<Exposition> parsed = ParseExposition(text);
  EXPECT_TRUE(parsed.ok()) << parsed.status() << "\nin:\n" << text;
  return parsed.ok() ? *std::move(parsed) : Exposition{};
}

// The value of `series`, written as in the text (`name{a="x",b="y"}`, labels in any order), in
// `parsed`, if it is there; a series that does not parse fails the test.
inline std::optional<double> SeriesValue(const Exposition& parsed, absl::string_view series) {
  const Exposition wanted = MustParseExposition(absl::StrCat(series, " 0\n"));
  if (wanted.samples.size() != 1) return std::nullopt;
  return parsed.Value(wanted.samples[0].name, wanted.samples[0].labels);
}

}  // namespace moetrain::testutil

#endif  // MOETRAIN_TESTS_TESTING_EXPOSITION_H_
