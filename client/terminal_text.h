// Text from elsewhere (the coordinator, a worker, a file, the command line) made safe to print on
// a terminal: control characters escaped, so that a cancel reason, a worker name or a log line
// cannot move the cursor, retitle the window or hide what came before; and values cut short, so
// that an error about a 50 MB name is one line, not 50 MB.
//
//   absl::PrintF("%s\n", TerminalSafe(job.state_reason()));
//   absl::StrCat("--data-format = '", Abbreviate(text), "' is not ...");
#ifndef MOETRAIN_CLIENT_TERMINAL_TEXT_H_
#define MOETRAIN_CLIENT_TERMINAL_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace moetrain {

// Most bytes of a value an error message quotes.
inline constexpr size_t kQuotedValueBytes = 200;
// Most bytes of a whole error message the CLI prints.
inline constexpr size_t kMaxErrorMessageBytes = 2000;

// `text` with printable UTF-8 (any language) kept as it is and the rest escaped: the C0 controls
// and DEL as \xNN (\n, \r and \t by name), the C1 controls U+0080 to U+009F as \u00NN, and each
// byte of invalid UTF-8 as \xNN. Backslashes are kept: the result is for reading, not parsing.
std::string TerminalSafe(absl::string_view text);

// JSON text (from an encoder, which escapes the C0 controls inside strings) with DEL, the C1
// controls and the bidirectional overrides written as \uXXXX escapes: the same JSON value, and
// nothing a terminal acts on. JSON encoders may leave those characters raw inside strings.
std::string JsonTerminalSafe(absl::string_view json);

// `text` when it has at most `max_bytes` bytes; else its first bytes up to `max_bytes` (never
// splitting a UTF-8 character), then "... (N bytes)" with N the whole size.
std::string Abbreviate(absl::string_view text, size_t max_bytes = kQuotedValueBytes);

}  // namespace moetrain

#endif  // MOETRAIN_CLIENT_TERMINAL_TEXT_H_
