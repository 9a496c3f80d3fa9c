// text_escape_test.cc: the one escaping rule for text output (common/text_escape.h).
#include "common/text_escape.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace memforensics {
namespace {

using namespace std::string_literals;

TEST(TextEscape, PrintableAsciiAndValidUtf8Unchanged) {
  EXPECT_EQ(escapeText("model.py:54 forward"), "model.py:54 forward");
  EXPECT_EQ(escapeText("caf\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x94\xa5 \xc2\xa0"),
            "caf\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x94\xa5 \xc2\xa0");
  EXPECT_EQ(escapeText(""), "");
}

TEST(TextEscape, TerminalControlsEscaped) {
  EXPECT_EQ(escapeText("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");
  EXPECT_EQ(escapeText("\x1b[2J"), "\\x1b[2J");
  EXPECT_EQ(escapeText("a\rb\nc\td"), "a\\x0db\\x0ac\\x09d");
  EXPECT_EQ(escapeText("a\0b"s), "a\\x00b");
  EXPECT_EQ(escapeText("\x7f"), "\\x7f");
  // C1 controls: CSI U+009B and OSC U+009D act on many terminals; each byte of the UTF-8 form.
  EXPECT_EQ(escapeText("\xc2\x9b"
                       "2J"),
            "\\xc2\\x9b2J");
  EXPECT_EQ(escapeText("\xc2\x80\xc2\x9f"), "\\xc2\\x80\\xc2\\x9f");
}

TEST(TextEscape, InvalidUtf8EscapedBytewise) {
  EXPECT_EQ(escapeText("\xff"), "\\xff");
  EXPECT_EQ(escapeText("a\x80z"), "a\\x80z");                // stray continuation byte
  EXPECT_EQ(escapeText("\xc3"), "\\xc3");                    // truncated at the end
  EXPECT_EQ(escapeText("\xc3(x"), "\\xc3(x");                // lead byte without a continuation
  EXPECT_EQ(escapeText("\xc0\xaf"), "\\xc0\\xaf");           // overlong '/'
  EXPECT_EQ(escapeText("\xe0\x80\xaf"), "\\xe0\\x80\\xaf");  // overlong, 3 bytes
  EXPECT_EQ(escapeText("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // UTF-16 surrogate
  EXPECT_EQ(escapeText("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(escapeText("\xe2\x82"), "\\xe2\\x82");                    // truncated 3-byte sequence
  EXPECT_EQ(escapeText("\xf8\x88\x80\x80\x80"), "\\xf8\\x88\\x80\\x80\\x80");
}

TEST(TextEscape, BackslashAndQuotes) {
  EXPECT_EQ(escapeText("C:\\x1b"), "C:\\\\x1b");  // a literal "\x1b" cannot pass for an escaped ESC
  EXPECT_EQ(escapeText("say \"hi\""), "say \"hi\"");
  // dump's quoted form, byte for byte what dump wrote before the escaper moved here.
  EXPECT_EQ(quoteText("say \"hi\" \\ \x01\x7f"), "\"say \\\"hi\\\" \\\\ \\x01\\x7f\"");
}

TEST(TextEscape, OutputIsAlwaysSafe) {
  // Every byte string of length 2 escapes to printable ASCII or well-formed UTF-8 without controls.
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) {
      std::string s{static_cast<char>(a), static_cast<char>(b)};
      std::string e = escapeText(s);
      EXPECT_EQ(escapeText(e).size(),
                e.size() + static_cast<size_t>(std::count(e.begin(), e.end(), '\\')))
          << a << "," << b;
      for (unsigned char c : e) ASSERT_TRUE(c >= 0x20 && c != 0x7f) << a << "," << b;
    }
  }
}

TEST(TextEscape, PrefixNeverCutsAnEscapeOrACharacter) {
  std::string e = escapeText("ab\x1b\xc3\xa9z");  // "ab\x1b" "é" "z"
  EXPECT_EQ(e, "ab\\x1b\xc3\xa9z");
  EXPECT_EQ(escapedPrefixLength(e, 2), 2u);
  EXPECT_EQ(escapedPrefixLength(e, 3), 2u);
  EXPECT_EQ(escapedPrefixLength(e, 5), 2u);
  EXPECT_EQ(escapedPrefixLength(e, 6), 6u);
  EXPECT_EQ(escapedPrefixLength(e, 7), 6u);
  EXPECT_EQ(escapedPrefixLength(e, 8), 8u);
  EXPECT_EQ(escapedPrefixLength(e, 100), e.size());
  EXPECT_EQ(escapedPrefixLength("\\\\x", 1), 0u);
}

}  // namespace
}  // namespace memforensics
