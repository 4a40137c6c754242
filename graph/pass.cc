#include "graph/pass.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/logging.h"
#include "graph/verifier.h"

namespace loom {

std::vector<std::string> PassPipeline::PassNames() const {
  std::vector<std::string> names;
  for (const auto& p : passes_) names.push_back(p->name());
  return names;
}

StatusOr<bool> PassPipeline::Run(Graph* graph) {
  // A disabled name that matches no pass is almost always a typo.
  for (const std::string& d : options_.disabled_passes) {
    bool found = false;
    for (const auto& p : passes_) found = found || p->name() == d;
    if (!found) LOOM_LOG_WARN("pass pipeline '{}': disabled pass '{}' is not in the pipeline", name_, d);
  }

  Status before = VerifyGraph(*graph);
  if (!before.ok()) return before.WithContext("pass pipeline '" + name_ + "': invalid graph before the first pass");

  bool changed = false;
  const int count = static_cast<int>(passes_.size());
  for (int i = 0; i < count; ++i) {
    Pass& pass = *passes_[i];
    const std::string where = "pass pipeline '" + name_ + "', pass '" + pass.name() + "' (" + std::to_string(i + 1) +
                              " of " + std::to_string(count) + ")";
    if (options_.disabled_passes.count(pass.name())) {
      LOOM_LOG_DEBUG("{}: disabled, skipped", where);
      continue;
    }
    StatusOr<bool> result = pass.Run(graph);
    if (!result.ok()) return result.status().WithContext(where);
    changed = changed || *result;
    Status after = VerifyGraph(*graph);
    if (!after.ok()) return after.WithContext(where + " left an invalid graph");
    LOOM_LOG_DEBUG("{}: {}", where, *result ? "changed the graph" : "no change");
    Status dumped = Dump(PassDump{name_, pass.name(), i + 1, *result, graph});
    if (!dumped.ok()) return dumped.WithContext(where);
  }
  return changed;
}

Status PassPipeline::Dump(const PassDump& dump) const {
  if (options_.dump_callback) options_.dump_callback(dump);
  if (options_.dump_dir.empty()) return Status::Ok();
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(options_.dump_dir, ec);
  if (ec) return InvalidArgument("cannot create dump directory '", options_.dump_dir, "': ", ec.message());
  char index[16];
  std::snprintf(index, sizeof(index), "%02d", dump.index);
  const fs::path path = fs::path(options_.dump_dir) / (dump.pipeline + "." + index + "." + dump.pass + ".txt");
  std::ofstream out(path);
  if (!out) return InvalidArgument("cannot open dump file '", path.string(), "': ", std::strerror(errno));
  out << "# after pass '" << dump.pass << "' of pipeline '" << dump.pipeline << "'"
      << (dump.changed ? "" : " (no change)") << "\n"
      << dump.graph->ToString();
  out.close();
  if (!out) return InvalidArgument("cannot write dump file '", path.string(), "'");
  return Status::Ok();
}

}  // namespace loom
