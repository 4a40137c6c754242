// Scratch files for tests: a fresh directory per test case under Bazel's
// TEST_TMPDIR, and whole-file reads and writes.
#pragma once

#include <filesystem>
#include <string>

namespace loom::testing {

// <TEST_TMPDIR or the system temp dir>/<name>, emptied and created.
std::filesystem::path FreshTempDir(const std::string& name);
std::string ReadBytes(const std::filesystem::path& path);
void WriteBytes(const std::filesystem::path& path, const std::string& data);

}  // namespace loom::testing
