// SIGINT and SIGTERM ask a training run to stop cleanly: the first one is
// recorded, and the run stops after the step it is in, with a checkpoint and
// its records closed; a second one ends the process at once, as the signal's
// default action would have.
#pragma once

namespace loom::train {

class StopSignals {
 public:
  StopSignals();   // installs the handlers and forgets earlier signals
  ~StopSignals();  // restores the handlers that were there before
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received since construction (SIGINT or SIGTERM), or 0.
  static int Received();
  // 128 + signal: the exit status a shell reports for a process the signal
  // ended (130 for SIGINT, 143 for SIGTERM).
  static int ExitStatus(int signal) { return 128 + signal; }
  // "SIGINT" or "SIGTERM".
  static const char* Name(int signal);
};

}  // namespace loom::train
