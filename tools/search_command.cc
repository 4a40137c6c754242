// `loom search --config C --machine M [--budget 30s | --proposals N]
// [--seed S] --out S.pbtxt`: a strategy for a config's model on a machine
// (search/search.h, docs/search.md), with the found strategy against each
// starting point.
#include <cstdio>
#include <filesystem>
#include <string>

#include "core/file_util.h"
#include "graph/strategy.h"
#include "search/baselines.h"
#include "search/search.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/config/train_config.h"

namespace loom::tools {

Status SearchCommand(const std::vector<std::string>& args) {
  Flags flags({{"config", "the training config whose model to parallelize"},
               {"machine", "a machine file (simulator/machines/*.pbtxt)"},
               {"devices", "how many of the machine's devices (default: all)"},
               {"budget", "the search's wall time, starting points included: 30s (default), 2m, 500ms"},
               {"proposals", "stop after this many proposals instead (the result then depends on --seed only)"},
               {"seed", "the chains' seed (default 1)"},
               {"chains", "Markov chains run at once, on a thread per core at most (default 4); with --proposals "
                          "the result depends on --seed and --chains only"},
               {"beta", "the chain's inverse temperature: a proposal x% slower is accepted with probability "
                        "exp(-beta * x / 100) (default 1000)"},
               {"strategy", "a strategy file to start from too"},
               {"min-gain", "how much faster (a fraction) the found strategy must be predicted than the best standard "
                            "or given one to replace it (default 0.05)"},
               {"profile", "this machine's measured task times (loom profile), as for loom simulate"},
               {"out", "the strategy file to write"},
               {"candidates", "also write each starting point's strategy and the searched one here "
                              "(DIR/dp.pbtxt, DIR/exact.pbtxt, ..., DIR/searched.pbtxt)"}});
  LOOM_RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::printf("usage: loom search --config FILE --machine FILE --out FILE [flags]\n%s", flags.Help().c_str());
    return Status::Ok();
  }
  if (!flags.Has("config")) return InvalidArgument("loom search needs --config FILE");
  if (!flags.Has("machine"))
    return InvalidArgument("loom search needs --machine FILE (e.g. simulator/machines/p100_4x4.pbtxt)");
  if (!flags.Has("out")) return InvalidArgument("loom search needs --out FILE (the strategy file to write)");
  if (flags.Has("budget") && flags.Has("proposals"))
    return InvalidArgument("--budget and --proposals: give one (a time, or a number of proposals)");
  LOOM_ASSIGN_OR_RETURN(const Machine machine, Machine::Load(flags.Str("machine", "")));
  LOOM_ASSIGN_OR_RETURN(const proto::TrainConfig config, LoadTrainConfig(flags.Str("config", "")));
  LOOM_ASSIGN_OR_RETURN(const int64_t devices, flags.Int("devices", machine.devices()));
  if (devices < 1 || devices > machine.devices())
    return InvalidArgument("--devices ", devices, ": machine ", machine.name(), " has ", machine.devices(), " devices");
  SearchOptions options;
  LOOM_ASSIGN_OR_RETURN(options.budget_seconds, flags.Seconds("budget", "30s"));
  LOOM_ASSIGN_OR_RETURN(options.proposals, flags.Int("proposals", 0));
  LOOM_ASSIGN_OR_RETURN(const int64_t seed, flags.Int("seed", 1));
  if (options.proposals < 0) return InvalidArgument("--proposals must be >= 0");
  options.seed = static_cast<uint64_t>(seed);
  LOOM_ASSIGN_OR_RETURN(options.chains, flags.Int("chains", options.chains));
  if (options.chains < 1) return InvalidArgument("--chains must be >= 1, got ", options.chains);
  LOOM_ASSIGN_OR_RETURN(options.beta, flags.Float("beta", options.beta));
  LOOM_ASSIGN_OR_RETURN(options.min_gain, flags.Float("min-gain", options.min_gain));
  if (!(options.min_gain >= 0 && options.min_gain < 1)) return InvalidArgument("--min-gain must be in [0, 1)");
  if (!(options.beta >= 0)) return InvalidArgument("--beta must be >= 0");
  options.progress = [](const SearchProgress& p) {
    std::printf("  %8lld proposals  %7.1f s  %8.0f/s  best %.6g ms  current %.6g ms\n",
                static_cast<long long>(p.proposals), p.elapsed_seconds,
                p.elapsed_seconds > 0 ? static_cast<double>(p.proposals) / p.elapsed_seconds : 0.0,
                p.best_seconds * 1e3, p.current_seconds * 1e3);
    std::fflush(stdout);
  };

  LOOM_ASSIGN_OR_RETURN(const ConfigPrograms programs, BuildConfigPrograms(config));
  LOOM_ASSIGN_OR_RETURN(const std::unique_ptr<FlagCostModel> cost,
                        FlagCostModel::Load(flags.Str("profile", ""), machine));
  std::vector<std::pair<std::string, Strategy>> given;
  if (flags.Has("strategy")) {
    LOOM_ASSIGN_OR_RETURN(Strategy s, LoadOrMakeStrategy(flags.Str("strategy", ""), programs.forward, devices,
                                                         "--strategy"));
    given.emplace_back(flags.Str("strategy", ""), std::move(s));
  }
  std::printf("searching strategies of %s on %s (%lld devices), %s\n", flags.Str("config", "").c_str(),
              machine.name().c_str(), static_cast<long long>(devices),
              StrCat(options.proposals > 0 ? StrCat(options.proposals, " proposals")
                                           : StrCat(options.budget_seconds, " s"),
                     ", seed ", seed, ", ", options.chains, " chains").c_str());
  LOOM_ASSIGN_OR_RETURN(const SearchResult result, SearchStrategy(programs.forward, programs.step, machine, cost->get(),
                                                                  devices, given, options));

  std::printf("space: %lld layers, 10^%.1f strategies; costs from %s\n", static_cast<long long>(result.layers),
              result.log10_strategies, cost->Describe().c_str());
  std::printf("exact layer-wise solver: %s\n", result.exact.c_str());
  if (!result.kept.empty()) std::printf("kept %s\n", result.kept.c_str());
  std::printf(
      "%lld proposals in %.1f s (%.0f/s), %lld accepted, %lld rejected for memory, %lld improvements, %lld "
      "evaluated before\n",
      static_cast<long long>(result.proposals), result.seconds,
      result.seconds > 0 ? static_cast<double>(result.proposals) / result.seconds : 0.0,
      static_cast<long long>(result.accepted), static_cast<long long>(result.rejected_memory),
      static_cast<long long>(result.improvements), static_cast<long long>(result.remembered));
  std::printf("%-12s %14s %12s %16s %14s\n", "strategy", "predicted ms", "vs searched", "bytes moved", "peak MiB");
  std::vector<Candidate> rows = result.initial;
  rows.push_back(result.best);
  const std::string candidates = flags.Str("candidates", "");
  if (!candidates.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(candidates, ec);
    if (ec) return InvalidArgument("--candidates ", candidates, ": ", ec.message());
  }
  for (const Candidate& c : rows) {
    if (!candidates.empty())
      LOOM_RETURN_IF_ERROR(WriteFileAtomically((std::filesystem::path(candidates) / (c.name + ".pbtxt")).string(),
                                               StrCat("# ", c.name, ": predicted step ", c.cost.seconds * 1e3,
                                                      " ms on ", machine.name(), "\n", StrategyToText(c.strategy))));
    const double peak = c.cost.peak_memory_bytes;
    std::printf("%-12s %14.6g %11.3fx %16.0f %14.2f%s\n", c.name.c_str(), c.cost.seconds * 1e3,
                result.best.cost.seconds > 0 ? c.cost.seconds / result.best.cost.seconds : 0.0, c.cost.bytes_moved,
                peak / (1 << 20), c.cost.fits ? "" : "  (does not fit)");
  }
  // Perfect scaling of one device's step: under the roofline a part costs
  // at least its share of the whole (its FLOPs and bytes, a launch each),
  // so no strategy beats it; it says how much a search can still gain.
  for (const Candidate& c : result.initial) {
    if (c.name != "dp-1" || devices < 2) continue;
    const double bound = c.cost.seconds / static_cast<double>(devices);
    const auto gain = [&](const std::string& name) {
      for (const Candidate& d : rows)
        if (d.name == name) return d.cost.seconds / bound;
      return 0.0;
    };
    std::printf("perfect scaling: %.6g ms (dp-1 / %lld devices); dp at %.3fx of it, searched at %.3fx\n", bound * 1e3,
                static_cast<long long>(devices), gain("dp"), gain("searched"));
  }
  const std::string header =
      StrCat("# Found by `loom search` for ", flags.Str("config", ""), " on ", machine.name(), " (", devices,
             " devices): predicted step ", result.best.cost.seconds * 1e3, " ms.\n");
  LOOM_RETURN_IF_ERROR(WriteFileAtomically(flags.Str("out", ""), header + StrategyToText(result.best.strategy)));
  std::printf("strategy: %s\n", flags.Str("out", "").c_str());
  return Status::Ok();
}

}  // namespace loom::tools
