#include "search/layerwise.h"

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <string>

#include "core/dtype.h"
#include "graph/task_graph.h"
#include "simulator/simulator.h"

namespace loom {
namespace {

// A split's form (LayerSplit::SameForm): its degrees and parameter rule.
using Form = std::pair<std::array<int64_t, kSplitDims>, std::string>;
Form FormOf(const LayerSplit& s) { return {s.degree, s.parameter_split}; }

int64_t OverlapElements(const Region& a, const Region& b) {
  int64_t n = 1;
  for (size_t d = 0; d < a.lo.size(); ++d) {
    const int64_t len = std::min(a.hi[d], b.hi[d]) - std::max(a.lo[d], b.lo[d]);
    if (len <= 0) return 0;
    n *= len;
  }
  return n;
}

// A region of a value and the devices that hold a copy of it.
struct Held {
  Region region;
  std::vector<int64_t> devices;
};

// The value's regions that parts hold (or read), copies merged, the parts on
// `devices`; read regions are clipped to the value (a window's padding is
// not data).
std::vector<Held> Holdings(const std::vector<PartRegions>& parts, const std::vector<int64_t>& devices, bool input,
                           int slot, const Shape& shape) {
  std::vector<Held> held;
  const Region whole = Region::Whole(shape);
  for (size_t p = 0; p < parts.size(); ++p) {
    const Region& r = input ? parts[p].inputs[static_cast<size_t>(slot)] : parts[p].outputs[static_cast<size_t>(slot)];
    std::optional<Region> clipped = r.Intersect(whole);
    if (!clipped) continue;
    auto same = std::find_if(held.begin(), held.end(), [&](const Held& h) { return h.region == *clipped; });
    if (same == held.end()) held.push_back({std::move(*clipped), {devices[p]}});
    else same->devices.push_back(devices[p]);
  }
  return held;
}

// Bytes per (source, destination) pair, dense for speed, with the pairs
// touched listed so that a mostly empty matrix costs only what it holds;
// and per link resource.
struct Messages {
  explicit Messages(const Machine& machine)
      : devices(machine.devices()),
        bytes(static_cast<size_t>(devices * devices)),
        seconds(static_cast<size_t>(devices)),
        load(static_cast<size_t>(machine.resources())) {}
  int64_t devices;
  std::vector<double> bytes;    // [src * devices + dst]
  std::vector<double> seconds;  // per destination
  std::vector<int64_t> touched;
  std::vector<double> load;  // bytes per link resource
  std::vector<int64_t> loaded;
};

// Seconds until every reader holds its region: what its device lacks comes
// from the first holder of each region, one message per (source, reader);
// the busiest reader's messages one after another, or the busiest link
// resource's bytes where that is longer (the messages of readers that
// share a link, a node's PCIe switch or its network link, take turns on
// it: the P100 and K80 clusters' nodes).
double MoveSeconds(const std::vector<Held>& holders, const std::vector<Held>& readers, double element_bytes,
                   const Machine& machine, Messages* m) {
  for (const Held& r : readers)
    for (int64_t dst : r.devices)
      for (const Held& h : holders) {
        if (std::find(h.devices.begin(), h.devices.end(), dst) != h.devices.end()) continue;  // local
        const int64_t overlap = OverlapElements(r.region, h.region);
        if (overlap == 0) continue;
        const int64_t pair = h.devices[0] * m->devices + dst;
        if (m->bytes[static_cast<size_t>(pair)] == 0) m->touched.push_back(pair);
        m->bytes[static_cast<size_t>(pair)] += static_cast<double>(overlap) * element_bytes;
      }
  double slowest = 0;
  for (int64_t pair : m->touched) {
    const int64_t src = pair / m->devices, dst = pair % m->devices;
    double& s = m->seconds[static_cast<size_t>(dst)];
    const Machine::Route route = machine.RouteOf(src, dst);
    s += Machine::MessageSeconds(route, m->bytes[static_cast<size_t>(pair)]);
    slowest = std::max(slowest, s);
    for (int64_t r : route) {
      double& load = m->load[static_cast<size_t>(r)];
      if (load == 0) m->loaded.push_back(r);
      load += m->bytes[static_cast<size_t>(pair)];
    }
  }
  for (int64_t r : m->loaded) {
    const proto::LinkSpec& link = machine.LinkOf(r);
    slowest = std::max(slowest, link.latency_s() + m->load[static_cast<size_t>(r)] / link.bandwidth());
    m->load[static_cast<size_t>(r)] = 0;
  }
  m->loaded.clear();
  for (int64_t pair : m->touched) {
    m->bytes[static_cast<size_t>(pair)] = 0;
    m->seconds[static_cast<size_t>(pair % m->devices)] = 0;
  }
  m->touched.clear();
  return slowest;
}

// The layer a task of a lowering belongs to: the longest layer name L with
// the task's node (or, for an all-reduce, its value) named L or "L/...".
int LayerOf(std::string name, const std::map<std::string, int>& layers) {
  name = name.substr(0, name.find(' '));  // "fc1/grad/MatMul:0 all-reduce"
  if (size_t colon = name.rfind(':'); colon != std::string::npos) name.resize(colon);
  for (size_t end = name.size(); end > 0 && end != std::string::npos; end = name.rfind('/', end - 1)) {
    auto it = layers.find(name.substr(0, end));
    if (it != layers.end()) return it->second;
  }
  return -1;
}

// The layer of a task: its node's, or (a transfer or collective) its
// value's, by name.
int TaskLayer(const TaskGraph& tasks, const Task& t, const std::map<std::string, int>& layers) {
  return LayerOf(t.kind == TaskKind::kCompute ? tasks.graph.node(t.node).name : t.name, layers);
}

// Which of a layer's configurations the cost graph keeps (see
// LayerwiseOptions).
std::vector<int> KeptConfigs(const SearchSpace::Layer& layer, int64_t devices, int64_t max_configs) {
  std::vector<int> all(layer.configs.size());
  for (size_t c = 0; c < all.size(); ++c) all[c] = static_cast<int>(c);
  if (static_cast<int64_t>(all.size()) <= max_configs) return all;
  auto rank = [&](int c) {
    const LayerSplit& s = layer.configs[static_cast<size_t>(c)];
    return s.parts() == devices ? 0 : c == 0 ? 1 : 2;
  };
  std::stable_sort(all.begin(), all.end(), [&](int a, int b) { return rank(a) < rank(b); });
  all.resize(static_cast<size_t>(max_configs));
  std::sort(all.begin(), all.end());
  return all;
}

}  // namespace

StatusOr<LayerwiseCosts> BuildLayerwiseCosts(const SearchSpace& space, const Graph& step, const Machine& machine,
                                             const CostModel& cost, const LayerwiseOptions& options) {
  if (options.max_configs < 1) return InvalidArgument("max_configs must be >= 1, got ", options.max_configs);
  const std::vector<SearchSpace::Layer>& layers = space.layers();
  const int64_t devices = space.devices();
  LayerwiseCosts out;
  std::map<std::string, int> layer_index;
  std::map<Form, std::vector<int>> layers_with;  // form -> layers that keep a config of it
  for (size_t l = 0; l < layers.size(); ++l) {
    layer_index[layers[l].name] = static_cast<int>(l);
    out.configs.push_back(KeptConfigs(layers[l], devices, options.max_configs));
    out.graph.node_costs.emplace_back(out.configs.back().size(), 0.0);
    out.memory.emplace_back(out.configs.back().size(), 0.0);
    for (int c : out.configs.back()) {
      std::vector<int>& with = layers_with[FormOf(layers[l].configs[static_cast<size_t>(c)])];
      if (with.empty() || with.back() != static_cast<int>(l)) with.push_back(static_cast<int>(l));
    }
  }

  // t_layer: the step lowered once per form (degrees and parameter rule),
  // each layer that keeps a config of it split by its first such config,
  // the rest whole. (Fewer lowerings, each layer through its own forms in
  // turn, lower slower: neighbours split differently move data between
  // every pair.)
  SimulateOptions no_peak;
  no_peak.peak_memory = false;
  std::vector<std::vector<double>> layer_busy(layers.size(), std::vector<double>(static_cast<size_t>(devices)));
  std::vector<std::vector<double>> layer_bytes = layer_busy, layer_sync = layer_busy;
  const bool sync_overlaps = !machine.device().copies_on_device();
  for (const auto& [form, with] : layers_with) {
    std::map<std::string, LayerSplit> splits;
    std::vector<int> first(layers.size(), -1);  // the config each layer takes in this lowering
    for (size_t l = 0; l < layers.size(); ++l) splits[layers[l].name] = LayerSplit{};
    for (int l : with)
      for (int c : out.configs[static_cast<size_t>(l)])
        if (FormOf(layers[static_cast<size_t>(l)].configs[static_cast<size_t>(c)]) == form) {
          first[static_cast<size_t>(l)] = c;
          splits[layers[static_cast<size_t>(l)].name] = layers[static_cast<size_t>(l)].configs[static_cast<size_t>(c)];
          break;
        }
    LOOM_ASSIGN_OR_RETURN(const TaskGraph tasks, BuildTaskGraph(step, splits, devices, LoweringFor(machine)));
    LOOM_ASSIGN_OR_RETURN(const SimulationResult r, Simulate(tasks, machine, cost, no_peak));
    ++out.lowerings;
    for (std::vector<double>& b : layer_busy) std::fill(b.begin(), b.end(), 0.0);
    for (std::vector<double>& b : layer_bytes) std::fill(b.begin(), b.end(), 0.0);
    for (const Piece& p : tasks.pieces) {
      const int l = p.producer >= 0 ? TaskLayer(tasks, tasks.tasks[static_cast<size_t>(p.producer)], layer_index)
                                    : LayerOf(tasks.graph.value(p.value).name, layer_index);
      if (l >= 0) layer_bytes[static_cast<size_t>(l)][static_cast<size_t>(p.device)] += p.bytes;
    }
    // A layer's tasks' longest chain through their dependencies on each
    // other: a split whose parts wait for each other (an LSTM's sequence
    // chunks, each handed the last one's state) takes that long, though
    // each device is busy a fraction of it.
    std::vector<int> task_layer(tasks.tasks.size());
    std::vector<double> chain(tasks.tasks.size(), 0.0), layer_chain(layers.size(), 0.0);
    for (std::vector<double>& b : layer_sync) std::fill(b.begin(), b.end(), 0.0);
    std::set<ValueId> gradient_values;  // the parameters' gradients (as the lowering's expansions renamed them)
    for (const auto& [param, gradient] : tasks.graph.gradients()) gradient_values.insert(gradient);
    for (const Task& t : tasks.tasks) {
      const int l = task_layer[static_cast<size_t>(t.id)] = TaskLayer(tasks, t, layer_index);
      if (l < 0) continue;
      const double seconds = r.tasks[static_cast<size_t>(t.id)].end - r.tasks[static_cast<size_t>(t.id)].start;
      double before = 0;
      for (int d : t.deps)
        if (task_layer[static_cast<size_t>(d)] == l) before = std::max(before, chain[static_cast<size_t>(d)]);
      // Moving a parameter's gradient on links while the devices compute
      // (copy engines; groups of one device sum on it): the backward pass
      // of the layers before goes on meanwhile, as the simulator schedules
      // it. Its time is the layer's links' own, beside its compute, not
      // added to it (data parallelism's all-reduces were added, so the
      // solver ran from strategies that only saved all-reduces).
      if (sync_overlaps && (t.kind == TaskKind::kTransfer || t.group.size() > 1) &&
          gradient_values.count(tasks.pieces[static_cast<size_t>(t.sources[0])].value)) {
        chain[static_cast<size_t>(t.id)] = before;
        if (t.kind == TaskKind::kTransfer) layer_sync[static_cast<size_t>(l)][static_cast<size_t>(t.device)] += seconds;
        else
          for (int64_t d : t.group) layer_sync[static_cast<size_t>(l)][static_cast<size_t>(d)] += seconds;
        continue;
      }
      chain[static_cast<size_t>(t.id)] = before + seconds;
      layer_chain[static_cast<size_t>(l)] = std::max(layer_chain[static_cast<size_t>(l)], before + seconds);
      if (t.kind == TaskKind::kTransfer || t.kind == TaskKind::kAllGather || t.kind == TaskKind::kReduceScatter ||
          t.kind == TaskKind::kAllToAll)
        continue;  // moves between layers: t_move's (a chain's hand-offs count above)
      if (t.kind == TaskKind::kCompute) layer_busy[static_cast<size_t>(l)][static_cast<size_t>(t.device)] += seconds;
      else
        for (int64_t d : t.group) layer_busy[static_cast<size_t>(l)][static_cast<size_t>(d)] += seconds;
    }
    for (int l : with) {
      if (first[static_cast<size_t>(l)] < 0) continue;
      const std::vector<double>& b = layer_busy[static_cast<size_t>(l)];
      const std::vector<double>& m = layer_bytes[static_cast<size_t>(l)];
      const std::vector<double>& sync = layer_sync[static_cast<size_t>(l)];
      const double t_layer = std::max({*std::max_element(b.begin(), b.end()), *std::max_element(sync.begin(), sync.end()),
                                       layer_chain[static_cast<size_t>(l)]});
      const double bytes = *std::max_element(m.begin(), m.end());
      const std::vector<int>& kept = out.configs[static_cast<size_t>(l)];
      for (size_t k = 0; k < kept.size(); ++k)
        if (FormOf(layers[static_cast<size_t>(l)].configs[static_cast<size_t>(kept[k])]) == form) {
          out.graph.node_costs[static_cast<size_t>(l)][k] = t_layer;
          out.memory[static_cast<size_t>(l)][k] = bytes;
        }
    }
  }

  // t_move: the regions of each kept config's parts (per form: configs of
  // one form differ only in their devices).
  std::vector<std::map<Form, std::vector<PartRegions>>> parts(layers.size());
  auto parts_of = [&](int l, int c) -> StatusOr<const std::vector<PartRegions>*> {
    const LayerSplit& split = layers[static_cast<size_t>(l)].configs[static_cast<size_t>(c)];
    auto it = parts[static_cast<size_t>(l)].find(FormOf(split));
    if (it == parts[static_cast<size_t>(l)].end()) {
      const Node& node = space.forward().node(layers[static_cast<size_t>(l)].node);
      LOOM_ASSIGN_OR_RETURN(std::vector<PartRegions> p,
                            LayerParts(space.forward(), node, layers[static_cast<size_t>(l)].rules, split));
      it = parts[static_cast<size_t>(l)].emplace(FormOf(split), std::move(p)).first;
    }
    return &it->second;
  };
  Messages messages(machine);
  for (const SearchSpace::Edge& e : space.edges()) {
    const Graph& forward = space.forward();
    const Shape& shape = forward.type(e.value).shape;
    const double element_bytes = static_cast<double>(DTypeSize(forward.type(e.value).dtype));
    const std::vector<int>& from = out.configs[static_cast<size_t>(e.from)];
    const std::vector<int>& to = out.configs[static_cast<size_t>(e.to)];
    CostGraph::Edge edge;
    edge.from = e.from;
    edge.to = e.to;
    edge.costs.resize(from.size() * to.size());
    std::vector<std::vector<Held>> written(from.size()), read(to.size());
    for (size_t a = 0; a < from.size(); ++a) {
      LOOM_ASSIGN_OR_RETURN(const std::vector<PartRegions>* p, parts_of(e.from, from[a]));
      written[a] = Holdings(*p, layers[static_cast<size_t>(e.from)].configs[static_cast<size_t>(from[a])].devices,
                            false, e.output, shape);
    }
    for (size_t b = 0; b < to.size(); ++b) {
      LOOM_ASSIGN_OR_RETURN(const std::vector<PartRegions>* p, parts_of(e.to, to[b]));
      read[b] = Holdings(*p, layers[static_cast<size_t>(e.to)].configs[static_cast<size_t>(to[b])].devices, true,
                         e.input, shape);
    }
    for (size_t a = 0; a < from.size(); ++a)
      for (size_t b = 0; b < to.size(); ++b)
        edge.costs[a * to.size() + b] = MoveSeconds(written[a], read[b], element_bytes, machine, &messages) +
                                        MoveSeconds(read[b], written[a], element_bytes, machine, &messages);
    out.graph.edges.push_back(std::move(edge));
  }
  return out;
}

Choice ChoiceOfSolution(const LayerwiseCosts& costs, const std::vector<int>& solution) {
  Choice choice(solution.size());
  for (size_t l = 0; l < solution.size(); ++l)
    choice[l] = costs.configs[l][static_cast<size_t>(solution[l])];
  return choice;
}

std::optional<double> LayerwiseCostOf(const LayerwiseCosts& costs, const Choice& choice) {
  std::vector<int> solution(choice.size());
  for (size_t l = 0; l < choice.size(); ++l) {
    const std::vector<int>& kept = costs.configs[l];
    const auto it = std::find(kept.begin(), kept.end(), choice[l]);
    if (it == kept.end()) return std::nullopt;
    solution[l] = static_cast<int>(it - kept.begin());
  }
  StatusOr<double> cost = CostOf(costs.graph, solution);
  return cost.ok() ? std::optional<double>(*cost) : std::nullopt;
}

}  // namespace loom
