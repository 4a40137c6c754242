#include "simulator/cost_model.h"

#include <algorithm>
#include <cmath>

namespace loom {

double RooflineSeconds(const Machine& machine, const TaskWork& work) {
  return std::max(work.flops / machine.PeakFlops(work.dtype), work.bytes / machine.device().memory_bandwidth());
}

double AnalyticalCostModel::ComputeSeconds(const TaskGraph&, const Task& task) const {
  return machine_.device().launch_overhead_s() + RooflineSeconds(machine_, WorkOf(task));
}

CalibratedCostModel::CalibratedCostModel(const Machine& machine, const std::vector<WorkSample>& samples)
    : machine_(machine) {
  const double launch = machine.device().launch_overhead_s();
  std::vector<double> all;
  for (const WorkSample& s : samples) {
    const double roof = RooflineSeconds(machine, s.work), spent = s.seconds - launch;
    if (!(roof > 0) || !(spent > 0)) continue;  // no work to scale, or all of it overhead
    curves_[s.op].push_back({std::log(roof), roof / spent});
    all.push_back(roof / spent);
  }
  for (auto& [op, curve] : curves_) {
    // One point per size: the mean efficiency of the samples there.
    std::sort(curve.begin(), curve.end());
    std::vector<std::pair<double, double>> merged;
    size_t count = 0;
    for (const auto& [x, e] : curve) {
      if (!merged.empty() && merged.back().first == x) {
        merged.back().second += (e - merged.back().second) / static_cast<double>(++count);
      } else {
        merged.push_back({x, e});
        count = 1;
      }
    }
    curve = std::move(merged);
  }
  if (!all.empty()) {
    std::nth_element(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(all.size() / 2), all.end());
    typical_ = all[all.size() / 2];
  }
}

double CalibratedCostModel::Efficiency(const std::string& op, double roof_seconds) const {
  auto it = curves_.find(op);
  if (it == curves_.end() || !(roof_seconds > 0)) return typical_;
  const std::vector<std::pair<double, double>>& curve = it->second;
  const double x = std::log(roof_seconds);
  if (x <= curve.front().first) return curve.front().second;
  if (x >= curve.back().first) return curve.back().second;
  auto hi = std::upper_bound(curve.begin(), curve.end(), std::make_pair(x, 0.0),
                             [](const auto& a, const auto& b) { return a.first < b.first; });
  auto lo = hi - 1;
  const double f = (x - lo->first) / (hi->first - lo->first);
  return lo->second + f * (hi->second - lo->second);
}

double CalibratedCostModel::ComputeSeconds(const TaskGraph& graph, const Task& task) const {
  const double roof = RooflineSeconds(machine_, WorkOf(task));
  const double launch = machine_.device().launch_overhead_s();
  return roof > 0 ? launch + roof / Efficiency(graph.graph.node(task.node).op, roof) : launch;
}

}  // namespace loom
