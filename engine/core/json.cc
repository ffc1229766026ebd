#include "engine/core/json.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace moetrain {
namespace {

using Json = nlohmann::json;

// Thrown by the parser callback to stop at the first level past the limit.
struct TooDeep {};

// Most bytes of nlohmann's reason that a parse error quotes.
constexpr size_t kReasonBytes = 200;

// `text` cut to at most `max_bytes` bytes without splitting a UTF-8 character (a character has at
// most three continuation bytes; invalid UTF-8 is cut anywhere), and "... (N bytes)".
std::string Cut(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  for (int i = 0; i < 3 && cut > 0 && (static_cast<uint8_t>(text[cut]) & 0xc0) == 0x80; ++i) --cut;
  return absl::StrCat(text.substr(0, cut), "... (", text.size(), " bytes)");
}

// nlohmann's message without its "[json.exception.parse_error.101] " tag, cut: it ends with the
// token the lexer stopped in, which can be the rest of the file.
std::string Reason(const Json::exception& e) {
  absl::string_view what = e.what();
  if (const size_t tag = what.find("] "); !what.empty() && what[0] == '[' && tag != what.npos) {
    what.remove_prefix(tag + 2);
  }
  return Cut(what, kReasonBytes);
}

}  // namespace

absl::StatusOr<Json> ParseJson(std::string_view text, std::string_view source_name) {
  // Debian's Abseil has its own string_view, which StrCat needs.
  const absl::string_view source(source_name.data(), source_name.size());
  // The callback sees each array and object open with the number of containers around it; the
  // parser builds nothing of a container the callback refused.
  const Json::parser_callback_t bound = [](int depth, Json::parse_event_t event, Json&) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth) {
      throw TooDeep{};
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), bound);
  } catch (const TooDeep&) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " nests JSON arrays and objects deeper than ", kMaxJsonDepth, " levels"));
  } catch (const Json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, " is not valid JSON (at byte ", e.byte, "): ", Reason(e)));
  } catch (const Json::exception& e) {  // out_of_range: a number beyond a double
    return absl::InvalidArgumentError(absl::StrCat(source, " is not valid JSON: ", Reason(e)));
  }
}

std::string JsonExcerpt(const Json& value) {
  return Cut(value.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace),
             kJsonExcerptBytes);
}

}  // namespace moetrain
