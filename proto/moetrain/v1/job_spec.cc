// Parsing a job spec (job_spec.h) from YAML or JSON text, checked against the schema. Printing is
// in job_spec_print.cc, defaults and validation in job_spec_validate.cc.
#include "moetrain/v1/job_spec.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/util/json_util.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "moetrain/v1/job_spec_internal.h"

namespace moetrain {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;
using job_spec_internal::EnumNames;
using job_spec_internal::Join;
using job_spec_internal::Quoted;
using job_spec_internal::Shown;
using OrderedJson = nlohmann::ordered_json;

// Deeper than any spec can legitimately be; stops runaway recursion on hostile input.
constexpr int kMaxDepth = 64;

// Far larger than any spec (a full one is a few KiB); bounds the parser's work.
constexpr size_t kMaxSpecBytes = size_t{1} << 20;

// ---------------------------------------------------------------------------------------------
// A document tree that both YAML and JSON become, so one schema-guided walk checks both. Scalars
// keep their text: the field a scalar lands in decides how it is read.

struct Location {
  int line = 0;  // 1-based; 0 = unknown (JSON input)
  int column = 0;
};

struct Node {
  enum class Kind { kNull, kScalar, kMap, kSequence };
  Kind kind = Kind::kNull;
  std::string text;                     // kScalar
  std::vector<std::string> keys;        // kMap: keys[i] names children[i]
  std::vector<Location> key_locations;  // kMap: where keys[i] is
  std::vector<Node> children;           // kMap values or kSequence items
  Location location;
};

std::string At(const Location& location) {
  if (location.line <= 0) return "";
  return absl::StrCat(" (line ", location.line, ", column ", location.column, ")");
}

absl::Status Error(absl::string_view message, const Location& location) {
  return absl::InvalidArgumentError(absl::StrCat(message, At(location)));
}

// How a node reads in "expected X, got <this>".
std::string Describe(const Node& node) {
  switch (node.kind) {
    case Node::Kind::kNull:
      return "null";
    case Node::Kind::kMap:
      return "a mapping";
    case Node::Kind::kSequence:
      return "a sequence";
    case Node::Kind::kScalar:
      break;
  }
  return Quoted(node.text, "'");
}

// --- YAML -> Node ----------------------------------------------------------------------------

Location YamlLocation(const YAML::Mark& mark) {
  if (mark.is_null()) return {};
  return {mark.line + 1, mark.column + 1};
}

absl::StatusOr<Node> FromYaml(const YAML::Node& yaml, int depth) {
  Node node;
  node.location = YamlLocation(yaml.Mark());
  if (depth > kMaxDepth)
    return Error(absl::StrCat("nested deeper than ", kMaxDepth), node.location);
  switch (yaml.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      node.kind = Node::Kind::kNull;
      return node;
    case YAML::NodeType::Scalar:
      node.kind = Node::Kind::kScalar;
      node.text = yaml.Scalar();
      return node;
    case YAML::NodeType::Sequence:
      node.kind = Node::Kind::kSequence;
      for (const YAML::Node& item : yaml) {
        absl::StatusOr<Node> child = FromYaml(item, depth + 1);
        if (!child.ok()) return child.status();
        node.children.push_back(*std::move(child));
      }
      return node;
    case YAML::NodeType::Map:
      node.kind = Node::Kind::kMap;
      for (const auto& entry : yaml) {
        if (!entry.first.IsScalar()) {
          return Error("a mapping key must be a plain name", YamlLocation(entry.first.Mark()));
        }
        absl::StatusOr<Node> child = FromYaml(entry.second, depth + 1);
        if (!child.ok()) return child.status();
        node.keys.push_back(entry.first.Scalar());
        node.key_locations.push_back(YamlLocation(entry.first.Mark()));
        node.children.push_back(*std::move(child));
      }
      return node;
  }
  return node;
}

// Finds the first anchor or alias of a YAML text without building anything. yaml-cpp shares an
// aliased node, so loading stays linear, but every walk of the loaded tree visits each alias in
// full: nine levels of nine aliases are 9^9 values from 500 bytes. A job spec has no use for
// them, so they are refused.
class AnchorFinder : public YAML::EventHandler {
 public:
  // The first anchor ("&name") or alias, with its location; empty when there is none.
  const std::string& found() const { return found_; }
  // Documents started so far.
  int documents() const { return documents_; }

  void OnAnchor(const YAML::Mark& mark, const std::string& name) override {
    Found(absl::StrCat("&", Shown(name)), mark);
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t /*anchor*/) override {
    Found("an alias", mark);
  }
  void OnDocumentStart(const YAML::Mark&) override { ++documents_; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

 private:
  void Found(const std::string& what, const YAML::Mark& mark) {
    if (found_.empty()) found_ = absl::StrCat(what, At(YamlLocation(mark)));
  }

  std::string found_;
  int documents_ = 0;
};

absl::StatusOr<Node> ParseYamlTree(absl::string_view text) {
  try {
    std::istringstream stream{std::string(text)};
    YAML::Parser parser(stream);
    AnchorFinder finder;
    // Two documents are enough to refuse: yaml-cpp 0.7 never stops producing empty documents
    // from some texts (a lone ","), so reading them all would not end.
    while (finder.found().empty() && finder.documents() < 2 && parser.HandleNextDocument(finder)) {
    }
    if (!finder.found().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "YAML anchors and aliases are not accepted in a job spec: ", finder.found()));
    }
    if (finder.documents() == 0) return Node{};  // an empty file: every field unset
    if (finder.documents() > 1) {
      return absl::InvalidArgumentError("expected one YAML document, got more ('---' or '...')");
    }
    return FromYaml(YAML::Load(std::string(text)), 0);
  } catch (const YAML::Exception& e) {
    return Error(absl::StrCat("YAML syntax error: ", e.msg), YamlLocation(e.mark));
  }
}

// --- JSON -> Node ----------------------------------------------------------------------------

// nlohmann SAX handler: builds the tree directly, so duplicate keys survive to be reported and
// numbers keep their source text.
class JsonTreeBuilder {
 public:
  using Json = nlohmann::json;

  bool null() { return Add(Node{}); }
  bool boolean(bool value) { return Add(Scalar(value ? "true" : "false")); }
  bool number_integer(Json::number_integer_t value) { return Add(Scalar(absl::StrCat(value))); }
  bool number_unsigned(Json::number_unsigned_t value) { return Add(Scalar(absl::StrCat(value))); }
  bool number_float(Json::number_float_t /*value*/, const Json::string_t& raw) {
    return Add(Scalar(raw));
  }
  bool string(Json::string_t& value) { return Add(Scalar(value)); }
  bool binary(Json::binary_t& /*value*/) {
    error_ = "binary values are not supported";
    return false;
  }
  bool start_object(std::size_t /*elements*/) { return Open(Node::Kind::kMap); }
  bool key(Json::string_t& key) {
    open_.back().keys.push_back(key);
    open_.back().key_locations.push_back({});
    return true;
  }
  bool end_object() { return Close(); }
  bool start_array(std::size_t /*elements*/) { return Open(Node::Kind::kSequence); }
  bool end_array() { return Close(); }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 3, column 5: ...".
    absl::string_view what = e.what();
    if (size_t bracket = what.find("] "); absl::StartsWith(what, "[") && bracket != what.npos) {
      what.remove_prefix(bracket + 2);
    }
    // The message ends with the token it stopped at, which can be the rest of the file.
    constexpr absl::string_view kLastRead = "; last read: ";
    if (size_t last = what.find(kLastRead); last != what.npos) {
      error_ = absl::StrCat("JSON syntax error: ", what.substr(0, last), kLastRead,
                            Shown(what.substr(last + kLastRead.size())));
    } else {
      error_ = absl::StrCat("JSON syntax error: ", Shown(what));
    }
    return false;
  }

  const std::string& error() const { return error_; }
  Node TakeRoot() { return std::move(root_); }

 private:
  static Node Scalar(std::string text) {
    Node node;
    node.kind = Node::Kind::kScalar;
    node.text = std::move(text);
    return node;
  }
  bool Open(Node::Kind kind) {
    if (open_.size() >= kMaxDepth) {
      error_ = absl::StrCat("nested deeper than ", kMaxDepth);
      return false;
    }
    Node node;
    node.kind = kind;
    open_.push_back(std::move(node));
    return true;
  }
  bool Close() {
    Node node = std::move(open_.back());
    open_.pop_back();
    return Add(std::move(node));
  }
  bool Add(Node node) {
    if (open_.empty()) {
      root_ = std::move(node);
    } else {
      open_.back().children.push_back(std::move(node));
    }
    return true;
  }

  std::vector<Node> open_;  // containers being filled, innermost last
  Node root_;
  std::string error_;
};

absl::StatusOr<Node> ParseJsonTree(absl::string_view text) {
  JsonTreeBuilder builder;
  const bool ok = nlohmann::json::sax_parse(text.data(), text.data() + text.size(), &builder);
  if (!ok || !builder.error().empty()) {
    return absl::InvalidArgumentError(builder.error().empty() ? "invalid JSON" : builder.error());
  }
  return builder.TakeRoot();
}

// --- Node -> protobuf JSON, checked against the schema -----------------------------------------

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

const FieldDescriptor* FindField(const Descriptor* message, const std::string& key) {
  if (const FieldDescriptor* field = message->FindFieldByName(key)) return field;
  for (int i = 0; i < message->field_count(); ++i) {
    if (message->field(i)->json_name() == key) return message->field(i);
  }
  return nullptr;
}

absl::Status UnknownField(const Descriptor* message, absl::string_view path, const std::string& key,
                          const Location& location) {
  const FieldDescriptor* closest = nullptr;
  size_t best = std::numeric_limits<size_t>::max();
  std::vector<std::string> names;
  for (int i = 0; i < message->field_count(); ++i) {
    const FieldDescriptor* field = message->field(i);
    names.push_back(field->name());
    const size_t distance =
        EditDistance(absl::AsciiStrToLower(key), absl::AsciiStrToLower(field->name()));
    if (distance < best) {
      best = distance;
      closest = field;
    }
  }
  std::string message_text = absl::StrCat("unknown field ", Join(path, Shown(key)));
  if (closest != nullptr && best <= 2 && best < key.size()) {
    absl::StrAppend(&message_text, " (did you mean ", closest->name(), "?)");
  } else {
    absl::StrAppend(&message_text, " (", path.empty() ? "the job spec" : path, " has ",
                    absl::StrJoin(names, ", "), ")");
  }
  return Error(message_text, location);
}

// Whole-text integer: decimal digits with an optional sign, or a number in another notation
// whose value is integral (1e4, 100.0).
enum class NumberParse { kOk, kNotNumber, kOutOfRange };

NumberParse ParseReal(absl::string_view text, double* value) {
  if (absl::StartsWith(text, "+")) text.remove_prefix(1);
  // from_chars also reads "inf", "nan" and hex; a spec has no use for them.
  if (text.empty() || text.find_first_not_of("0123456789.eE+-") != text.npos) {
    return NumberParse::kNotNumber;
  }
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
  if (end != text.data() + text.size()) return NumberParse::kNotNumber;
  if (error == std::errc::result_out_of_range) return NumberParse::kOutOfRange;
  if (error != std::errc()) return NumberParse::kNotNumber;
  return NumberParse::kOk;
}

template <typename Int>
NumberParse ParseInteger(absl::string_view text, Int* value) {
  absl::string_view digits = text;
  if (absl::StartsWith(digits, "+")) digits.remove_prefix(1);
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), *value);
  if (!digits.empty() && end == digits.data() + digits.size()) {
    if (error == std::errc::result_out_of_range) return NumberParse::kOutOfRange;
    if (error == std::errc()) return NumberParse::kOk;
  }
  double real = 0;
  const NumberParse as_real = ParseReal(text, &real);
  if (as_real != NumberParse::kOk) return as_real;
  if (real != std::trunc(real)) return NumberParse::kNotNumber;
  // 2^63 and 2^64 are exact doubles; anything at or above the bound does not fit.
  const double bound = std::ldexp(1.0, std::numeric_limits<Int>::digits);
  if (real >= bound || real < static_cast<double>(std::numeric_limits<Int>::min())) {
    return NumberParse::kOutOfRange;
  }
  *value = static_cast<Int>(real);
  return NumberParse::kOk;
}

std::string Expected(const FieldDescriptor* field) {
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
      return "an integer";
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      return "a non-negative integer";
    case FieldDescriptor::CPPTYPE_FLOAT:
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return "a number";
    case FieldDescriptor::CPPTYPE_BOOL:
      return "true or false";
    case FieldDescriptor::CPPTYPE_ENUM:
      return absl::StrCat("one of ", EnumNames(field->enum_type()));
    case FieldDescriptor::CPPTYPE_STRING:
      return "a string";
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return "a mapping";
  }
  return "a value";
}

absl::StatusOr<OrderedJson> ConvertMessage(const Node& node, const Descriptor* message,
                                           const std::string& path);

template <typename Int>
absl::StatusOr<OrderedJson> ConvertInteger(const Node& node, const FieldDescriptor* field,
                                           const std::string& path, absl::string_view bits) {
  Int value = 0;
  switch (ParseInteger(node.text, &value)) {
    case NumberParse::kOk:
      return OrderedJson(value);
    case NumberParse::kOutOfRange:
      return Error(absl::StrCat(path, ": ", Shown(node.text), " is out of range for ", bits),
                   node.location);
    case NumberParse::kNotNumber:
      break;
  }
  return Error(absl::StrCat(path, ": expected ", Expected(field), ", got ", Describe(node)),
               node.location);
}

absl::StatusOr<OrderedJson> ConvertSingle(const Node& node, const FieldDescriptor* field,
                                          const std::string& path) {
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    return ConvertMessage(node, field->message_type(), path);
  }
  if (node.kind != Node::Kind::kScalar) {
    return Error(absl::StrCat(path, ": expected ", Expected(field), ", got ", Describe(node)),
                 node.location);
  }
  const std::string& text = node.text;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return ConvertInteger<int32_t>(node, field, path, "a 32-bit integer");
    case FieldDescriptor::CPPTYPE_INT64:
      return ConvertInteger<int64_t>(node, field, path, "a 64-bit integer");
    case FieldDescriptor::CPPTYPE_UINT32:
      return ConvertInteger<uint32_t>(node, field, path, "a 32-bit unsigned integer");
    case FieldDescriptor::CPPTYPE_UINT64:
      return ConvertInteger<uint64_t>(node, field, path, "a 64-bit unsigned integer");
    case FieldDescriptor::CPPTYPE_FLOAT:
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      double value = 0;
      NumberParse parse = ParseReal(text, &value);
      if (parse == NumberParse::kOk && field->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT &&
          std::abs(value) > std::numeric_limits<float>::max()) {
        parse = NumberParse::kOutOfRange;
      }
      if (parse == NumberParse::kOk) return OrderedJson(value);
      if (parse == NumberParse::kOutOfRange) {
        return Error(absl::StrCat(path, ": ", Shown(text), " is out of range"), node.location);
      }
      break;
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      const std::string lower = absl::AsciiStrToLower(text);
      if (lower == "true" || lower == "false") return OrderedJson(lower == "true");
      break;
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      const EnumDescriptor* type = field->enum_type();
      for (int i = 0; i < type->value_count(); ++i) {
        if (absl::EqualsIgnoreCase(type->value(i)->name(), text)) {
          return OrderedJson(type->value(i)->name());
        }
      }
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING:
      return OrderedJson(text);
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return Error(absl::StrCat(path, ": expected ", Expected(field), ", got ", Describe(node)),
               node.location);
}

absl::StatusOr<OrderedJson> ConvertMessage(const Node& node, const Descriptor* message,
                                           const std::string& path) {
  OrderedJson object = OrderedJson::object();
  if (node.kind == Node::Kind::kNull) return object;  // an empty document
  if (node.kind != Node::Kind::kMap) {
    return Error(absl::StrCat(path.empty() ? "the job spec" : path, ": expected a mapping, got ",
                              Describe(node)),
                 node.location);
  }
  std::vector<bool> seen(message->field_count(), false);
  for (size_t i = 0; i < node.keys.size(); ++i) {
    const std::string& key = node.keys[i];
    const FieldDescriptor* field = FindField(message, key);
    if (field == nullptr) return UnknownField(message, path, key, node.key_locations[i]);
    const std::string field_path = Join(path, field->name());
    if (seen[field->index()]) {
      return Error(absl::StrCat("duplicate field ", field_path), node.key_locations[i]);
    }
    seen[field->index()] = true;
    const Node& value = node.children[i];
    if (value.kind == Node::Kind::kNull) continue;  // null = unset, as in the JSON mapping
    if (field->is_map()) {
      return Error(absl::StrCat(field_path, ": map fields are not supported"), value.location);
    }
    if (field->is_repeated()) {
      if (value.kind != Node::Kind::kSequence) {
        return Error(absl::StrCat(field_path, ": expected a sequence, got ", Describe(value)),
                     value.location);
      }
      OrderedJson array = OrderedJson::array();
      for (size_t j = 0; j < value.children.size(); ++j) {
        absl::StatusOr<OrderedJson> item =
            ConvertSingle(value.children[j], field, absl::StrCat(field_path, "[", j, "]"));
        if (!item.ok()) return item.status();
        array.push_back(*std::move(item));
      }
      object[field->name()] = std::move(array);
      continue;
    }
    absl::StatusOr<OrderedJson> converted = ConvertSingle(value, field, field_path);
    if (!converted.ok()) return converted.status();
    object[field->name()] = *std::move(converted);
  }
  return object;
}

absl::StatusOr<v1::JobSpec> TreeToJobSpec(const Node& root) {
  absl::StatusOr<OrderedJson> json = ConvertMessage(root, v1::JobSpec::descriptor(), "");
  if (!json.ok()) return json.status();
  // The walk above already rejected everything the parser would; this is the contract's parser
  // (protobuf JSON mapping, unknown fields rejected) doing the actual filling.
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  std::string text;
  try {
    text = json->dump();
  } catch (const nlohmann::json::type_error&) {  // the only cause: a string of invalid UTF-8
    return absl::InvalidArgumentError("job spec: a value is not valid UTF-8 text");
  }
  v1::JobSpec spec;
  const auto status = google::protobuf::util::JsonStringToMessage(text, &spec, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec: ", std::string(status.message().data(), status.message().size())));
  }
  return spec;
}

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
