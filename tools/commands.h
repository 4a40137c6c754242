// The subcommands of the `loom` binary.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace loom::tools {

Status TrainCommand(const std::vector<std::string>& args);
Status BenchCommand(const std::vector<std::string>& args);
Status OpsCommand(const std::vector<std::string>& args);
Status CheckpointCommand(const std::vector<std::string>& args);

}  // namespace loom::tools
