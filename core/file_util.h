// Writing files so that a crash never leaves a half-written one: the data
// goes to a fresh sibling, which is synced and renamed over the target, and
// the directory is synced so the rename itself survives a power loss.
#pragma once

#include <string>

#include "core/status.h"

namespace loom {

// On any failure the sibling is removed and `path` is untouched. Errors name
// `path` and the system's reason.
Status WriteFileAtomically(const std::string& path, const std::string& data);

}  // namespace loom
