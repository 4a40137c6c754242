#include "train/replica_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>

#include "graph/compile.h"
#include "graph/model.h"
#include "train/run_parts.h"

namespace loom::train {

namespace {
constexpr double kMiB = 1048576.0;
}  // namespace

uint64_t PhysicalMemory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

StatusOr<uint64_t> ParseMemorySize(const std::string& text, const std::string& what) {
  const auto bad = [&](const std::string& why) {
    return InvalidArgument(what, " '", text, "': ", why,
                           " (examples: 16GiB, 80GB, 512MiB, 1.5TiB, 1000000 for bytes; "
                           "units B, KB, MB, GB, TB (powers of 1000), KiB, MiB, GiB, TiB (powers of 1024))");
  };
  size_t pos = 0;
  double number = 0;
  try {
    number = std::stod(text, &pos);
  } catch (...) {
    return bad("not a size");
  }
  std::string unit;
  for (size_t i = pos; i < text.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(text[i]))) unit += static_cast<char>(std::tolower(text[i]));
  static const std::map<std::string, double> kUnits = {
      {"", 1},         {"b", 1},          {"kb", 1e3},          {"mb", 1e6},          {"gb", 1e9},
      {"tb", 1e12},    {"k", 1024.0},     {"m", kMiB},          {"g", kMiB * 1024},   {"t", kMiB * kMiB},
      {"kib", 1024.0}, {"mib", kMiB},     {"gib", kMiB * 1024}, {"tib", kMiB * kMiB},
  };
  auto it = kUnits.find(unit);
  if (it == kUnits.end()) return bad("unknown unit '" + unit + "'");
  const double bytes = number * it->second;
  if (!std::isfinite(bytes) || bytes <= 0) return bad("must be more than 0 bytes");
  if (bytes >= 1.8e19) return bad("too large");
  return static_cast<uint64_t>(std::floor(bytes));
}

StatusOr<ReplicaPlan> PlanReplicas(const proto::TrainConfig& config, uint64_t memory_bytes, const Device& accounting,
                                   int64_t max_replicas, bool with_eval) {
  if (max_replicas < 1) return InvalidArgument("the most replicas to plan for must be >= 1, got ", max_replicas);
  // The model as loom train builds it: for the spec of the config's
  // training data (loaded, not fed).
  LOOM_ASSIGN_OR_RETURN(const Datasets data, LoadDatasets(config.data()));
  const models::DataSpec spec = DataSpecOf(*data.train);
  Model m;
  LOOM_RETURN_IF_ERROR(BuildConfigModel(m, config, spec, config.data().batch_size()));
  const StepOptimizer opt = StepOptimizer{config.optimizer()};
  Model eval_model;
  eval_model.set_training(false);
  if (with_eval) LOOM_RETURN_IF_ERROR(BuildConfigModel(eval_model, config, spec, config.data().eval_batch_size()));

  ReplicaPlan plan;
  auto evaluate = [&](int64_t r) -> StatusOr<bool> {
    FusionOptions fo;
    fo.replicas = static_cast<int>(r);
    fo.unfused_layers.assign(config.fusion().unfused_layers().begin(), config.fusion().unfused_layers().end());
    for (int64_t i = 0; i < r; ++i) fo.seeds.push_back(static_cast<uint64_t>(i + 1));
    LOOM_ASSIGN_OR_RETURN(Graph fused, Compile(m.graph(), Program::kTrainingStep, StepOptions(opt, fo)));
    ReplicaPlanRow row;
    row.replicas = r;
    LOOM_ASSIGN_OR_RETURN(row.memory, EstimateStepMemory(fused, accounting));
    if (with_eval) {
      LOOM_ASSIGN_OR_RETURN(Graph fused_eval, Compile(eval_model.graph(), Program::kForward, StepOptions(opt, fo)));
      LOOM_ASSIGN_OR_RETURN(StepMemory e, EstimateStepMemory(fused_eval, accounting));
      row.eval_bytes = e.state_bytes + e.arena_bytes + e.input_bytes;
    }
    row.fits = row.total() <= memory_bytes;
    plan.rows[r] = row;
    return row.fits;
  };

  // Powers of two (and the limit), then a binary search between the last
  // that fits (lo) and the first that does not (hi).
  int64_t lo = 0, hi = 0;
  for (int64_t r = 1;; r *= 2) {
    const int64_t at = std::min(r, max_replicas);
    LOOM_ASSIGN_OR_RETURN(bool fits, evaluate(at));
    if (!fits) {
      hi = at;
      break;
    }
    lo = at;
    if (at == max_replicas) break;
  }
  while (hi > 0 && hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    LOOM_ASSIGN_OR_RETURN(bool fits, evaluate(mid));
    (fits ? lo : hi) = mid;
  }
  plan.largest_fitting = lo;
  plan.limited_by_max_replicas = hi == 0;
  return plan;
}

}  // namespace loom::train
