// The job spec's entry points for text (job_spec.h): size bounds, files, and which parser reads
// what. The text becomes a document tree in job_spec_tree.cc, the tree a JobSpec in
// job_spec_convert.cc; printing is in job_spec_print.cc, defaults in job_spec_defaults.cc and
// validation in job_spec_validate.cc.
#include "moetrain/v1/job_spec.h"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "moetrain/v1/job_spec_tree.h"

namespace moetrain {
namespace {

using job_spec_internal::Node;
using job_spec_internal::ParseJsonTree;
using job_spec_internal::ParseYamlTree;
using job_spec_internal::TreeToJobSpec;

// Far larger than any spec (a full one is a few KiB); bounds the parser's work.
constexpr size_t kMaxSpecBytes = size_t{1} << 20;

absl::Status WithPrefix(absl::string_view prefix, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(prefix, ": ", status.message()));
}

absl::Status CheckSpecSize(size_t bytes) {
  if (bytes <= kMaxSpecBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the job spec is ", bytes, " bytes, more than the 1 MiB a spec may have"));
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml_text) {
  if (absl::Status size = CheckSpecSize(yaml_text.size()); !size.ok()) return size;
  absl::StatusOr<Node> tree = ParseYamlTree(yaml_text);
  if (!tree.ok()) return tree.status();
  return TreeToJobSpec(*tree);
}

absl::StatusOr<v1::JobSpec> ParseJobSpecJson(absl::string_view json_text) {
  if (absl::Status size = CheckSpecSize(json_text.size()); !size.ok()) return size;
  absl::StatusOr<Node> tree = ParseJsonTree(json_text);
  if (!tree.ok()) return tree.status();
  return TreeToJobSpec(*tree);
}

absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path) {
  const std::string lower = absl::AsciiStrToLower(path);
  const bool yaml = absl::EndsWith(lower, ".yaml") || absl::EndsWith(lower, ".yml");
  const bool json = absl::EndsWith(lower, ".json");
  if (!yaml && !json) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": unknown job spec extension (expected .yaml, .yml or .json)"));
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  // One byte past the bound tells a file that is too large, without reading all of it.
  std::string contents(kMaxSpecBytes + 1, '\0');
  file.read(contents.data(), static_cast<std::streamsize>(contents.size()));
  if (file.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": read failed: ", std::strerror(errno)));
  }
  contents.resize(static_cast<size_t>(file.gcount()));
  if (contents.size() > kMaxSpecBytes) {
    const uintmax_t size = std::filesystem::file_size(path, error);
    return WithPrefix(path, CheckSpecSize(error ? contents.size() : size));
  }
  absl::StatusOr<v1::JobSpec> spec = yaml ? ParseJobSpecYaml(contents) : ParseJobSpecJson(contents);
  if (!spec.ok()) return WithPrefix(path, spec.status());
  return spec;
}

}  // namespace moetrain
