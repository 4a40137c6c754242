// Files as the metrics writers use them: written with write(2) straight to
// the kernel, so every record that Append returns from survives the process
// being killed (not a power loss: nothing is fsynced), and read whole.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace loom::metrics {

class AppendFile {
 public:
  enum class Mode {
    kAppend,     // create if missing, keep what is there
    kTruncate,   // create if missing, empty it
    kCreateNew,  // fail if the file exists
  };

  // Creates missing parent directories.
  static StatusOr<AppendFile> Open(const std::string& path, Mode mode);

  AppendFile(AppendFile&& other) noexcept;
  AppendFile& operator=(AppendFile&& other) noexcept;
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  ~AppendFile();

  // Writes all of `data` at the end of the file, or (on an error midway)
  // none of it.
  Status Append(std::string_view data);
  const std::string& path() const { return path_; }

 private:
  AppendFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  void Close();

  std::string path_;
  int fd_ = -1;
};

StatusOr<std::string> ReadWholeFile(const std::string& path);

// "cannot <what> '<path>': <strerror>", with a code that says whose fault it is.
Status FileError(const std::string& what, const std::string& path, int err);

}  // namespace loom::metrics
