// Chrome trace JSON (chrome://tracing, Perfetto): named rows and complete
// spans. The task runtime's trace (`loom train --trace`) and the
// simulator's (`loom simulate --trace`) share this layout, so a measured
// and a predicted step open side by side.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

class ChromeTrace {
 public:
  void NameRow(int64_t row, const std::string& name);
  // A span of [start, end) seconds on `row`.
  void Span(int64_t row, const std::string& name, const std::string& category, double start_s, double end_s);
  std::string Json() const;

 private:
  std::vector<std::string> events_;
};

}  // namespace loom
