// TerminalSafe keeps printable text of any script and escapes what a terminal would act on;
// JsonTerminalSafe does the same to JSON without changing its value; Abbreviate cuts a long value
// at a character boundary and says how long it was.
#include "client/terminal_text.h"

#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

TEST(TerminalSafeTest, KeepsPrintableTextOfAnyScript) {
  for (const std::string text :
       {"", "plain ascii: 0-9 a-z ~!@#$%^&*()[]{}\\/", "größe", "日本語のログ", "emoji 🚀",
        "Ελληνικά ☃ €", "a\u00a0b" /* no-break space: printable */}) {
    EXPECT_EQ(TerminalSafe(text), text);
  }
}

TEST(TerminalSafeTest, EscapesC0ControlsAndDel) {
  EXPECT_EQ(TerminalSafe("a\nb\rc\td"), "a\\nb\\rc\\td");
  EXPECT_EQ(TerminalSafe("\x1b[2J\x1b]0;title\x07"), "\\x1b[2J\\x1b]0;title\\x07");
  EXPECT_EQ(TerminalSafe(std::string("nul\0byte", 8)), "nul\\x00byte");
  EXPECT_EQ(TerminalSafe("bs\x08 del\x7f"), "bs\\x08 del\\x7f");
  for (int c = 0; c < 0x20; ++c) {
    const std::string escaped = TerminalSafe(std::string(1, static_cast<char>(c)));
    EXPECT_EQ(escaped[0], '\\') << c;
  }
}

TEST(TerminalSafeTest, EscapesC1ControlsAndBidirectionalOverrides) {
  // U+009B is CSI, which some terminals obey as ESC [.
  EXPECT_EQ(TerminalSafe("a\xc2\x9b"
                         "31mb"),
            "a\\u009b31mb");
  EXPECT_EQ(TerminalSafe("\xc2\x80\xc2\x9f"), "\\u0080\\u009f");
  // U+202E RIGHT-TO-LEFT OVERRIDE and U+2066 LEFT-TO-RIGHT ISOLATE.
  EXPECT_EQ(TerminalSafe("x\u202ey\u2066z"), "x\\u202ey\\u2066z");
}

TEST(TerminalSafeTest, EscapesEachByteOfInvalidUtf8) {
  EXPECT_EQ(TerminalSafe("\xff"), "\\xff");
  EXPECT_EQ(TerminalSafe("a\x80z"), "a\\x80z");
  // Truncated, overlong, a surrogate, past U+10FFFF.
  EXPECT_EQ(TerminalSafe("\xe6\x97"), "\\xe6\\x97");
  EXPECT_EQ(TerminalSafe("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(TerminalSafe("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(TerminalSafe("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");
  // A valid character after an invalid byte survives.
  EXPECT_EQ(TerminalSafe("\xe6日"), "\\xe6日");
}

TEST(JsonTerminalSafeTest, EscapesWhatEncodersLeaveRawAndKeepsTheValue) {
  // nlohmann's dump and protobuf's printer escape C0 controls, not DEL or C1 controls.
  const nlohmann::json value = {{"reason",
                                 "a\x7f b\xc2\x9b"
                                 "31m c\u202e d\x1b 日本"}};
  const std::string dumped = value.dump();
  const std::string safe = JsonTerminalSafe(dumped);
  EXPECT_EQ(safe, R"({"reason":"a\u007f b\u009b31m c\u202e d\u001b 日本"})");
  EXPECT_EQ(nlohmann::json::parse(safe), value);
  // Structure and whitespace between values are untouched.
  EXPECT_EQ(JsonTerminalSafe("{\n  \"a\": [1, 2]\n}"), "{\n  \"a\": [1, 2]\n}");
}

TEST(AbbreviateTest, ShortTextIsWhole) {
  EXPECT_EQ(Abbreviate("short"), "short");
  EXPECT_EQ(Abbreviate(std::string(kQuotedValueBytes, 'x')), std::string(kQuotedValueBytes, 'x'));
}

TEST(AbbreviateTest, LongTextKeepsItsStartAndSize) {
  const std::string long_text(1'000'000, 'y');
  EXPECT_EQ(Abbreviate(long_text), std::string(kQuotedValueBytes, 'y') + "... (1000000 bytes)");
  EXPECT_EQ(Abbreviate("abcdef", 3), "abc... (6 bytes)");
}

TEST(AbbreviateTest, NeverSplitsACharacter) {
  // "日" is three bytes: a cut at 4 or 5 bytes keeps only the first.
  const std::string text = "日日日";
  EXPECT_EQ(Abbreviate(text, 3), "日... (9 bytes)");
  EXPECT_EQ(Abbreviate(text, 4), "日... (9 bytes)");
  EXPECT_EQ(Abbreviate(text, 5), "日... (9 bytes)");
  EXPECT_EQ(Abbreviate(text, 6), "日日... (9 bytes)");
}

}  // namespace
}  // namespace moetrain
