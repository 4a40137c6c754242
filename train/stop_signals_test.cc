#include "train/stop_signals.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

namespace loom::train {
namespace {

// Runs `body` in a child process; returns its wait status.
template <typename Body>
int InChild(Body body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST_CASE("the first SIGINT or SIGTERM is recorded, the second ends the process") {
  for (int sig : {SIGINT, SIGTERM}) {
    const int first = InChild([sig] {
      StopSignals signals;
      if (StopSignals::Received() != 0) return 1;
      raise(sig);
      return StopSignals::Received() == sig ? 0 : 2;
    });
    REQUIRE(WIFEXITED(first));
    CHECK(WEXITSTATUS(first) == 0);

    const int second = InChild([sig] {
      StopSignals signals;
      raise(sig);
      raise(sig);
      return 3;  // not reached: the second signal's default action ends the process
    });
    REQUIRE(WIFSIGNALED(second));
    CHECK(WTERMSIG(second) == sig);
  }
  CHECK(StopSignals::ExitStatus(SIGINT) == 130);
  CHECK(StopSignals::ExitStatus(SIGTERM) == 143);
}

TEST_CASE("the handlers are restored when the guard goes") {
  const int status = InChild([] {
    { StopSignals signals; }
    raise(SIGTERM);  // the default action again
    return 0;
  });
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGTERM);
}

}  // namespace
}  // namespace loom::train
