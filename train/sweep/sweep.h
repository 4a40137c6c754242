// `loom sweep`: a hyper-parameter search whose trials train packed into
// fused arrays (HFTA's HFHT). Trials with equal non-fusible values (all but
// the optimizer's and schedule's numbers and the seed) share an array whose
// size comes from the memory plan (train/replica_plan.h); arrays with other
// values run one after another. Hyperband's brackets run rung by rung: every
// array of a bracket trains to the rung's epoch, the bracket's trials are
// ranked, and the losers leave their arrays (TrainingLoop::StopReplicas,
// the early stop's re-fusion). docs/sweep.md.
//
// The sweep's folder holds sweep.pbtxt (the resolved sweep), sweep_state
// .pbtxt, arrays/<name>/ (each an ordinary run folder: config.pbtxt,
// metrics.jsonl, checkpoints, TensorBoard events), trials/t<id>/
// (config.pbtxt: the trial alone as a `loom train` config; metrics.jsonl:
// its lines), trials.jsonl and leaderboard.txt. A killed sweep resumes from
// the arrays' checkpoints: every decision is a function of the recorded
// metrics, so no trial is run twice or lost.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "train/sweep/sweep_space.h"

namespace loom::sweep {

// A bracket: `n` consecutive trials from `first_trial`, trained to
// rung_epochs[0], the best 1/eta of them on to rung_epochs[1], and so on.
// Random search is one bracket of one rung.
struct Bracket {
  int64_t first_trial = 0;
  int64_t n = 0;
  std::vector<int64_t> rung_epochs;
};

// The brackets of a spec: Hyperband's (Li et al. 2018) for max_resource R,
// min_resource r and eta: s_max = floor(log_eta(R / r)); bracket s (s_max
// down to 0) has ceil((s_max + 1) / (s + 1) * eta^s) trials and rungs at
// R / eta^s, ..., R / eta, R epochs (rounded). Iterations repeat until
// `trials` (all of them when 0: one iteration); the last bracket may be cut.
std::vector<Bracket> PlanBrackets(const proto::SweepSpec& spec);

// The q-quantile (0 <= q <= 1) of the finite values, linearly interpolated
// (numpy's default); -inf when none is finite. ASHA's cut-off at a rung is
// the (1 - 1/eta) quantile of the scores recorded there.
double Quantile(std::vector<double> values, double q);

struct SweepOptions {
  SweepInput input;     // loaded; spec.trials and budget_s already overridden by flags
  std::string out_dir;  // the sweep's folder
  bool resume = false;  // continue the sweep in out_dir
  // false: every trial trains alone (one array per trial), the baseline of
  // the packing benchmark.
  bool packing = true;
  FILE* console = stdout;
};

struct TrialResult {
  int64_t id = 0;
  std::string label;
  int64_t epochs = 0;  // the last rung it reached (0: not run)
  double metric = 0;   // at that rung (NaN: diverged or missing)
  std::string status;  // finished | stopped at rung i | not run (budget)
};

struct SweepResult {
  std::vector<TrialResult> leaderboard;  // best first
  double seconds = 0;                    // this process's wall time
  // SIGINT or SIGTERM stopped the sweep (after a checkpoint of the array in
  // progress; a second signal ends the process at once); 0 when it ended.
  int stop_signal = 0;
};

StatusOr<SweepResult> RunSweep(const SweepOptions& options);

}  // namespace loom::sweep
