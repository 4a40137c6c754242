// The strategy search (docs/search.md): FlexFlow's Markov chain Monte Carlo
// over a SearchSpace, each proposal simulated (delta simulation), started
// from the best of the standard strategies, the user's and the exact
// layer-wise solver's (search/layerwise.h); it never returns a strategy
// predicted slower than the best of those, only strategies that fit in the
// devices' memory, and a strategy other than the standard ones (or the
// user's) only when it is predicted min_gain faster.
//
// A proposal gives one random layer a random other configuration of the
// space, and one in four also gives that split to a run of the layers
// after it (Propose); it is accepted with probability min(1, exp(-beta * (new - current)
// / current)) (the relative change: the same beta serves a 1 ms and a 1 s
// step). After `restart_after` proposals that do not improve on the best
// since the last restart the chain restarts: from the best, and every other
// time from the next of the other starting points that fit (by predicted
// step), so that a start no single change improves (OWT on AlexNet with
// collectives) does not hold the chain.
//
// `chains` chains run at once, each with its own evaluator (its own
// incremental lowering and delta simulation), in epochs; between epochs
// the best any of them found becomes the point each restarts from. With a
// proposal budget the epochs are counted in proposals, so the result
// depends on the seed and the number of chains only, not on the machine's
// cores or its load.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "graph/ir.h"
#include "graph/strategy.h"
#include "search/evaluator.h"
#include "search/space.h"
#include "simulator/cost_model.h"
#include "simulator/machine.h"

namespace loom {

struct SearchProgress {
  int64_t proposals = 0;
  double elapsed_seconds = 0;
  double best_seconds = 0, current_seconds = 0;  // predicted steps
};

struct SearchOptions {
  double budget_seconds = 30;  // wall time of the whole search, the starts included (0: no limit)
  int64_t proposals = 0;       // stop after this many (0: no limit); then the result depends on the seed only
  uint64_t seed = 1;
  // Markov chains, each with its own evaluator, on a thread per core at
  // most (chains beyond take turns); the starting points are evaluated on
  // their evaluators at once too. A proposal budget is shared between them.
  int64_t chains = 4;
  double beta = 1000;
  int64_t restart_after = 0;  // 0: ten times the layers
  bool exact = true;          // run the layer-wise solver for a starting point
  // The found strategy must be predicted this much faster (a fraction) than
  // the best standard or given strategy, else that one is the result.
  double min_gain = 0.05;
  double exact_max_enumeration = 1e6;  // what it may enumerate of a graph its rules do not reduce
  // Called about every progress_every_seconds and at the end.
  std::function<void(const SearchProgress&)> progress;
  double progress_every_seconds = 1;
};

// A strategy the search evaluated.
struct Candidate {
  std::string name;  // "dp", "owt", "exact", "searched", a file's name
  Choice choice;
  proto::Strategy strategy;  // the choice as a strategy file
  StrategyCost cost;
};

struct SearchResult {
  Candidate best;
  // The starting points, evaluated (those that apply to the model); they
  // and `best` come with their peak memory.
  std::vector<Candidate> initial;
  std::string exact;               // what the exact solver did, or why it did not
  std::string kept;                // why the result is a simple strategy ("" when it is the found one)
  int64_t layers = 0;              // of the space searched
  double log10_strategies = 0;     // its size (SearchSpace::Log10Size)
  int64_t proposals = 0, accepted = 0, rejected_memory = 0, improvements = 0;
  int64_t remembered = 0;  // proposals whose choice was evaluated before (StrategyEvaluator::Evaluate)
  double seconds = 0;  // of the whole search (the peak memories after it)
};

// One proposal in kProposalRunEvery gives the chosen layer's new split to a
// run of up to kProposalMaxRun movable layers from it on, in the space's
// order (to those that have it: the same degrees, rule and devices). A
// stack of like layers (an LSTM's, a ResNet stage's) then moves to another
// split at once: one layer at a time, the chain passes through strategies
// that move values between every changed layer and its neighbours, and
// rejects them.
constexpr size_t kProposalRunEvery = 4, kProposalMaxRun = 32;

// A proposal of the chain from `current`: one random layer of `movable`
// (layers of `space` with more than one configuration, in its order) given
// a random other configuration, and, one time in kProposalRunEvery, a run
// of the layers after it given the same split.
Choice Propose(const SearchSpace& space, const std::vector<int>& movable, const Choice& current,
               std::mt19937_64& rng);

// Searches the strategies of `forward`'s layers on `devices` of `machine`
// for `step` (its training step). `given`: strategies to start from besides
// the standard ones (a user's file), by name.
StatusOr<SearchResult> SearchStrategy(const Graph& forward, const Graph& step, const Machine& machine,
                                      const CostModel& cost, int64_t devices,
                                      const std::vector<std::pair<std::string, Strategy>>& given,
                                      const SearchOptions& options);

}  // namespace loom
