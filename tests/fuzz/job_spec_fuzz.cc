// The job-spec parser (proto/moetrain/v1/job_spec.h) on arbitrary bytes, read as YAML and as
// JSON. Beyond not crashing, it checks the documented contracts: every refusal is
// InvalidArgument, and a spec that parses prints back (JobSpecToYaml, JobSpecToJson) to text that
// parses to an equal message, before and after ResolveJobSpec.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "moetrain/v1/job_spec.h"
#include "tests/fuzz/fuzz_util.h"

namespace moetrain::fuzz {
namespace {

// Byte-for-byte equal in protobuf's deterministic encoding (so a NaN equals itself).
bool SameSpec(const v1::JobSpec& a, const v1::JobSpec& b) {
  std::string a_bytes, b_bytes;
  {
    google::protobuf::io::StringOutputStream a_stream(&a_bytes), b_stream(&b_bytes);
    google::protobuf::io::CodedOutputStream a_out(&a_stream), b_out(&b_stream);
    a_out.SetSerializationDeterministic(true);
    b_out.SetSerializationDeterministic(true);
    a.SerializeToCodedStream(&a_out);
    b.SerializeToCodedStream(&b_out);
  }
  return a_bytes == b_bytes;
}

void CheckRoundTrip(const v1::JobSpec& spec, absl::string_view stage) {
  const std::string yaml = JobSpecToYaml(spec);
  absl::StatusOr<v1::JobSpec> from_yaml = ParseJobSpecYaml(yaml);
  if (!from_yaml.ok())
    Fail(absl::StrCat(stage, ": JobSpecToYaml output does not parse:\n", yaml), from_yaml.status());
  if (!SameSpec(*from_yaml, spec))
    Fail(absl::StrCat(stage, ": JobSpecToYaml output parses to another spec:\n", yaml));
  const std::string json = JobSpecToJson(spec);
  absl::StatusOr<v1::JobSpec> from_json = ParseJobSpecJson(json);
  if (!from_json.ok())
    Fail(absl::StrCat(stage, ": JobSpecToJson output does not parse:\n", json), from_json.status());
  if (!SameSpec(*from_json, spec))
    Fail(absl::StrCat(stage, ": JobSpecToJson output parses to another spec:\n", json));
}

void Check(const absl::StatusOr<v1::JobSpec>& parsed) {
  if (!parsed.ok()) {
    ExpectCode(parsed.status(), {absl::StatusCode::kInvalidArgument}, "ParseJobSpec");
    return;
  }
  CheckRoundTrip(*parsed, "parsed");
  absl::StatusOr<v1::JobSpec> resolved = ResolveJobSpec(*parsed);
  if (!resolved.ok()) {
    ExpectCode(resolved.status(), {absl::StatusCode::kInvalidArgument}, "ResolveJobSpec");
    return;
  }
  CheckRoundTrip(*resolved, "resolved");
  absl::StatusOr<v1::JobSpec> again = ResolveJobSpec(*resolved);
  if (!again.ok() || !SameSpec(*again, *resolved))
    Fail("ResolveJobSpec is not idempotent", again.status());
}

}  // namespace
}  // namespace moetrain::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  moetrain::fuzz::Check(moetrain::ParseJobSpecYaml(text));
  moetrain::fuzz::Check(moetrain::ParseJobSpecJson(text));
  return 0;
}
