#include "train/metrics/file_io.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>

#include "train/metrics/test_dir.h"

namespace loom::metrics {
namespace {

std::string ReadOk(const std::string& path) {
  auto data = ReadWholeFile(path);
  INFO(data.status().ToString());
  REQUIRE(data.ok());
  return *data;
}

TEST_CASE("open modes: append keeps, truncate empties, create-new refuses an existing file") {
  const std::string path = testing::FreshTestDir("file_io_modes") + "/a/b/out.txt";  // a/b/ are created
  {
    auto f = AppendFile::Open(path, AppendFile::Mode::kCreateNew);
    REQUIRE(f.ok());
    REQUIRE(f->Append("one\n").ok());
    AppendFile moved = std::move(*f);
    REQUIRE(moved.Append("two\n").ok());
    CHECK(moved.path() == path);
  }
  CHECK(ReadOk(path) == "one\ntwo\n");
  {
    auto f = AppendFile::Open(path, AppendFile::Mode::kAppend);
    REQUIRE(f.ok());
    REQUIRE(f->Append("three\n").ok());
  }
  CHECK(ReadOk(path) == "one\ntwo\nthree\n");
  auto again = AppendFile::Open(path, AppendFile::Mode::kCreateNew);
  REQUIRE_FALSE(again.ok());
  CHECK(again.status().message() == "cannot open '" + path + "': File exists");
  {
    auto f = AppendFile::Open(path, AppendFile::Mode::kTruncate);
    REQUIRE(f.ok());
  }
  CHECK(ReadOk(path).empty());
}

TEST_CASE("errors name the file and the cause") {
  const std::string dir = testing::FreshTestDir("file_io_errors");
  auto missing = ReadWholeFile(dir + "/missing");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK(missing.status().message() == "cannot open '" + dir + "/missing': No such file or directory");
  // A directory where a parent directory should be.
  REQUIRE(AppendFile::Open(dir + "/file", AppendFile::Mode::kAppend).ok());
  auto blocked = AppendFile::Open(dir + "/file/x", AppendFile::Mode::kAppend);
  REQUIRE_FALSE(blocked.ok());
  CHECK(blocked.status().message().rfind("cannot create the directory '" + dir + "/file'", 0) == 0);
}

TEST_CASE("a write that fails midway leaves no partial record") {
  const std::string path = testing::FreshTestDir("file_io_partial") + "/out.txt";
  // In a child process, a 100-byte file size limit makes the second append
  // fail after writing part of it (as a disk filling up would).
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{100, 100};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(10);
    auto f = AppendFile::Open(path, AppendFile::Mode::kTruncate);
    if (!f.ok() || !f->Append(std::string(60, 'a')).ok()) _exit(11);
    Status s = f->Append(std::string(80, 'b'));
    if (s.ok()) _exit(12);
    if (s.code() != StatusCode::kResourceExhausted) _exit(13);
    if (s.message() != "cannot write to '" + path + "': File too large") _exit(14);
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(ReadOk(path) == std::string(60, 'a'));
}

}  // namespace
}  // namespace loom::metrics
