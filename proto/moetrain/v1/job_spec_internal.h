// What the parts of the job-spec library share: the parsing (job_spec.cc, job_spec_tree.cc,
// job_spec_convert.cc), printing (job_spec_print.cc), defaults (job_spec_defaults.cc) and
// validation (job_spec_validate.cc). Not for use outside them.
#ifndef MOETRAIN_PROTO_MOETRAIN_V1_JOB_SPEC_INTERNAL_H_
#define MOETRAIN_PROTO_MOETRAIN_V1_JOB_SPEC_INTERNAL_H_

#include <google/protobuf/descriptor.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace moetrain::job_spec_internal {

// Bounds that keep workers × devices_per_worker far from overflowing.
inline constexpr int64_t kMaxWorkers = int64_t{1} << 20;
inline constexpr int64_t kMaxDevicesPerWorker = 1024;

// Most bytes of a value an error message quotes: a huge value is quoted by its start and size.
inline constexpr size_t kQuotedBytes = 200;

// The first kQuotedBytes of `text` at most, never splitting a UTF-8 character.
inline absl::string_view QuotedPart(absl::string_view text) {
  if (text.size() <= kQuotedBytes) return text;
  size_t cut = kQuotedBytes;
  for (int i = 0; i < 3 && cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80; ++i) {
    --cut;
  }
  return text.substr(0, cut);
}

// What follows a cut value: "... (N bytes)", or nothing when it was not cut.
inline std::string CutSuffix(absl::string_view text) {
  if (text.size() <= kQuotedBytes) return "";
  return absl::StrCat("... (", text.size(), " bytes)");
}

// `text` for an error message: whole when short, else its start and size.
inline std::string Shown(absl::string_view text) {
  return absl::StrCat(QuotedPart(text), CutSuffix(text));
}

// `text` in `quote`s: 'abc', or 'abcd...'... (N bytes) for a huge one.
inline std::string Quoted(absl::string_view text, absl::string_view quote) {
  return absl::StrCat(quote, QuotedPart(text), quote, CutSuffix(text));
}

// "model.moe" + "top_k" = "model.moe.top_k"; a top-level field has no prefix.
inline std::string Join(absl::string_view path, absl::string_view name) {
  return path.empty() ? std::string(name) : absl::StrCat(path, ".", name);
}

// "SOFTMAX, SIGMOID": the value names of an enum.
inline std::string EnumNames(const google::protobuf::EnumDescriptor* type) {
  std::vector<std::string> names;
  for (int i = 0; i < type->value_count(); ++i) names.push_back(type->value(i)->name());
  return absl::StrJoin(names, ", ");
}

// The shortest text that reads back to the same value (job_spec_print.cc).
std::string FloatText(float value);
std::string DoubleText(double value);

}  // namespace moetrain::job_spec_internal

#endif  // MOETRAIN_PROTO_MOETRAIN_V1_JOB_SPEC_INTERNAL_H_
