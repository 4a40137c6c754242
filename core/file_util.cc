#include "core/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace loom {

namespace {
Status FileError(const std::string& what, const std::string& path, int err) {
  std::string message = StrCat("cannot ", what, " '", path, "': ", std::strerror(err));
  if (err == ENOENT) return Status(StatusCode::kNotFound, message);
  if (err == ENOSPC || err == EDQUOT) return Status(StatusCode::kResourceExhausted, message);
  return Status(StatusCode::kFailedPrecondition, message);
}
}  // namespace

Status WriteFileAtomically(const std::string& path, const std::string& data) {
  static std::atomic<int> counter{0};
  const std::string tmp = StrCat(path, ".tmp-", ::getpid(), "-", counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return FileError("create a temporary file for", path, errno);
  auto fail = [&](const char* what, int err) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return FileError(what, path, err);
  };
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("write", errno);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return fail("write", errno);
  int closed = ::close(fd);
  fd = -1;
  if (closed != 0) return fail("write", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename a temporary file onto", errno);
  const std::string dir = std::filesystem::path(path).parent_path().string();
  int dir_fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return FileError("open the directory of", path, errno);
  int synced = ::fsync(dir_fd);
  int err = errno;
  ::close(dir_fd);
  if (synced != 0) return FileError("sync the directory of", path, err);
  return Status::Ok();
}

}  // namespace loom
