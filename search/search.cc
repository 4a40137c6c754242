#include "search/search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "core/hash.h"
#include "core/thread_pool.h"
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

// Runs fn(i) for i in [0, n) on the pool's threads, thread t those with
// i mod threads == t in order (fn(i, j): the j-th of its thread's); the
// first error (by index) is returned.
Status OnThreads(ThreadPool& pool, size_t n, const std::function<Status(size_t i, size_t j)>& fn) {
  const size_t threads = std::min(n, static_cast<size_t>(pool.num_threads()));
  std::vector<Status> statuses(n);
  pool.ParallelFor(static_cast<int64_t>(threads), 1, [&](int64_t begin, int64_t end) {
    for (size_t t = static_cast<size_t>(begin); t < static_cast<size_t>(end); ++t)
      for (size_t i = t, j = 0; i < n; i += threads, ++j) statuses[i] = fn(i, j);
  });
  for (const Status& s : statuses) LOOM_RETURN_IF_ERROR(s);
  return Status::Ok();
}

// One Markov chain of the search, kept between epochs.
struct Chain {
  size_t index = 0;
  StrategyEvaluator* evaluator = nullptr;
  std::mt19937_64 rng;
  Choice current;
  StrategyCost current_cost;
  Candidate best;  // the best it knows: its own, or another chain's from the last sync
  // Proposals since this run (from the start or a restart) last improved
  // on its own best: a run from another start goes on while it descends.
  int64_t since_best = 0, restarts = 0;
  double run_best = 0;
  int64_t quota = 0;  // proposals it may make (a proposal budget)
  // (proposals: read by the progress line from another thread mid-epoch)
  std::atomic<int64_t> proposals{0};
  int64_t accepted = 0, rejected_memory = 0, improvements = 0;
};

// The chains' fixed part: the layers to move, when to restart, from where.
struct ChainPlan {
  const SearchSpace& space;
  std::vector<int> movable;  // layers with a choice to make
  int64_t restart_after = 0;
  std::vector<const Candidate*> others;  // the other starts that fit, fastest first
  double beta = 0;
};

// Proposals of one chain until it has made `until` in all or the deadline
// passes; `after_each` (if any) runs after each.
Status Advance(const ChainPlan& plan, Chain& c, int64_t until, Clock::time_point deadline,
               const std::function<void()>& after_each = nullptr) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  while (c.proposals < until && Clock::now() < deadline) {
    Choice next = Propose(plan.space, plan.movable, c.current, c.rng);
    LOOM_ASSIGN_OR_RETURN(const StrategyCost cost, c.evaluator->Evaluate(next));
    ++c.proposals;
    ++c.since_best;
    if (!cost.fits) {
      ++c.rejected_memory;
    } else {
      const double change = (cost.seconds - c.current_cost.seconds) / std::max(c.current_cost.seconds, 1e-30);
      if (change <= 0 || unit(c.rng) < std::exp(-plan.beta * change)) {
        c.current = std::move(next);
        c.current_cost = cost;
        ++c.accepted;
        if (c.current_cost.seconds < c.run_best) {
          c.run_best = c.current_cost.seconds;
          c.since_best = 0;
        }
        if (Better(c.current_cost, c.best.cost)) {
          c.best.choice = c.current;
          c.best.cost = c.current_cost;
          ++c.improvements;
        }
      }
    }
    if (c.since_best >= plan.restart_after) {
      // Every other restart from another start, each chain along the list
      // from its own place in it.
      const Candidate* from =
          c.restarts % 2 == 1 && !plan.others.empty()
              ? plan.others[(static_cast<size_t>(c.restarts / 2) + c.index) % plan.others.size()]
              : &c.best;
      c.current = from->choice;
      c.current_cost = from->cost;
      c.run_best = c.current_cost.seconds;
      ++c.restarts;
      c.since_best = 0;
    }
    if (after_each) after_each();
  }
  return Status::Ok();
}

// The chain's seed: options.seed for the first, distinct streams for the others.
uint64_t ChainSeed(uint64_t seed, size_t chain) {
  if (chain == 0) return seed;
  Hash64 h;
  h.Add(seed);
  h.Add(chain);
  return h.value();
}

// The Markov chains from `start` (which fits) over `space`, one on each
// evaluator, run in epochs: a proposal budget's epochs are kEpochProposals
// proposals of each chain (the result depends on the seed and the number
// of chains only), a time budget's last progress_every_seconds. Between
// epochs the best any chain found becomes every chain's best, the point
// its next restart from the best takes.
StatusOr<SearchResult> RunChains(ThreadPool& pool, const SearchSpace& space,
                                 const std::vector<std::unique_ptr<StrategyEvaluator>>& evaluators,
                                 const Candidate& start, const std::vector<const Candidate*>& others,
                                 const SearchOptions& options) {
  if (options.proposals <= 0 && options.budget_seconds <= 0)
    return InvalidArgument("a search needs a time budget or a number of proposals");
  constexpr int64_t kEpochProposals = 256;
  const Clock::time_point began = Clock::now();
  ChainPlan plan{space, {}, 0, others, options.beta};
  for (size_t l = 0; l < space.layers().size(); ++l)
    if (space.layers()[l].configs.size() > 1) plan.movable.push_back(static_cast<int>(l));
  plan.restart_after =
      options.restart_after > 0 ? options.restart_after : 10 * static_cast<int64_t>(space.layers().size());

  const bool by_proposals = options.proposals > 0;
  const size_t n = evaluators.size(), threads = std::min(n, static_cast<size_t>(pool.num_threads()));
  std::vector<Chain> chains(n);
  for (size_t k = 0; k < n; ++k) {
    Chain& c = chains[k];
    c.index = k;
    c.evaluator = evaluators[k].get();
    c.rng.seed(ChainSeed(options.seed, k));
    c.current = start.choice;
    c.current_cost = start.cost;
    c.best = start;
    c.run_best = start.cost.seconds;
    c.quota = by_proposals ? options.proposals / static_cast<int64_t>(n) +
                                 (static_cast<int64_t>(k) < options.proposals % static_cast<int64_t>(n) ? 1 : 0)
                           : std::numeric_limits<int64_t>::max();
  }
  SearchResult result;
  result.best = start;
  // A progress line: between epochs, and within a proposal budget's
  // (which can be long) from the first chain's thread every
  // progress_every_seconds, the other chains' counts read as they stand.
  double next_report = options.progress_every_seconds;
  auto report = [&] {
    if (!options.progress) return;
    SearchProgress p;
    for (const Chain& c : chains) p.proposals += c.proposals;
    p.elapsed_seconds = SecondsSince(began);
    p.best_seconds = std::min(result.best.cost.seconds, chains[0].best.cost.seconds);
    p.current_seconds = chains[0].current_cost.seconds;
    options.progress(p);
    next_report = p.elapsed_seconds + options.progress_every_seconds;
  };
  const std::function<void()> report_when_due = [&] {
    if (options.progress && SecondsSince(began) >= next_report) report();
  };
  const Clock::time_point budget_end =
      began + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.budget_seconds));
  int64_t epochs = 0;
  while (!plan.movable.empty()) {
    bool more = false;
    for (const Chain& c : chains) more = more || c.proposals < c.quota;
    if (!more || (!by_proposals && Clock::now() >= budget_end)) break;
    // A time budget's epoch: each thread's chains take turns, an equal
    // slice of it each.
    const Clock::time_point epoch_begin = Clock::now();
    const Clock::time_point epoch_end =
        std::min(budget_end, epoch_begin + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                               std::max(options.progress_every_seconds, 1e-3))));
    LOOM_RETURN_IF_ERROR(OnThreads(pool, n, [&](size_t k, size_t turn) {
      Chain& c = chains[k];
      if (by_proposals)
        return Advance(plan, c, std::min(c.quota, c.proposals + kEpochProposals), Clock::time_point::max(),
                       k == 0 ? report_when_due : nullptr);
      const int64_t turns = static_cast<int64_t>((n - k % threads + threads - 1) / threads);  // its thread's chains
      return Advance(plan, c, c.quota,
                     epoch_begin + (epoch_end - epoch_begin) * static_cast<int64_t>(turn + 1) / turns);
    }));
    for (const Chain& c : chains)
      if (Better(c.best.cost, result.best.cost)) result.best = c.best;
    for (Chain& c : chains)
      if (Better(result.best.cost, c.best.cost)) c.best = result.best;
    report();
    ++epochs;
  }
  if (epochs == 0) report();
  for (const Chain& c : chains) {
    result.proposals += c.proposals;
    result.accepted += c.accepted;
    result.rejected_memory += c.rejected_memory;
    result.improvements += c.improvements;
  }
  for (const auto& e : evaluators) result.remembered += e->remembered();
  result.best.name = "searched";
  result.best.strategy = space.ToStrategy(result.best.choice);
  result.seconds = SecondsSince(began);
  return result;
}

}  // namespace

Choice Propose(const SearchSpace& space, const std::vector<int>& movable, const Choice& current,
               std::mt19937_64& rng) {
  auto uniform = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const std::vector<SearchSpace::Layer>& layers = space.layers();
  const size_t at = uniform(movable.size());
  const size_t layer = static_cast<size_t>(movable[at]);
  // Another configuration than the current one, uniformly.
  int config = static_cast<int>(uniform(layers[layer].configs.size() - 1));
  if (config >= current[layer]) ++config;
  Choice next = current;
  next[layer] = config;
  if (uniform(kProposalRunEvery) == 0) {  // a run: its split for the next movable layers that have it
    const LayerSplit& split = layers[layer].configs[static_cast<size_t>(config)];
    const size_t end = std::min(movable.size(), at + 2 + uniform(kProposalMaxRun - 1));
    for (size_t k = at + 1; k < end; ++k) {
      const size_t other = static_cast<size_t>(movable[k]);
      const std::vector<LayerSplit>& configs = layers[other].configs;
      for (size_t i = 0; i < configs.size(); ++i)
        if (configs[i].SameForm(split) && configs[i].devices == split.devices) next[other] = static_cast<int>(i);
    }
  }
  return next;
}

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
  // Data parallelism on the first half, quarter, ... of the devices
  // ("dp-8": on devices 0-7): where the gradients' all-reduce costs more
  // than the compute it divides (many parameters, slow links), fewer
  // devices are faster (Inception-v3 on 64 K80s: 8 devices 1.41x), and a
  // chain that moves one layer at a time seldom gets there. Those that do
  // not apply (a batch that does not divide) are left out.
  for (int64_t k = devices / 2; k >= 1; k /= 2) {
    StatusOr<proto::Strategy> made = MakeStandardStrategy(forward, StandardStrategy::kDataParallel, k);
    if (!made.ok()) continue;
    made->set_devices(devices);
    const std::string name = StrCat("dp-", k);
    StatusOr<Strategy> strategy = Strategy::FromProto(*made, name);
    if (!strategy.ok()) continue;
    StatusOr<Choice> choice = space.ChoiceOf(*strategy);
    if (!choice.ok()) continue;
    starts.emplace_back(name, std::move(*strategy));
    choices.push_back(std::move(*choice));
  }
  // Configurations the starting points added are in the space before any
  // evaluator or cost graph reads it. An evaluator per chain; the starts
  // are evaluated on them at once, start i on evaluator i mod chains.
  const size_t chains = static_cast<size_t>(std::max<int64_t>(1, options.chains));
  std::vector<std::unique_ptr<StrategyEvaluator>> evaluators;
  for (size_t k = 0; k < chains; ++k)
    evaluators.push_back(std::make_unique<StrategyEvaluator>(step, space, machine, cost));
  StrategyEvaluator& evaluator = *evaluators[0];
  // A thread per core at most: chains beyond take turns (two chains on one
  // core ran slower than one, their lowerings evicting each other's data).
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  LOOM_ASSIGN_OR_RETURN(const std::unique_ptr<ThreadPool> pool,
                        ThreadPool::Create(std::min(static_cast<int>(chains), cores)));
  SearchResult result;
  result.layers = static_cast<int64_t>(space.layers().size());
  result.log10_strategies = space.Log10Size();
  std::vector<StrategyCost> start_costs(starts.size());
  LOOM_RETURN_IF_ERROR(OnThreads(*pool, std::min(chains, starts.size()), [&](size_t k, size_t) -> Status {
    for (size_t i = k; i < starts.size(); i += chains) {
      LOOM_ASSIGN_OR_RETURN(start_costs[i], evaluators[k]->Evaluate(choices[i], /*peak_memory=*/true));
    }
    return Status::Ok();
  }));
  for (size_t i = 0; i < starts.size(); ++i)
    result.initial.push_back({starts[i].first, choices[i], space.ToStrategy(choices[i]), start_costs[i]});
  if (options.exact) {
    LOOM_ASSIGN_OR_RETURN(const LayerwiseCosts layerwise, BuildLayerwiseCosts(space, step, machine, cost));
    StatusOr<EliminationResult> solved = SolveByElimination(layerwise.graph, options.exact_max_enumeration);
    if (solved.ok()) {
      Choice choice = ChoiceOfSolution(layerwise, solved->choice);
      LOOM_ASSIGN_OR_RETURN(StrategyCost c, evaluator.Evaluate(choice, /*peak_memory=*/true));
      result.exact = StrCat("solved: ", solved->nodes_eliminated, " layers eliminated, ", solved->enumerated,
                            " enumerated (costs from ", layerwise.lowerings, " lowerings); layer-wise cost ",
                            solved->cost * 1e3, " ms, simulated ", c.seconds * 1e3, " ms");
      // The same two of the first start, to tell the model's error from
      // the optimum's: "dp: layer-wise 290.1 ms, simulated 269.8 ms".
      if (const std::optional<double> first = LayerwiseCostOf(layerwise, choices[0]))
        result.exact += StrCat(" (", starts[0].first, ": layer-wise ", *first * 1e3, " ms, simulated ",
                               start_costs[0].seconds * 1e3, " ms)");
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
  LOOM_ASSIGN_OR_RETURN(SearchResult chain, RunChains(*pool, space, evaluators, *start, others, chain_options));
  result.best = std::move(chain.best);
  result.proposals = chain.proposals;
  result.accepted = chain.accepted;
  result.rejected_memory = chain.rejected_memory;
  result.improvements = chain.improvements;
  result.remembered = chain.remembered;
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
