#include "train/metrics/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace loom::metrics {

Status FileError(const std::string& what, const std::string& path, int err) {
  std::string message = StrCat("cannot ", what, " '", path, "': ", std::strerror(err));
  if (err == ENOENT) return Status(StatusCode::kNotFound, message);
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) return Status(StatusCode::kResourceExhausted, message);
  return Status(StatusCode::kInvalidArgument, message);
}

StatusOr<AppendFile> AppendFile::Open(const std::string& path, Mode mode) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) return FileError("create the directory", parent.string(), ec.value());
  }
  int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC;
  if (mode == Mode::kTruncate) flags |= O_TRUNC;
  if (mode == Mode::kCreateNew) flags |= O_EXCL;
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) return FileError("open", path, errno);
  return AppendFile(path, fd);
}

AppendFile::AppendFile(AppendFile&& other) noexcept : path_(std::move(other.path_)), fd_(other.fd_) { other.fd_ = -1; }

AppendFile& AppendFile::operator=(AppendFile&& other) noexcept {
  if (this != &other) {
    Close();
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

AppendFile::~AppendFile() { Close(); }

void AppendFile::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status AppendFile::Append(std::string_view data) {
  LOOM_CHECK(fd_ >= 0, "append to a closed (moved-from) file");
  const off_t start = ::lseek(fd_, 0, SEEK_END);
  if (start < 0) return FileError("seek in", path_, errno);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      // Cut off the part that was written (a disk filled up midway), so the
      // file never ends in half a record.
      if (done > 0 && ::ftruncate(fd_, start) != 0)
        return Status(StatusCode::kDataLoss,
                      StrCat(FileError("write to", path_, err).message(), "; removing the partial record also failed"));
      return FileError("write to", path_, err);
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FileError("open", path, errno);
  std::string data;
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return FileError("read", path, err);
    }
    if (n == 0) break;
    data.append(chunk, static_cast<size_t>(n));
  }
  ::close(fd);
  return data;
}

}  // namespace loom::metrics
