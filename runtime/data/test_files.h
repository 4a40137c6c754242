// Helpers for the data tests: files written to the test's scratch folder.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::testing {

// A path in Bazel's TEST_TMPDIR (else the system temp folder).
std::string TempPath(const std::string& name);

// Writes `bytes` to `path`, gzip-compressed when `gzip` is set.
void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes, bool gzip = false);

// An IDX file: the magic number, the dimensions and the data, big-endian.
std::vector<uint8_t> IdxFile(uint32_t magic, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data);

}  // namespace loom::testing
