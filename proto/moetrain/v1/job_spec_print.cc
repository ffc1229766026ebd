// Printing a job spec back as YAML or JSON (job_spec.h), in proto field order, so that the parser
// reads it back to an equal message.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "moetrain/v1/job_spec.h"
#include "moetrain/v1/job_spec_internal.h"

namespace moetrain {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using job_spec_internal::DoubleText;
using job_spec_internal::FloatText;
using OrderedJson = nlohmann::ordered_json;

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

}  // namespace

namespace job_spec_internal {

std::string FloatText(float value) { return ShortestText(value); }
std::string DoubleText(double value) { return ShortestText(value); }

}  // namespace job_spec_internal

std::string JobSpecToYaml(const v1::JobSpec& spec) {
  YAML::Emitter out;
  EmitYaml(MessageJson(spec), nullptr, &out);
  return absl::StrCat(out.c_str(), "\n");
}

std::string JobSpecToJson(const v1::JobSpec& spec) {
  return absl::StrCat(MessageJson(spec).dump(2), "\n");
}

}  // namespace moetrain
