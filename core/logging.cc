#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace loom {

spdlog::logger& Log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("loom");
    l->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    l->set_level(spdlog::level::warn);
    return l;
  }();
  return *logger;
}

void SetLogVerbosity(int verbosity) {
  spdlog::level::level_enum level = spdlog::level::warn;
  if (verbosity == 1) level = spdlog::level::info;
  if (verbosity == 2) level = spdlog::level::debug;
  if (verbosity >= 3) level = spdlog::level::trace;
  Log().set_level(level);
}

}  // namespace loom
