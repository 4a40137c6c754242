#include "core/parse.h"

#include <cerrno>
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
