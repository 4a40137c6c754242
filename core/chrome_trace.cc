#include "core/chrome_trace.h"

#include "core/parse.h"
#include "core/status.h"

namespace loom {

void ChromeTrace::NameGroup(int64_t group, const std::string& name) {
  events_.push_back(StrCat("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": ", group,
                           ", \"args\": {\"name\": ", JsonQuoted(name), "}}"));
}

void ChromeTrace::NameRow(int64_t row, const std::string& name, int64_t group) {
  events_.push_back(StrCat("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": ", group, ", \"tid\": ", row,
                           ", \"args\": {\"name\": ", JsonQuoted(name), "}}"));
}

void ChromeTrace::Span(int64_t row, const std::string& name, const std::string& category, double start_s,
                       double end_s, int64_t group) {
  events_.push_back(StrCat("{\"name\": ", JsonQuoted(name), ", \"cat\": ", JsonQuoted(category),
                           ", \"ph\": \"X\", \"pid\": ", group, ", \"tid\": ", row, ", \"ts\": ", start_s * 1e6,
                           ", \"dur\": ", (end_s - start_s) * 1e6, "}"));
}

std::string ChromeTrace::Json() const {
  std::string s = "{\"traceEvents\": [";
  for (size_t i = 0; i < events_.size(); ++i) s += (i ? ",\n  " : "\n  ") + events_[i];
  return s + "\n]}\n";
}

}  // namespace loom
