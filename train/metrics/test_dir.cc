#include "train/metrics/test_dir.h"

#include <cstdlib>
#include <filesystem>

namespace loom::metrics::testing {

std::string FreshTestDir(const std::string& name) {
  namespace fs = std::filesystem;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(tmp ? tmp : fs::temp_directory_path().string()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

}  // namespace loom::metrics::testing
