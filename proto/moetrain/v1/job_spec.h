// The job spec as users write it: YAML or JSON in the protobuf JSON mapping of
// moetrain.v1.JobSpec (docs/job-spec.md), parsed, completed with defaults, validated, and
// printed back. Used by the CLI, the coordinator and the worker; never by the engine.
//
// The usual sequence:
//   absl::StatusOr<moetrain::v1::JobSpec> spec = moetrain::LoadJobSpecFile("job.yaml");
//   if (spec.ok()) spec = moetrain::ResolveJobSpec(*std::move(spec));
//
// Every error is InvalidArgument (NotFound for a missing file) and names the field by its path
// from the top of the spec: "model.moe.top_k: expected an integer, got 'abc' (line 9, column 12)",
// "unknown field model.moe.topk (did you mean top_k?)",
// "model.moe.top_k = 9 exceeds model.moe.num_experts = 8".
#ifndef MOETRAIN_PROTO_MOETRAIN_V1_JOB_SPEC_H_
#define MOETRAIN_PROTO_MOETRAIN_V1_JOB_SPEC_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "moetrain/v1/job.pb.h"

namespace moetrain {

// Parses one YAML document. Keys are the proto field names (the lowerCamelCase JSON names are
// accepted too); enum values are their names, in any case; a scalar is read as its field's type
// whether quoted or not; null or an empty value leaves the field unset. Unknown fields, wrong
// types, bad enum names, duplicate keys and YAML syntax errors (with line and column) are
// InvalidArgument, as are YAML anchors and aliases (an alias bomb expands exponentially) and text
// over 1 MiB. An error quotes at most 200 bytes of a value, then its size. Defaults are not
// applied: unset fields stay unset.
absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml_text);

// The same for JSON text (the protobuf JSON mapping, with the same leniencies as the YAML).
absl::StatusOr<v1::JobSpec> ParseJobSpecJson(absl::string_view json_text);

// Reads `path` and parses it by its extension: .yaml or .yml as YAML, .json as JSON. NotFound when
// the file cannot be opened; InvalidArgument for another extension or a bad spec; the message
// starts with the path.
absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path);

// Fills every unset field with its default and replaces every "0 = derived" field with the value
// it stands for (model.head_dim, data.synthetic_vocab_size, train.micro_batch_size,
// parallel.data_parallel), so the result states exactly what the job runs with. Fields set
// explicitly are kept, zeros included. Of train.fp8, only the fields its recipe reads get
// defaults (amax_history_len for DELAYED, power_2_scales for CURRENT and BLOCKWISE). Idempotent.
// A derived value that cannot be computed (hidden_size not a multiple of num_heads, say) is left
// 0 for ValidateJobSpec to report.
void ApplyDefaults(v1::JobSpec* spec);

// OK, or InvalidArgument naming the first field out of range with its value and the bound:
// "train.seq_len = 512 exceeds model.max_seq_len = 256". Checks the spec as ApplyDefaults would
// complete it, so it may be called on a spec with unset fields; a derived value out of range is
// reported by the fields the user wrote ("model.vocab_size", not "data.synthetic_vocab_size").
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// ApplyDefaults, then ValidateJobSpec: the effective spec, or why there is none.
absl::StatusOr<v1::JobSpec> ResolveJobSpec(v1::JobSpec spec);

// The spec as YAML / pretty-printed JSON that ParseJobSpecYaml / ParseJobSpecJson read back to an
// equal message: every field without presence, and every set optional field, in proto order;
// integers as numbers, floats in their shortest round-trip form, enums by name. For echoing the
// effective spec (after ApplyDefaults) or storing it.
std::string JobSpecToYaml(const v1::JobSpec& spec);
std::string JobSpecToJson(const v1::JobSpec& spec);

}  // namespace moetrain

#endif  // MOETRAIN_PROTO_MOETRAIN_V1_JOB_SPEC_H_
