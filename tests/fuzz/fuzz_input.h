// What the fuzz targets share: the input as a file, for readers that take a
// path (the data files, checkpoints). One file per process, rewritten for
// every input.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace loom::fuzz {

inline const std::string& InputPath() {
  static const std::string path = [] {
    // Memory-backed where there is one: every input is written and read back.
    const char* dir = std::getenv("TEST_TMPDIR");
    if (!dir) dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    return std::string(dir) + "/loom_fuzz_input." + std::to_string(getpid());
  }();
  return path;
}

// Writes the input to InputPath() and returns that path.
inline const std::string& AsFile(const uint8_t* data, size_t size) {
  std::ofstream(InputPath(), std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data),
                                                                      static_cast<std::streamsize>(size));
  return InputPath();
}

// Writes the input's two halves to two files (for readers of several files)
// and returns their paths.
inline std::vector<std::string> AsTwoFiles(const uint8_t* data, size_t size) {
  std::vector<std::string> paths = {InputPath() + ".a", InputPath() + ".b"};
  const size_t half = size / 2;
  std::ofstream(paths[0], std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data),
                                                                   static_cast<std::streamsize>(half));
  std::ofstream(paths[1], std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data + half),
                                                                   static_cast<std::streamsize>(size - half));
  return paths;
}

// A broken invariant: abort, so that libFuzzer keeps the input as a crash.
inline void Require(bool holds, const char* what) {
  if (!holds) {
    std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace loom::fuzz
