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
  // Rows belong to a group (a trace "process"): group 0 unless one trace
  // shows several runs one above the other (a GAN iteration's two steps).
  void NameGroup(int64_t group, const std::string& name);
  void NameRow(int64_t row, const std::string& name, int64_t group = 0);
  // A span of [start, end) seconds on `row` of `group`.
  void Span(int64_t row, const std::string& name, const std::string& category, double start_s, double end_s,
            int64_t group = 0);
  std::string Json() const;

 private:
  std::vector<std::string> events_;
};

}  // namespace loom
