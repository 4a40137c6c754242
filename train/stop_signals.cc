#include "train/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace loom::train {

namespace {

std::atomic<int> received{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free flag");
struct sigaction previous_int, previous_term;

// Only async-signal-safe calls here: write(2), signal(2), raise(3).
void OnSignal(int sig) {
  int expected = 0;
  if (!received.compare_exchange_strong(expected, sig)) {
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  const char* msg = sig == SIGINT ? "\nloom: SIGINT: stopping after this step with a checkpoint (again to stop at once)\n"
                                  : "\nloom: SIGTERM: stopping after this step with a checkpoint (again to stop at once)\n";
  ssize_t ignored = write(STDERR_FILENO, msg, std::strlen(msg));
  (void)ignored;
}

}  // namespace

StopSignals::StopSignals() {
  received.store(0);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads and writes in progress go on
  sigaction(SIGINT, &sa, &previous_int);
  sigaction(SIGTERM, &sa, &previous_term);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
}

int StopSignals::Received() { return received.load(); }

const char* StopSignals::Name(int signal) { return signal == SIGINT ? "SIGINT" : "SIGTERM"; }

}  // namespace loom::train
