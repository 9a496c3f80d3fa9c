// text_escape.h: the one escaping rule for text written to a terminal or a line-oriented file
// (analyze, timeline, blocks, dump, error messages). Strings from a snapshot are untrusted: a frame
// name can hold ESC sequences that retitle or clear a terminal, a CR that overwrites the line, a
// NUL or bytes that are not UTF-8.
#pragma once

#include <string>
#include <string_view>

namespace memforensics {

// Appends `s` to `out`, writing as \xNN (two lowercase hex digits, one per byte):
//   * the C0 controls 0x00-0x1f (newline, tab and CR included) and DEL 0x7f;
//   * the C1 controls U+0080-U+009F (each of the two bytes of their UTF-8 form, \xc2\x80 ..);
//   * every byte that is not part of a well-formed UTF-8 sequence (stray continuation bytes,
//     truncated sequences, overlong forms, UTF-16 surrogates, code points above U+10FFFF).
// A backslash becomes \\ so that the result reads back unambiguously; with `quote`, '"' becomes \".
// Everything else (printable ASCII, well-formed UTF-8 from U+00A0 up) is copied unchanged.
void appendEscaped(std::string& out, std::string_view s, bool quote = false);

// `s` escaped as above.
std::string escapeText(std::string_view s);

// `s` escaped as above (with `quote`) between double quotes: dump's quoted fields.
std::string quoteText(std::string_view s);

// The length of the longest prefix of an escapeText() result `escaped` that is at most `max_bytes`
// long and does not cut an escape (\xNN, \\, \") or a UTF-8 sequence in two.
size_t escapedPrefixLength(std::string_view escaped, size_t max_bytes);

}  // namespace memforensics
