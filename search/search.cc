#include "search/search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "search/baselines.h"
#include "search/elimination.h"
#include "search/layerwise.h"

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Whether `a` is a better strategy than `b`: one that fits beats one that
// does not, then the faster.
bool Better(const StrategyCost& a, const StrategyCost& b) {
  if (a.fits != b.fits) return a.fits;
  return a.seconds < b.seconds;
}

// The layer-wise optimum with memory priced in (OptCNN's model has none):
// node costs t_layer + price * bytes, the price raised fourfold from one
// at which the unpriced optimum's bytes cost a tenth of its time until the
// optimum fits (simulated), then bisected (three steps) towards the lowest
// price that fits; the fastest fitting solution simulated.
struct PricedSolution {
  Choice choice;
  StrategyCost cost;  // cost.fits false: none fitted
  double price = 0;   // seconds per byte
  int solutions = 0;  // solved and simulated
};

StatusOr<PricedSolution> SolveWithMemoryPriced(const LayerwiseCosts& layerwise, const EliminationResult& unpriced,
                                               StrategyEvaluator& evaluator, double max_enumeration) {
  double bytes = 0;
  for (size_t l = 0; l < unpriced.choice.size(); ++l)
    bytes += layerwise.memory[l][static_cast<size_t>(unpriced.choice[l])];
  PricedSolution best;
  best.cost.fits = false;
  if (bytes <= 0) return best;
  CostGraph priced = layerwise.graph;
  auto solve = [&](double price) -> StatusOr<bool> {
    for (size_t l = 0; l < priced.node_costs.size(); ++l)
      for (size_t k = 0; k < priced.node_costs[l].size(); ++k)
        priced.node_costs[l][k] = layerwise.graph.node_costs[l][k] + price * layerwise.memory[l][k];
    LOOM_ASSIGN_OR_RETURN(const EliminationResult solved, SolveByElimination(priced, max_enumeration));
    const Choice choice = ChoiceOfSolution(layerwise, solved.choice);
    LOOM_ASSIGN_OR_RETURN(const StrategyCost cost, evaluator.Evaluate(choice, /*peak_memory=*/true));
    ++best.solutions;
    if (cost.fits && (!best.cost.fits || cost.seconds < best.cost.seconds)) best = {choice, cost, price, best.solutions};
    return cost.fits;
  };
  double low = 0, high = 0.1 * unpriced.cost / bytes;  // low: a price that does not fit
  for (int raise = 0;; ++raise, low = high, high *= 4) {
    LOOM_ASSIGN_OR_RETURN(const bool fits, solve(high));
    if (fits) break;
    if (raise == 8) return best;
  }
  for (int step = 0; step < 3; ++step) {
    const double mid = (low + high) / 2;
    LOOM_ASSIGN_OR_RETURN(const bool fits, solve(mid));
    (fits ? high : low) = mid;
  }
  return best;
}

// The Markov chain from `start` (which fits) over `space`.
StatusOr<SearchResult> RunChain(const SearchSpace& space, StrategyEvaluator& evaluator, const Candidate& start,
                                const std::vector<const Candidate*>& others, const SearchOptions& options) {
  if (options.proposals <= 0 && options.budget_seconds <= 0)
    return InvalidArgument("a search needs a time budget or a number of proposals");
  const Clock::time_point began = Clock::now();
  SearchResult result;
  result.best = start;
  result.best.name = "searched";
  std::vector<int> movable;  // layers with a choice to make
  for (size_t l = 0; l < space.layers().size(); ++l)
    if (space.layers()[l].configs.size() > 1) movable.push_back(static_cast<int>(l));
  const int64_t restart_after =
      options.restart_after > 0 ? options.restart_after : 10 * static_cast<int64_t>(space.layers().size());
  std::mt19937_64 rng(options.seed);
  auto uniform = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  std::uniform_real_distribution<double> unit(0.0, 1.0);

  Choice current = start.choice;
  StrategyCost current_cost = start.cost;
  // Proposals since this run (from the start or a restart) last improved
  // on its own best: a run from another start goes on while it descends.
  int64_t since_best = 0, restarts = 0;
  double run_best = start.cost.seconds;
  double next_report = options.progress_every_seconds;
  auto report = [&] {
    if (options.progress)
      options.progress({result.proposals, SecondsSince(began), result.best.cost.seconds, current_cost.seconds});
  };
  while (!movable.empty()) {
    if (options.proposals > 0 && result.proposals >= options.proposals) break;
    const double elapsed = SecondsSince(began);
    if (options.proposals == 0 && options.budget_seconds > 0 && elapsed >= options.budget_seconds) break;
    if (elapsed >= next_report) {
      report();
      next_report = elapsed + options.progress_every_seconds;
    }
    const int layer = movable[uniform(movable.size())];
    const size_t configs = space.layers()[static_cast<size_t>(layer)].configs.size();
    // Another configuration than the current one, uniformly.
    int config = static_cast<int>(uniform(configs - 1));
    if (config >= current[static_cast<size_t>(layer)]) ++config;
    Choice next = current;
    next[static_cast<size_t>(layer)] = config;
    LOOM_ASSIGN_OR_RETURN(const StrategyCost cost, evaluator.Evaluate(next));
    ++result.proposals;
    ++since_best;
    if (!cost.fits) {
      ++result.rejected_memory;
    } else {
      const double change = (cost.seconds - current_cost.seconds) / std::max(current_cost.seconds, 1e-30);
      if (change <= 0 || unit(rng) < std::exp(-options.beta * change)) {
        current = std::move(next);
        current_cost = cost;
        ++result.accepted;
        if (current_cost.seconds < run_best) {
          run_best = current_cost.seconds;
          since_best = 0;
        }
        if (Better(current_cost, result.best.cost)) {
          result.best.choice = current;
          result.best.cost = current_cost;
          ++result.improvements;
        }
      }
    }
    if (since_best >= restart_after) {
      const Candidate* from = restarts % 2 == 1 && !others.empty()
                                  ? others[static_cast<size_t>(restarts / 2) % others.size()]
                                  : nullptr;
      current = from ? from->choice : result.best.choice;
      current_cost = from ? from->cost : result.best.cost;
      run_best = current_cost.seconds;
      ++restarts;
      since_best = 0;
    }
  }
  report();
  result.best.strategy = space.ToStrategy(result.best.choice);
  result.seconds = SecondsSince(began);
  return result;
}

}  // namespace

StatusOr<SearchResult> SearchStrategy(const Graph& forward, const Graph& step, const Machine& machine,
                                      const CostModel& cost, int64_t devices,
                                      const std::vector<std::pair<std::string, Strategy>>& given,
                                      const SearchOptions& options) {
  const Clock::time_point began = Clock::now();
  if (devices < 1 || devices > machine.devices())
    return InvalidArgument("the search's ", devices, " devices: machine ", machine.name(), " has ",
                           machine.devices());
  LOOM_ASSIGN_OR_RETURN(SearchSpace space, SearchSpace::Build(forward, devices));

  // The starting points: the standard strategies that apply, the given ones.
  std::vector<std::pair<std::string, Strategy>> starts;
  for (const char* kind : {"dp", "replica", "owt", "model"}) {
    StatusOr<StandardStrategy> k = ParseStandardStrategy(kind);
    StatusOr<proto::Strategy> made = MakeStandardStrategy(forward, *k, devices);
    if (!made.ok()) continue;  // replica parallelism of an unfused model
    LOOM_ASSIGN_OR_RETURN(Strategy s, Strategy::FromProto(*made, kind));
    starts.emplace_back(kind, std::move(s));
  }
  for (const auto& g : given) starts.push_back(g);
  std::vector<Choice> choices;
  for (const auto& [name, strategy] : starts) {
    StatusOr<Choice> choice = space.ChoiceOf(strategy);
    if (!choice.ok()) return Status(choice.status().code(), StrCat("strategy ", name, ": ", choice.status().message()));
    choices.push_back(std::move(*choice));
  }
  // Configurations the starting points added are in the space before any
  // evaluator or cost graph reads it.
  StrategyEvaluator evaluator(step, space, machine, cost);
  SearchResult result;
  result.layers = static_cast<int64_t>(space.layers().size());
  result.log10_strategies = space.Log10Size();
  for (size_t i = 0; i < starts.size(); ++i) {
    LOOM_ASSIGN_OR_RETURN(const StrategyCost c, evaluator.Evaluate(choices[i], /*peak_memory=*/true));
    result.initial.push_back({starts[i].first, choices[i], space.ToStrategy(choices[i]), c});
  }
  if (options.exact) {
    LOOM_ASSIGN_OR_RETURN(const LayerwiseCosts layerwise, BuildLayerwiseCosts(space, step, machine, cost));
    StatusOr<EliminationResult> solved = SolveByElimination(layerwise.graph, options.exact_max_enumeration);
    if (solved.ok()) {
      Choice choice = ChoiceOfSolution(layerwise, solved->choice);
      LOOM_ASSIGN_OR_RETURN(StrategyCost c, evaluator.Evaluate(choice, /*peak_memory=*/true));
      result.exact = StrCat("solved: ", solved->nodes_eliminated, " layers eliminated, ", solved->enumerated,
                            " enumerated (costs from ", layerwise.lowerings, " lowerings); layer-wise cost ",
                            solved->cost * 1e3, " ms, simulated ", c.seconds * 1e3, " ms");
      if (!c.fits) {
        LOOM_ASSIGN_OR_RETURN(const PricedSolution priced,
                              SolveWithMemoryPriced(layerwise, *solved, evaluator, options.exact_max_enumeration));
        result.exact += StrCat("; it does not fit (", c.peak_memory_bytes / (1 << 30), " GiB on the fullest device)");
        if (priced.cost.fits) {
          choice = priced.choice;
          c = priced.cost;
          result.exact += StrCat("; with memory priced at ", priced.price * 1e3 * (1 << 30), " ms/GiB (",
                                 priced.solutions, " solutions): simulated ", c.seconds * 1e3, " ms, ",
                                 c.peak_memory_bytes / (1 << 30), " GiB");
        } else {
          result.exact += StrCat("; none of ", priced.solutions, " solutions with memory priced fits");
        }
      }
      result.initial.push_back({"exact", choice, space.ToStrategy(choice), c});
    } else {
      result.exact = StrCat("not solved: ", solved.status().message());
    }
  }
  const Candidate* start = &result.initial[0];
  for (const Candidate& c : result.initial)
    if (Better(c.cost, start->cost)) start = &c;
  if (!start->cost.fits)
    return ResourceExhausted("no starting strategy fits in the memory of ", machine.name(),
                             "'s devices: the search needs one that does");
  // The budget is the whole search's: the chain gets what the starts left.
  SearchOptions chain_options = options;
  if (options.proposals == 0 && options.budget_seconds > 0)
    chain_options.budget_seconds = std::max(1e-9, options.budget_seconds - SecondsSince(began));
  std::vector<const Candidate*> others;  // the other starts that fit, fastest first
  for (const Candidate& c : result.initial)
    if (&c != start && c.cost.fits) others.push_back(&c);
  std::stable_sort(others.begin(), others.end(),
                   [](const Candidate* a, const Candidate* b) { return a->cost.seconds < b->cost.seconds; });
  LOOM_ASSIGN_OR_RETURN(SearchResult chain, RunChain(space, evaluator, *start, others, chain_options));
  result.best = std::move(chain.best);
  result.proposals = chain.proposals;
  result.accepted = chain.accepted;
  result.rejected_memory = chain.rejected_memory;
  result.improvements = chain.improvements;
  if (!Better(result.best.cost, start->cost)) {  // nothing better found: the starting point itself
    result.best = *start;
    result.best.name = "searched";
  }
  // The found strategy replaces the best of the simple ones (the standard
  // strategies, the user's) only when predicted min_gain faster: between
  // near-equal strategies the simulator's error decides (ResNet-18 on this
  // machine: predicted 0.2% faster than data parallelism, measured 23%
  // slower).
  const Candidate* simple = nullptr;
  for (const Candidate& c : result.initial)
    if (c.name != "exact" && c.cost.fits && (!simple || Better(c.cost, simple->cost))) simple = &c;
  if (simple && result.best.cost.seconds > simple->cost.seconds * (1 - options.min_gain)) {
    result.kept = StrCat(simple->name, ": the found strategy is predicted ",
                         100 * (1 - result.best.cost.seconds / simple->cost.seconds), "% faster, under the ",
                         100 * options.min_gain, "% it must gain");
    result.best = *simple;
    result.best.name = "searched";
  }
  // The starting points' peak memory came with their evaluation; the
  // chain's result (when it is none of them) is lowered once more for it.
  bool known = false;
  for (const Candidate& c : result.initial)
    if (c.choice == result.best.choice) {
      result.best.cost = c.cost;
      known = true;
      break;
    }
  if (!known) {
    LOOM_ASSIGN_OR_RETURN(result.best.cost, evaluator.Report(result.best.choice));
  }
  result.seconds = SecondsSince(began);
  return result;
}

}  // namespace loom
