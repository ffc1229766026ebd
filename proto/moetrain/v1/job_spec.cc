#include "moetrain/v1/job_spec.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/util/json_util.h>
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

namespace moetrain {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using OrderedJson = nlohmann::ordered_json;

// Deeper than any spec can legitimately be; stops runaway recursion on hostile input.
constexpr int kMaxDepth = 64;

// Bounds that keep workers × devices_per_worker far from overflowing.
constexpr int64_t kMaxWorkers = int64_t{1} << 20;
constexpr int64_t kMaxDevicesPerWorker = 1024;

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
  constexpr size_t kMaxShown = 60;
  if (node.text.size() > kMaxShown)
    return absl::StrCat("'", node.text.substr(0, kMaxShown), "...'");
  return absl::StrCat("'", node.text, "'");
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

absl::StatusOr<Node> ParseYamlTree(absl::string_view text) {
  try {
    std::vector<YAML::Node> documents = YAML::LoadAll(std::string(text));
    if (documents.empty()) return Node{};  // an empty file: every field unset
    if (documents.size() > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected one YAML document, got ", documents.size()));
    }
    return FromYaml(documents[0], 0);
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
    error_ = absl::StrCat("JSON syntax error: ", what);
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

std::string Join(absl::string_view path, absl::string_view name) {
  return path.empty() ? std::string(name) : absl::StrCat(path, ".", name);
}

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
  std::string message_text = absl::StrCat("unknown field ", Join(path, key));
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

std::string EnumNames(const EnumDescriptor* type) {
  std::vector<std::string> names;
  for (int i = 0; i < type->value_count(); ++i) names.push_back(type->value(i)->name());
  return absl::StrJoin(names, ", ");
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
      return Error(absl::StrCat(path, ": ", node.text, " is out of range for ", bits),
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
        return Error(absl::StrCat(path, ": ", text, " is out of range"), node.location);
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
  v1::JobSpec spec;
  const auto status = google::protobuf::util::JsonStringToMessage(json->dump(), &spec, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec: ", std::string(status.message().data(), status.message().size())));
  }
  return spec;
}

// --- Printing ----------------------------------------------------------------------------------

// The shortest text that reads back to the same value, fixed-point for magnitudes in
// [1e-4, 1e16) and scientific outside, as Python's repr does: "0.0003", "10000", "1e-06".
template <typename Real>
std::string ShortestText(Real value) {
  char buffer[128];
  const Real magnitude = std::abs(value);
  const bool fixed = magnitude == 0 || (magnitude >= Real(1e-4) && magnitude < Real(1e16));
  const auto result =
      std::to_chars(buffer, buffer + sizeof(buffer), value,
                    fixed ? std::chars_format::fixed : std::chars_format::scientific);
  return std::string(buffer, result.ptr);
}

std::string FloatText(float value) { return ShortestText(value); }
std::string DoubleText(double value) { return ShortestText(value); }

// One value of `field` (element `index` when repeated) as JSON.
OrderedJson FieldValueJson(const Message& message, const FieldDescriptor* field, int index);

OrderedJson MessageJson(const Message& message) {
  OrderedJson object = OrderedJson::object();
  const Descriptor* descriptor = message.GetDescriptor();
  const Reflection* reflection = message.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated()) {
      OrderedJson array = OrderedJson::array();
      for (int j = 0; j < reflection->FieldSize(message, field); ++j) {
        array.push_back(FieldValueJson(message, field, j));
      }
      object[field->name()] = std::move(array);
    } else if (!field->has_presence() || reflection->HasField(message, field)) {
      object[field->name()] = FieldValueJson(message, field, -1);
    }
  }
  return object;
}

OrderedJson FieldValueJson(const Message& message, const FieldDescriptor* field, int index) {
  const Reflection* r = message.GetReflection();
  const bool repeated = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return repeated ? r->GetRepeatedInt32(message, field, index) : r->GetInt32(message, field);
    case FieldDescriptor::CPPTYPE_INT64:
      return repeated ? r->GetRepeatedInt64(message, field, index) : r->GetInt64(message, field);
    case FieldDescriptor::CPPTYPE_UINT32:
      return repeated ? r->GetRepeatedUInt32(message, field, index) : r->GetUInt32(message, field);
    case FieldDescriptor::CPPTYPE_UINT64:
      return repeated ? r->GetRepeatedUInt64(message, field, index) : r->GetUInt64(message, field);
    case FieldDescriptor::CPPTYPE_FLOAT: {
      const float value =
          repeated ? r->GetRepeatedFloat(message, field, index) : r->GetFloat(message, field);
      // Through the shortest float text, so the double prints as "0.02", not 0.019999999552965164.
      return std::strtod(FloatText(value).c_str(), nullptr);
    }
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return repeated ? r->GetRepeatedDouble(message, field, index) : r->GetDouble(message, field);
    case FieldDescriptor::CPPTYPE_BOOL:
      return repeated ? r->GetRepeatedBool(message, field, index) : r->GetBool(message, field);
    case FieldDescriptor::CPPTYPE_ENUM: {
      const int number = repeated ? r->GetRepeatedEnumValue(message, field, index)
                                  : r->GetEnumValue(message, field);
      const EnumValueDescriptor* value = field->enum_type()->FindValueByNumber(number);
      if (value == nullptr) return number;
      return value->name();
    }
    case FieldDescriptor::CPPTYPE_STRING:
      return repeated ? r->GetRepeatedString(message, field, index) : r->GetString(message, field);
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return MessageJson(repeated ? r->GetRepeatedMessage(message, field, index)
                                  : r->GetMessage(message, field));
  }
  return nullptr;
}

// YAML from the JSON form. Only strings are quoted: enum names print plain, and the parser reads
// a scalar by its field's type anyway.
void EmitYaml(const OrderedJson& value, const FieldDescriptor* field, YAML::Emitter* out) {
  if (value.is_object()) {
    if (value.empty()) {
      *out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
      return;
    }
    const Descriptor* descriptor =
        field == nullptr ? v1::JobSpec::descriptor() : field->message_type();
    *out << YAML::BeginMap;
    for (const auto& [key, item] : value.items()) {
      *out << YAML::Key << key << YAML::Value;
      EmitYaml(item, descriptor->FindFieldByName(key), out);
    }
    *out << YAML::EndMap;
  } else if (value.is_array()) {
    *out << (value.empty() ? YAML::Flow : YAML::Block) << YAML::BeginSeq;
    for (const OrderedJson& item : value) EmitYaml(item, field, out);
    *out << YAML::EndSeq;
  } else if (value.is_string()) {
    const bool is_enum = field != nullptr && field->cpp_type() == FieldDescriptor::CPPTYPE_ENUM;
    if (!is_enum) *out << YAML::DoubleQuoted;
    *out << value.get<std::string>();
  } else if (value.is_boolean()) {
    *out << (value.get<bool>() ? "true" : "false");
  } else if (value.is_number_float()) {
    *out << DoubleText(value.get<double>());
  } else {
    *out << value.dump();
  }
}

// --- Validation --------------------------------------------------------------------------------

std::string Show(int64_t value) { return absl::StrCat(value); }
std::string Show(float value) { return FloatText(value); }
std::string Show(const std::string& value) { return absl::StrCat("\"", value, "\""); }

template <typename T>
absl::Status Invalid(absl::string_view path, const T& value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(path, " = ", Show(value), " ", why));
}

absl::Status AtLeast(absl::string_view path, int64_t value, int64_t min) {
  if (value >= min) return absl::OkStatus();
  if (min == 0) return Invalid(path, value, "must not be negative");
  return Invalid(path, value, absl::StrCat("must be at least ", min));
}

absl::Status AtMost(absl::string_view path, int64_t value, int64_t max) {
  if (value <= max) return absl::OkStatus();
  return Invalid(path, value, absl::StrCat("must be at most ", max));
}

absl::Status Positive(absl::string_view path, float value) {
  if (value > 0.0f && std::isfinite(value)) return absl::OkStatus();
  return Invalid(path, value, "must be positive and finite");
}

absl::Status NonNegative(absl::string_view path, float value) {
  if (value >= 0.0f && std::isfinite(value)) return absl::OkStatus();
  return Invalid(path, value, "must be non-negative and finite");
}

// [0, 1): Adam betas, the eval fraction.
absl::Status Fraction(absl::string_view path, float value) {
  if (value >= 0.0f && value < 1.0f) return absl::OkStatus();
  return Invalid(path, value, "must be in [0, 1)");
}

#define MOETRAIN_RETURN_IF_INVALID(expr)                              \
  do {                                                                \
    if (absl::Status _status = (expr); !_status.ok()) return _status; \
  } while (false)

// A message built in code (not parsed) can carry enum numbers no value has.
absl::Status ValidateEnums(const Message& message, const std::string& path) {
  const Descriptor* descriptor = message.GetDescriptor();
  const Reflection* reflection = message.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated()) continue;  // none in the spec
    const std::string field_path = Join(path, field->name());
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
      const int number = reflection->GetEnumValue(message, field);
      if (field->enum_type()->FindValueByNumber(number) == nullptr) {
        return Invalid(field_path, int64_t{number},
                       absl::StrCat("is not one of ", EnumNames(field->enum_type())));
      }
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      MOETRAIN_RETURN_IF_INVALID(ValidateEnums(reflection->GetMessage(message, field), field_path));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateName(const std::string& name) {
  constexpr size_t kMaxNameLength = 128;
  if (name.empty()) {
    return absl::InvalidArgumentError(
        "name is required: 1 to 128 characters from [A-Za-z0-9._-], starting with a letter or "
        "digit");
  }
  const bool allowed_chars = std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
  });
  if (name.size() > kMaxNameLength || !allowed_chars || !absl::ascii_isalnum(name[0])) {
    return Invalid("name", name,
                   "must be 1 to 128 characters from [A-Za-z0-9._-], starting with a letter or "
                   "digit");
  }
  return absl::OkStatus();
}

absl::Status ValidateMoe(const v1::MoeConfig& moe) {
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.moe.num_experts", moe.num_experts(), 1));
  // Chosen experts travel as int32 in the engine.
  MOETRAIN_RETURN_IF_INVALID(AtMost("model.moe.num_experts", moe.num_experts(), kInt32Max));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.moe.top_k", moe.top_k(), 1));
  if (moe.top_k() > moe.num_experts()) {
    return Invalid("model.moe.top_k", moe.top_k(),
                   absl::StrCat("exceeds model.moe.num_experts = ", moe.num_experts()));
  }
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.moe.expert_ffn_dim", moe.expert_ffn_dim(), 1));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.moe.num_shared_experts", moe.num_shared_experts(), 0));
  MOETRAIN_RETURN_IF_INVALID(
      Positive("model.moe.routed_scaling_factor", moe.routed_scaling_factor()));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.moe.num_groups", moe.num_groups(), 1));
  if (moe.num_experts() % moe.num_groups() != 0) {
    return Invalid("model.moe.num_groups", moe.num_groups(),
                   absl::StrCat("does not divide model.moe.num_experts = ", moe.num_experts()));
  }
  if (moe.group_top_k() < 1 || moe.group_top_k() > moe.num_groups()) {
    return Invalid("model.moe.group_top_k", moe.group_top_k(),
                   absl::StrCat("must be in [1, model.moe.num_groups = ", moe.num_groups(), "]"));
  }
  const int64_t experts_per_group = moe.num_experts() / moe.num_groups();
  if (moe.num_groups() > 1 && moe.top_k() > moe.group_top_k() * experts_per_group) {
    return Invalid("model.moe.top_k", moe.top_k(),
                   absl::StrCat("exceeds the ", moe.group_top_k() * experts_per_group,
                                " experts of model.moe.group_top_k = ", moe.group_top_k(),
                                " groups of ", experts_per_group));
  }
  MOETRAIN_RETURN_IF_INVALID(
      NonNegative("model.moe.expert_bias_update_rate", moe.expert_bias_update_rate()));
  MOETRAIN_RETURN_IF_INVALID(NonNegative("model.moe.aux_loss_coeff", moe.aux_loss_coeff()));
  // A coefficient with no loss to weigh is a spec that does not say what its author meant.
  if (moe.aux_loss() == v1::MoeConfig::NONE && moe.aux_loss_coeff() != 0.0f) {
    return Invalid("model.moe.aux_loss_coeff", moe.aux_loss_coeff(),
                   "has no effect with model.moe.aux_loss = NONE; set model.moe.aux_loss to "
                   "SWITCH or SEQUENCE");
  }
  MOETRAIN_RETURN_IF_INVALID(NonNegative("model.moe.z_loss_coeff", moe.z_loss_coeff()));
  if (!(moe.capacity_factor() >= 0.0f) || !std::isfinite(moe.capacity_factor())) {
    return Invalid("model.moe.capacity_factor", moe.capacity_factor(),
                   "must be non-negative and finite (0 = dropless)");
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const v1::ModelConfig& model) {
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.vocab_size", model.vocab_size(), 1));
  // Tokens are int32 in the engine.
  MOETRAIN_RETURN_IF_INVALID(AtMost("model.vocab_size", model.vocab_size(), kInt32Max));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.hidden_size", model.hidden_size(), 1));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.num_layers", model.num_layers(), 1));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.num_heads", model.num_heads(), 1));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.num_kv_heads", model.num_kv_heads(), 1));
  if (model.num_heads() % model.num_kv_heads() != 0) {
    return Invalid("model.num_kv_heads", model.num_kv_heads(),
                   absl::StrCat("does not divide model.num_heads = ", model.num_heads()));
  }
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.head_dim", model.head_dim(), 0));
  // ApplyDefaults leaves head_dim 0 only when hidden_size / num_heads is not whole.
  if (model.head_dim() == 0) {
    return Invalid("model.hidden_size", model.hidden_size(),
                   absl::StrCat("is not a multiple of model.num_heads = ", model.num_heads(),
                                "; set model.head_dim"));
  }
  if (model.head_dim() % 2 != 0) {
    return Invalid("model.head_dim", model.head_dim(),
                   "must be even (RoPE rotates pairs of dimensions)");
  }
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.ffn_dim", model.ffn_dim(), 1));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.first_dense_layers", model.first_dense_layers(), 0));
  if (model.first_dense_layers() > model.num_layers()) {
    return Invalid("model.first_dense_layers", model.first_dense_layers(),
                   absl::StrCat("exceeds model.num_layers = ", model.num_layers()));
  }
  MOETRAIN_RETURN_IF_INVALID(AtLeast("model.max_seq_len", model.max_seq_len(), 1));
  MOETRAIN_RETURN_IF_INVALID(Positive("model.rope_theta", model.rope_theta()));
  MOETRAIN_RETURN_IF_INVALID(Positive("model.rms_norm_eps", model.rms_norm_eps()));
  MOETRAIN_RETURN_IF_INVALID(Positive("model.init_std", model.init_std()));
  return ValidateMoe(model.moe());
}

absl::Status ValidateData(const v1::JobSpec& spec) {
  const v1::DataConfig& data = spec.data();
  const std::string format = v1::DataConfig::Format_Name(data.format());
  if (data.format() == v1::DataConfig::SYNTHETIC) {
    if (!data.path().empty()) {
      return Invalid("data.path", data.path(),
                     "is set but data.format = SYNTHETIC; set data.format to LLMC, U16 or TEXT");
    }
    MOETRAIN_RETURN_IF_INVALID(
        AtLeast("data.synthetic_vocab_size", data.synthetic_vocab_size(), 1));
    if (data.synthetic_vocab_size() > spec.model().vocab_size()) {
      return Invalid("data.synthetic_vocab_size", data.synthetic_vocab_size(),
                     absl::StrCat("exceeds model.vocab_size = ", spec.model().vocab_size()));
    }
  } else {
    if (data.path().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.path is required with data.format = ", format));
    }
    if (data.synthetic_vocab_size() != 0) {
      return Invalid("data.synthetic_vocab_size", data.synthetic_vocab_size(),
                     absl::StrCat("applies only to data.format = SYNTHETIC, not ", format));
    }
  }
  constexpr int64_t kByteVocabSize = 256;
  if (data.format() == v1::DataConfig::TEXT && spec.model().vocab_size() < kByteVocabSize) {
    return Invalid("model.vocab_size", spec.model().vocab_size(),
                   "is below 256, the byte vocabulary of data.format = TEXT");
  }
  MOETRAIN_RETURN_IF_INVALID(Fraction("data.eval_fraction", data.eval_fraction()));
  if (spec.train().eval_every() > 0 && data.format() != v1::DataConfig::SYNTHETIC &&
      data.eval_fraction() == 0.0f) {
    return Invalid("train.eval_every", spec.train().eval_every(),
                   absl::StrCat("needs held-out data: set data.eval_fraction > 0 (data.format = ",
                                format, ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateResources(const v1::JobSpec& spec) {
  const v1::ResourceConfig& resources = spec.resources();
  MOETRAIN_RETURN_IF_INVALID(AtLeast("resources.workers", resources.workers(), 1));
  MOETRAIN_RETURN_IF_INVALID(AtMost("resources.workers", resources.workers(), kMaxWorkers));
  MOETRAIN_RETURN_IF_INVALID(
      AtLeast("resources.devices_per_worker", resources.devices_per_worker(), 1));
  MOETRAIN_RETURN_IF_INVALID(
      AtMost("resources.devices_per_worker", resources.devices_per_worker(), kMaxDevicesPerWorker));
  if (resources.device() == v1::ResourceConfig::CPU && resources.devices_per_worker() != 1) {
    return Invalid("resources.devices_per_worker", resources.devices_per_worker(),
                   "must be 1 with resources.device = CPU (a CPU worker runs one rank)");
  }
  const int64_t ranks = resources.workers() * resources.devices_per_worker();
  const v1::ParallelConfig& parallel = spec.parallel();
  const std::string ranks_are = absl::StrCat(
      ranks, " ranks (resources.workers = ", resources.workers(),
      " x resources.devices_per_worker = ", resources.devices_per_worker(), ")");
  MOETRAIN_RETURN_IF_INVALID(AtLeast("parallel.expert_parallel", parallel.expert_parallel(), 1));
  if (ranks % parallel.expert_parallel() != 0) {
    return Invalid("parallel.expert_parallel", parallel.expert_parallel(),
                   absl::StrCat("does not divide the job's ", ranks_are));
  }
  if (parallel.data_parallel() * parallel.expert_parallel() != ranks) {
    return Invalid(
        "parallel.data_parallel", parallel.data_parallel(),
        absl::StrCat("x parallel.expert_parallel = ", parallel.expert_parallel(),
                     " does not equal the job's ", ranks_are));
  }
  MOETRAIN_RETURN_IF_INVALID(AtLeast("parallel.overlap_chunks", parallel.overlap_chunks(), 0));
  MOETRAIN_RETURN_IF_INVALID(AtMost("parallel.overlap_chunks", parallel.overlap_chunks(), 64));
  if (spec.model().moe().num_experts() % parallel.expert_parallel() != 0) {
    return Invalid(
        "parallel.expert_parallel", parallel.expert_parallel(),
        absl::StrCat("does not divide model.moe.num_experts = ", spec.model().moe().num_experts()));
  }
  return absl::OkStatus();
}

absl::Status ValidateTrain(const v1::JobSpec& spec) {
  const v1::TrainConfig& train = spec.train();
  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.steps", train.steps(), 1));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.batch_size", train.batch_size(), 1));
  const int64_t ranks = spec.resources().workers() * spec.resources().devices_per_worker();
  if (train.batch_size() % ranks != 0) {
    return Invalid("train.batch_size", train.batch_size(),
                   absl::StrCat("is not a multiple of the job's ", ranks,
                                " ranks (each rank reads its own share of every batch)"));
  }
  const int64_t rank_batch = train.batch_size() / ranks;
  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.micro_batch_size", train.micro_batch_size(), 1));
  if (rank_batch % train.micro_batch_size() != 0) {
    return Invalid("train.micro_batch_size", train.micro_batch_size(),
                   absl::StrCat("does not divide the per-rank batch train.batch_size / ranks = ",
                                rank_batch));
  }
  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.seq_len", train.seq_len(), 1));
  if (train.seq_len() > spec.model().max_seq_len()) {
    return Invalid("train.seq_len", train.seq_len(),
                   absl::StrCat("exceeds model.max_seq_len = ", spec.model().max_seq_len()));
  }
  MOETRAIN_RETURN_IF_INVALID(
      AtLeast("train.fp8.amax_history_len", train.fp8().amax_history_len(), 1));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.fp8.margin", train.fp8().margin(), 0));

  const v1::OptimizerConfig& optimizer = train.optimizer();
  MOETRAIN_RETURN_IF_INVALID(Positive("train.optimizer.lr", optimizer.lr()));
  MOETRAIN_RETURN_IF_INVALID(NonNegative("train.optimizer.min_lr", optimizer.min_lr()));
  if (optimizer.min_lr() > optimizer.lr()) {
    return Invalid("train.optimizer.min_lr", optimizer.min_lr(),
                   absl::StrCat("exceeds train.optimizer.lr = ", Show(optimizer.lr())));
  }
  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.optimizer.warmup_steps", optimizer.warmup_steps(), 0));
  if (optimizer.warmup_steps() > train.steps()) {
    return Invalid("train.optimizer.warmup_steps", optimizer.warmup_steps(),
                   absl::StrCat("exceeds train.steps = ", train.steps()));
  }
  MOETRAIN_RETURN_IF_INVALID(Fraction("train.optimizer.beta1", optimizer.beta1()));
  MOETRAIN_RETURN_IF_INVALID(Fraction("train.optimizer.beta2", optimizer.beta2()));
  MOETRAIN_RETURN_IF_INVALID(Positive("train.optimizer.eps", optimizer.eps()));
  MOETRAIN_RETURN_IF_INVALID(NonNegative("train.optimizer.weight_decay", optimizer.weight_decay()));
  MOETRAIN_RETURN_IF_INVALID(NonNegative("train.optimizer.grad_clip", optimizer.grad_clip()));

  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.log_every", train.log_every(), 1));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.eval_every", train.eval_every(), 0));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("train.eval_batches", train.eval_batches(), 1));
  return absl::OkStatus();
}

absl::Status ValidateEffective(const v1::JobSpec& spec) {
  MOETRAIN_RETURN_IF_INVALID(ValidateEnums(spec, ""));
  MOETRAIN_RETURN_IF_INVALID(ValidateName(spec.name()));
  MOETRAIN_RETURN_IF_INVALID(ValidateModel(spec.model()));
  // Resources and parallelism first: the batch checks divide by data_parallel.
  MOETRAIN_RETURN_IF_INVALID(ValidateResources(spec));
  MOETRAIN_RETURN_IF_INVALID(ValidateTrain(spec));
  MOETRAIN_RETURN_IF_INVALID(ValidateData(spec));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("checkpoint.every_steps", spec.checkpoint().every_steps(), 0));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("checkpoint.keep_last", spec.checkpoint().keep_last(), 0));
  MOETRAIN_RETURN_IF_INVALID(AtLeast("restart.max_restarts", spec.restart().max_restarts(), 0));
  return absl::OkStatus();
}

#undef MOETRAIN_RETURN_IF_INVALID

absl::Status WithPrefix(absl::string_view prefix, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(prefix, ": ", status.message()));
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml_text) {
  absl::StatusOr<Node> tree = ParseYamlTree(yaml_text);
  if (!tree.ok()) return tree.status();
  return TreeToJobSpec(*tree);
}

absl::StatusOr<v1::JobSpec> ParseJobSpecJson(absl::string_view json_text) {
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
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": read failed: ", std::strerror(errno)));
  }
  absl::StatusOr<v1::JobSpec> spec =
      yaml ? ParseJobSpecYaml(contents.str()) : ParseJobSpecJson(contents.str());
  if (!spec.ok()) return WithPrefix(path, spec.status());
  return spec;
}

void ApplyDefaults(v1::JobSpec* spec) {
  // The model defaults are those of moetrain::ModelConfig and moetrain::MoeConfig.
  v1::ModelConfig& model = *spec->mutable_model();
  if (!model.has_vocab_size()) model.set_vocab_size(256);
  if (!model.has_hidden_size()) model.set_hidden_size(256);
  if (!model.has_num_layers()) model.set_num_layers(4);
  if (!model.has_num_heads()) model.set_num_heads(4);
  if (!model.has_num_kv_heads()) model.set_num_kv_heads(model.num_heads());
  if (model.head_dim() == 0 && model.num_heads() > 0 &&
      model.hidden_size() % model.num_heads() == 0) {
    model.set_head_dim(model.hidden_size() / model.num_heads());
  }
  if (!model.has_ffn_dim()) model.set_ffn_dim(1024);
  if (!model.has_first_dense_layers()) model.set_first_dense_layers(1);
  if (!model.has_rope_theta()) model.set_rope_theta(10000.0f);
  if (!model.has_rms_norm_eps()) model.set_rms_norm_eps(1e-6f);
  if (!model.has_init_std()) model.set_init_std(0.02f);

  v1::MoeConfig& moe = *model.mutable_moe();
  if (!moe.has_num_experts()) moe.set_num_experts(8);
  if (!moe.has_top_k()) moe.set_top_k(2);
  if (!moe.has_expert_ffn_dim()) moe.set_expert_ffn_dim(1024);
  if (!moe.has_softmax_before_topk()) moe.set_softmax_before_topk(true);
  if (!moe.has_normalize_topk_weights()) moe.set_normalize_topk_weights(true);
  if (!moe.has_routed_scaling_factor()) moe.set_routed_scaling_factor(1.0f);
  if (!moe.has_num_groups()) moe.set_num_groups(1);
  if (!moe.has_group_top_k()) moe.set_group_top_k(1);
  if (!moe.has_expert_bias_update_rate()) moe.set_expert_bias_update_rate(1e-3f);

  // The sequence length: whichever of the two is given sets the other; neither gives 256.
  v1::TrainConfig& train = *spec->mutable_train();
  if (!model.has_max_seq_len()) {
    model.set_max_seq_len(train.has_seq_len() ? train.seq_len() : 256);
  }
  if (!train.has_seq_len()) train.set_seq_len(model.max_seq_len());

  v1::ResourceConfig& resources = *spec->mutable_resources();
  if (!resources.has_workers()) resources.set_workers(1);
  if (!resources.has_devices_per_worker()) resources.set_devices_per_worker(1);

  v1::ParallelConfig& parallel = *spec->mutable_parallel();
  if (!parallel.has_expert_parallel()) parallel.set_expert_parallel(1);
  const bool ranks_computable = resources.workers() >= 1 && resources.workers() <= kMaxWorkers &&
                                resources.devices_per_worker() >= 1 &&
                                resources.devices_per_worker() <= kMaxDevicesPerWorker;
  const int64_t ranks =
      ranks_computable ? resources.workers() * resources.devices_per_worker() : int64_t{0};
  if (parallel.data_parallel() == 0 && ranks > 0 && parallel.expert_parallel() >= 1 &&
      ranks % parallel.expert_parallel() == 0) {
    parallel.set_data_parallel(ranks / parallel.expert_parallel());
  }

  if (!train.has_steps()) train.set_steps(1000);
  if (!train.has_batch_size()) train.set_batch_size(8);
  if (train.micro_batch_size() == 0 && ranks > 0 && train.batch_size() % ranks == 0) {
    train.set_micro_batch_size(train.batch_size() / ranks);
  }
  v1::Fp8Recipe& fp8 = *train.mutable_fp8();
  if (!fp8.has_amax_history_len()) fp8.set_amax_history_len(1024);
  v1::OptimizerConfig& optimizer = *train.mutable_optimizer();
  if (!optimizer.has_lr()) optimizer.set_lr(3e-4f);
  if (!optimizer.has_beta1()) optimizer.set_beta1(0.9f);
  if (!optimizer.has_beta2()) optimizer.set_beta2(0.95f);
  if (!optimizer.has_eps()) optimizer.set_eps(1e-8f);
  if (!optimizer.has_weight_decay()) optimizer.set_weight_decay(0.1f);
  if (!optimizer.has_grad_clip()) optimizer.set_grad_clip(1.0f);
  if (!train.has_log_every()) train.set_log_every(10);
  if (!train.has_eval_batches()) train.set_eval_batches(8);

  v1::DataConfig& data = *spec->mutable_data();
  if (data.format() == v1::DataConfig::SYNTHETIC && data.synthetic_vocab_size() == 0) {
    data.set_synthetic_vocab_size(model.vocab_size());
  }
  if (!data.has_seed()) data.set_seed(train.seed());

  v1::CheckpointConfig& checkpoint = *spec->mutable_checkpoint();
  if (!checkpoint.has_keep_last()) checkpoint.set_keep_last(3);

  v1::RestartConfig& restart = *spec->mutable_restart();
  if (!restart.has_max_restarts()) restart.set_max_restarts(3);
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  v1::JobSpec effective = spec;
  ApplyDefaults(&effective);
  return ValidateEffective(effective);
}

absl::StatusOr<v1::JobSpec> ResolveJobSpec(v1::JobSpec spec) {
  ApplyDefaults(&spec);
  if (absl::Status status = ValidateEffective(spec); !status.ok()) return status;
  return spec;
}

std::string JobSpecToYaml(const v1::JobSpec& spec) {
  YAML::Emitter out;
  EmitYaml(MessageJson(spec), nullptr, &out);
  return absl::StrCat(out.c_str(), "\n");
}

std::string JobSpecToJson(const v1::JobSpec& spec) {
  return absl::StrCat(MessageJson(spec).dump(2), "\n");
}

}  // namespace moetrain
