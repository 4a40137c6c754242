// Numbers and lists from user text (flags, model arguments), checked the
// same way everywhere: strtoll alone reads "12x" as 12 unless the end is
// checked, and clamps values beyond int64 without a word.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

enum class IntParse { kOk, kNotInteger, kOutOfRange };

// `text` as a whole base-10 int64 in *value. On kOutOfRange *value is the
// bound the text passed (INT64_MIN or INT64_MAX), for the message.
IntParse ParseInt64(const std::string& text, int64_t* value);

// "a,,b" -> {"a", "", "b"}; "" -> {""}.
std::vector<std::string> SplitCommas(const std::string& text);
// `text` as a JSON string literal: quoted, with quotes, backslashes and
// control characters escaped.
std::string JsonQuoted(const std::string& text);

}  // namespace loom
