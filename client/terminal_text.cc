#include "client/terminal_text.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace moetrain {
namespace {

// The length of the well-formed UTF-8 character at the start of `text` (1 to 4) and its code
// point, or 0 when the bytes there are not one (a stray continuation byte, an overlong form, a
// surrogate, a truncated sequence, a value past U+10FFFF).
size_t DecodeUtf8(absl::string_view text, uint32_t* code_point) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(0);
  if (lead < 0x80) {
    *code_point = lead;
    return 1;
  }
  size_t length = 0;
  uint8_t low = 0x80, high = 0xbf;  // the range of the second byte
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;   // overlong
    if (lead == 0xed) high = 0x9f;  // surrogates
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;   // overlong
    if (lead == 0xf4) high = 0x8f;  // past U+10FFFF
  } else {
    return 0;
  }
  if (text.size() < length || byte(1) < low || byte(1) > high) return 0;
  uint32_t value = lead & (0xff >> (length + 1));
  for (size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xc0) != 0x80) return 0;
    value = (value << 6) | (byte(i) & 0x3f);
  }
  *code_point = value;
  return length;
}

// Characters that change how the text around them shows rather than showing themselves: the C1
// controls, and the bidirectional overrides and isolates that reorder a line ("Trojan Source").
bool IsInvisibleControl(uint32_t code_point) {
  return (code_point >= 0x80 && code_point <= 0x9f) ||
         (code_point >= 0x202a && code_point <= 0x202e) ||
         (code_point >= 0x2066 && code_point <= 0x2069);
}

}  // namespace

std::string TerminalSafe(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    uint32_t code_point = 0;
    const size_t length = DecodeUtf8(text, &code_point);
    if (length == 0) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<uint8_t>(text[0]));
      text.remove_prefix(1);
      continue;
    }
    if (code_point == '\n') {
      out += "\\n";
    } else if (code_point == '\r') {
      out += "\\r";
    } else if (code_point == '\t') {
      out += "\\t";
    } else if (code_point < 0x20 || code_point == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", code_point);
    } else if (IsInvisibleControl(code_point)) {
      absl::StrAppendFormat(&out, "\\u%04x", code_point);
    } else {
      out.append(text.data(), length);
    }
    text.remove_prefix(length);
  }
  return out;
}

std::string JsonTerminalSafe(absl::string_view json) {
  std::string out;
  out.reserve(json.size());
  while (!json.empty()) {
    uint32_t code_point = 0;
    const size_t length = std::max<size_t>(1, DecodeUtf8(json, &code_point));
    if (length > 1 || code_point == 0x7f) {
      if (code_point == 0x7f || IsInvisibleControl(code_point)) {
        absl::StrAppendFormat(&out, "\\u%04x", code_point);
      } else {
        out.append(json.data(), length);
      }
    } else {
      out.push_back(json[0]);  // ASCII, or a byte of invalid UTF-8: as the encoder wrote it
    }
    json.remove_prefix(length);
  }
  return out;
}

std::string Abbreviate(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  // Back off continuation bytes (a character has at most three), so that the cut never splits a
  // character; invalid UTF-8 is cut anywhere.
  for (int i = 0; i < 3 && cut > 0 && (static_cast<uint8_t>(text[cut]) & 0xc0) == 0x80; ++i) --cut;
  return absl::StrCat(text.substr(0, cut), "... (", text.size(), " bytes)");
}

}  // namespace moetrain
