// Helpers for the data tests: files written to the test's scratch folder.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace loom::testing {

// The message of a failed result; "" when it succeeded.
template <typename T>
std::string ErrorOf(const StatusOr<T>& s) {
  return s.ok() ? "" : s.status().message();
}

// A path in Bazel's TEST_TMPDIR (else the system temp folder).
std::string TempPath(const std::string& name);

// `bytes` as one gzip member.
std::vector<uint8_t> Gzip(const std::vector<uint8_t>& bytes);

// Writes `bytes` to `path`, gzip-compressed when `gzip` is set.
void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes, bool gzip = false);

// An IDX file: the magic number, the dimensions and the data, big-endian.
std::vector<uint8_t> IdxFile(uint32_t magic, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data);

}  // namespace loom::testing
