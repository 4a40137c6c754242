// Logging through spdlog. Verbosity: 0 = warnings and errors, 1 = info,
// 2 = debug, 3 = trace (the command line's -v flags).
#pragma once

#include <spdlog/spdlog.h>

namespace loom {

void SetLogVerbosity(int verbosity);
spdlog::logger& Log();

}  // namespace loom

#define LOOM_LOG_INFO(...) ::loom::Log().info(__VA_ARGS__)
#define LOOM_LOG_WARN(...) ::loom::Log().warn(__VA_ARGS__)
#define LOOM_LOG_DEBUG(...) ::loom::Log().debug(__VA_ARGS__)
#define LOOM_LOG_ERROR(...) ::loom::Log().error(__VA_ARGS__)
