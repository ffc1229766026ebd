// The document tree that YAML and JSON text become (job_spec_tree.cc), and its schema-checked
// conversion to a JobSpec (job_spec_convert.cc): one walk checks both formats. Internal to the
// job-spec library; job_spec.h is its interface.
#ifndef MOETRAIN_PROTO_MOETRAIN_V1_JOB_SPEC_TREE_H_
#define MOETRAIN_PROTO_MOETRAIN_V1_JOB_SPEC_TREE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "moetrain/v1/job.pb.h"

namespace moetrain::job_spec_internal {

struct Location {
  int line = 0;  // 1-based; 0 = unknown (JSON input)
  int column = 0;
};

// Scalars keep their text: the field a scalar lands in decides how it is read.
struct Node {
  enum class Kind { kNull, kScalar, kMap, kSequence };
  Kind kind = Kind::kNull;
  std::string text;                     // kScalar
  std::vector<std::string> keys;        // kMap: keys[i] names children[i]
  std::vector<Location> key_locations;  // kMap: where keys[i] is
  std::vector<Node> children;           // kMap values or kSequence items
  Location location;
};

// InvalidArgument: `message`, then " (line L, column C)" when the location is known.
absl::Status Error(absl::string_view message, const Location& location);

// One YAML document (an empty text is a null node); anchors, aliases, more than one document and
// nesting deeper than 64 are InvalidArgument.
absl::StatusOr<Node> ParseYamlTree(absl::string_view text);
// JSON text; duplicate keys are kept (for the conversion to report) and numbers keep their
// source text.
absl::StatusOr<Node> ParseJsonTree(absl::string_view text);

// The tree as a JobSpec, checked against its schema: unknown fields (with the closest name),
// duplicate keys, wrong types, out-of-range numbers and bad enum names are InvalidArgument
// naming the field by its path.
absl::StatusOr<v1::JobSpec> TreeToJobSpec(const Node& root);

}  // namespace moetrain::job_spec_internal

#endif  // MOETRAIN_PROTO_MOETRAIN_V1_JOB_SPEC_TREE_H_
