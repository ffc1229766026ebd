// JSON that comes from outside the process (a checkpoint's manifest.json and config.json, a
// safetensors header, a Hugging Face config.json, a calibration file): parsed with its nesting
// bounded, and quoted in error messages by a bounded excerpt.
//
// nlohmann's parser is iterative, but copying, dump(), == and the conversions recurse once per
// level: a 2 MB file nested 10^6 deep overflows any thread's stack after it parsed. So every
// reader of such JSON parses with ParseJson, which refuses a document nested deeper than
// kMaxJsonDepth while it parses, before any deep value exists; every value read from it is then
// safe to copy, compare and print. Error messages quote a value through JsonExcerpt, never whole.
#ifndef MOETRAIN_ENGINE_CORE_JSON_H_
#define MOETRAIN_ENGINE_CORE_JSON_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace moetrain {

// Levels of arrays and objects a JSON input may nest: `{"a": [1]}` nests 2. The files moetrain
// reads nest fewer than 10 (a manifest's world_layout shards: 4).
inline constexpr int kMaxJsonDepth = 64;
// Most bytes of a value's JSON text that an error message quotes.
inline constexpr size_t kJsonExcerptBytes = 64;

// `text` parsed, or InvalidArgument naming `source` (a path, or a name such as "manifest.json"):
//   "<source> is not valid JSON (at byte 17): syntax error while parsing object key ..."
//   "<source> nests JSON arrays and objects deeper than 64 levels"
// A number beyond a double's range is invalid JSON too.
absl::StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view source);

// `value`'s JSON text when it has at most kJsonExcerptBytes bytes; else its first bytes (never
// splitting a UTF-8 character) and "... (N bytes)", N the whole text's size.
std::string JsonExcerpt(const nlohmann::json& value);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_JSON_H_
