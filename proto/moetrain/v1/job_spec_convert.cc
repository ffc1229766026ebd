// The document tree (job_spec_tree.h) to a JobSpec: a walk guided by the schema builds the
// protobuf JSON mapping of the spec, naming each bad field by its path (with the closest name for
// an unknown one), and protobuf's own JSON parser fills the message.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
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
#include "moetrain/v1/job_spec_tree.h"

namespace moetrain::job_spec_internal {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;
using OrderedJson = nlohmann::ordered_json;

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

}  // namespace

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

}  // namespace moetrain::job_spec_internal
