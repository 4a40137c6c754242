#include "core/parse.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace loom {

IntParse ParseInt64(const std::string& text, int64_t* value) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0') return IntParse::kNotInteger;
  *value = static_cast<int64_t>(v);
  return errno == ERANGE ? IntParse::kOutOfRange : IntParse::kOk;
}

std::string JsonQuoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char u[8];
      std::snprintf(u, sizeof u, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += u;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    items.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return items;
    start = comma + 1;
  }
}

}  // namespace loom
