// `loom sweep --config SWEEP.pbtxt [--trials N] [--budget 2h] --out DIR`:
// a hyper-parameter search whose trials train packed into fused arrays
// (train/sweep/sweep.h, docs/sweep.md); `loom sweep --resume DIR` continues
// a killed one.
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/logging.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/stop_signals.h"
#include "train/sweep/sweep.h"

namespace loom::tools {

Status SweepCommand(const std::vector<std::string>& args) {
  Flags flags({{"config", "the sweep file (text protobuf, docs/sweep.md); required unless --resume"},
               {"out", "the sweep's folder (must be absent or empty)"},
               {"resume", "continue the sweep in this folder"},
               {"trials", "the number of trials (overrides the file's trials)"},
               {"budget", "wall-clock budget (90s, 30m, 2h): no new array starts once it is spent"},
               {"no-packing?", "train every trial alone, one after another (the baseline packing is measured against)"}});
  LOOM_RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::printf("usage: loom sweep --config SWEEP.pbtxt --out DIR [--trials N] [--budget 2h] [--no-packing]\n"
                "       loom sweep --resume DIR\n%s",
                flags.Help().c_str());
    return Status::Ok();
  }
  SetLogVerbosity(flags.verbosity());
  sweep::SweepOptions options;
  if (flags.Has("resume")) {
    if (flags.Has("config") || flags.Has("trials") || flags.Has("budget") || flags.Has("no-packing"))
      return InvalidArgument("--resume DIR continues the sweep as it began: no --config, --trials, --budget or --no-packing");
    options.out_dir = flags.Str("resume", "");
    options.resume = true;
    const std::string saved = (std::filesystem::path(options.out_dir) / "sweep.pbtxt").string();
    if (!std::filesystem::exists(saved)) return NotFound(options.out_dir, " holds no sweep to resume (no sweep.pbtxt)");
    LOOM_ASSIGN_OR_RETURN(options.input, sweep::LoadSweep(saved));
  } else {
    if (!flags.Has("config")) return InvalidArgument("--config SWEEP.pbtxt is required (or --resume DIR)");
    if (!flags.Has("out")) return InvalidArgument("--out DIR is required: the sweep's folder");
    options.out_dir = flags.Str("out", "");
    LOOM_ASSIGN_OR_RETURN(options.input, sweep::LoadSweep(flags.Str("config", "")));
    proto::SweepSpec& spec = options.input.spec;
    if (flags.Has("trials")) {
      LOOM_ASSIGN_OR_RETURN(const int64_t trials, flags.Int("trials", 0));
      if (trials < 1 || trials > 100000) return InvalidArgument("--trials must be in [1, 100000], got ", trials);
      spec.set_trials(trials);
    }
    if (flags.Has("budget")) {
      LOOM_ASSIGN_OR_RETURN(const double budget, flags.Seconds("budget", ""));
      spec.set_budget_s(budget);
    }
    // Without packing every array holds one trial: saved in the sweep so a
    // resume keeps it.
    if (flags.Has("no-packing")) spec.set_max_array(1);
  }
  options.packing = options.input.spec.max_array() != 1;
  LOOM_ASSIGN_OR_RETURN(const sweep::SweepResult result, sweep::RunSweep(options));
  if (result.stop_signal != 0) {
    // Exit as the signal would have, as loom train does.
    std::fflush(nullptr);
    std::exit(train::StopSignals::ExitStatus(result.stop_signal));
  }
  return Status::Ok();
}

}  // namespace loom::tools
