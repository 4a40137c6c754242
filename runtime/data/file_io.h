// Whole-file reads shared by the dataset readers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace loom {

// The file's bytes, gunzipped when it is gzip data (plain files pass through
// unchanged, so "x" and "x.gz" read alike). Errors name the file: missing,
// unreadable, corrupt gzip stream.
StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path);

}  // namespace loom
