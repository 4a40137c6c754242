#include "search/space.h"

#include <algorithm>
#include <cmath>

namespace loom {
namespace {

std::vector<int64_t> Divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t k = 1; k <= n; ++k)
    if (n % k == 0) d.push_back(k);
  return d;
}

// Every degree vector whose degrees divide their dimension's extent (1
// where the layer cannot split) and whose product divides `devices`.
void Degrees(const std::array<int64_t, kSplitDims>& extent, int64_t devices, size_t dim,
             std::array<int64_t, kSplitDims>* degree, std::vector<std::array<int64_t, kSplitDims>>* out) {
  if (dim == kSplitDims) {
    out->push_back(*degree);
    return;
  }
  int64_t product = 1;
  for (size_t d = 0; d < dim; ++d) product *= (*degree)[d];
  for (int64_t k : Divisors(devices / product)) {
    if (k > 1 && (extent[dim] == 0 || extent[dim] % k != 0)) continue;
    (*degree)[dim] = k;
    Degrees(extent, devices, dim + 1, degree, out);
  }
  (*degree)[dim] = 1;
}

bool SameSplit(const LayerSplit& a, const LayerSplit& b) { return a.SameForm(b) && a.devices == b.devices; }

}  // namespace

StatusOr<SearchSpace> SearchSpace::Build(const Graph& forward, int64_t devices) {
  if (devices < 1) return InvalidArgument("a search space needs at least one device, got ", devices);
  SearchSpace space;
  space.forward_ = &forward;
  space.devices_ = devices;
  std::map<NodeId, int> layer_of;
  const std::vector<int> batch_axes = BatchAxes(forward);
  for (const Node& n : forward.nodes()) {
    if (IsSourceOp(n.op)) continue;
    if (n.name.find_first_of("*?") != std::string::npos)
      return InvalidArgument("layer '", n.name, "': a name with '*' or '?' cannot name it in a strategy file");
    LOOM_ASSIGN_OR_RETURN(SplitRules rules, NodeSplitRules(forward, n, batch_axes));
    // The degree vectors of the op's default parameter rule, then those
    // that split along each named variant.
    std::vector<LayerSplit> forms;
    std::vector<std::string> variants{""};
    for (const auto& [name, rule] : rules.parameter_variants) variants.push_back(name);
    for (const std::string& variant : variants) {
      std::array<int64_t, kSplitDims> extent{};
      for (SplitDim d : kAllSplitDims) {
        std::string what;
        extent[static_cast<size_t>(d)] = SplitExtent(forward, n, rules, d, &what, variant);
      }
      std::vector<std::array<int64_t, kSplitDims>> degrees;
      std::array<int64_t, kSplitDims> degree{1, 1, 1, 1};
      Degrees(extent, devices, 0, &degree, &degrees);
      for (const auto& deg : degrees) {
        if (!variant.empty() && deg[static_cast<size_t>(SplitDim::kParameter)] == 1) continue;  // the default's
        LayerSplit form;
        form.degree = deg;
        form.parameter_split = variant;
        forms.push_back(std::move(form));
      }
    }
    // Fewer parts first: configs[0] is whole on device 0.
    std::stable_sort(forms.begin(), forms.end(),
                     [](const LayerSplit& a, const LayerSplit& b) { return a.parts() < b.parts(); });
    Layer layer;
    layer.node = n.id;
    layer.name = n.name;
    for (LayerSplit& split : forms) {
      const int64_t parts = split.parts();
      split.devices.resize(static_cast<size_t>(parts));
      for (int64_t p = 0; p < parts; ++p) split.devices[static_cast<size_t>(p)] = p;
      // The rule of a dimension may not fit these shapes (a window that
      // would read past a part): checked once, on the first block.
      if (parts > 1 && !LayerParts(forward, n, rules, split).ok()) continue;
      for (int64_t first = 0; first < devices; first += parts) {
        split.PlaceGroupedByReplica(first);
        layer.configs.push_back(split);
      }
    }
    layer.rules = std::move(rules);
    layer_of[n.id] = static_cast<int>(space.layers_.size());
    space.layers_.push_back(std::move(layer));
  }
  for (const Layer& to : space.layers_) {
    const Node& n = forward.node(to.node);
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const Value& v = forward.value(n.inputs[i]);
      auto from = layer_of.find(v.producer);
      if (from == layer_of.end()) continue;  // a source: read where it is needed
      Edge e;
      e.from = from->second;
      e.to = layer_of.at(n.id);
      e.value = v.id;
      e.output = v.output_index;
      e.input = static_cast<int>(i);
      space.edges_.push_back(e);
    }
  }
  return space;
}

double SearchSpace::Log10Size() const {
  double s = 0;
  for (const Layer& l : layers_) s += std::log10(static_cast<double>(l.configs.size()));
  return s;
}

std::map<std::string, LayerSplit> SearchSpace::Splits(const Choice& choice) const {
  std::map<std::string, LayerSplit> out;
  for (size_t i = 0; i < layers_.size(); ++i)
    out.emplace_hint(out.end(), layers_[i].name, layers_[i].configs[static_cast<size_t>(choice[i])]);
  return out;
}

proto::Strategy SearchSpace::ToStrategy(const Choice& choice) const {
  proto::Strategy s;
  s.set_devices(devices_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerSplit& split = layers_[i].configs[static_cast<size_t>(choice[i])];
    if (split.parts() == 1 && split.devices[0] == 0) continue;
    proto::LayerSplit* e = s.add_layer();
    e->set_layer(layers_[i].name);
    const int64_t* degrees[] = {&split.degree[0], &split.degree[1], &split.degree[2], &split.degree[3]};
    if (*degrees[0] > 1) e->set_sample(*degrees[0]);
    if (*degrees[1] > 1) e->set_replica(*degrees[1]);
    if (*degrees[2] > 1) e->set_attribute(*degrees[2]);
    if (*degrees[3] > 1) e->set_parameter(*degrees[3]);
    e->set_parameter_split(split.parameter_split);
    for (int64_t d : split.devices) e->add_devices(d);
  }
  return s;
}

StatusOr<int> SearchSpace::IndexOf(Layer* layer, const LayerSplit& split) {
  for (size_t c = 0; c < layer->configs.size(); ++c)
    if (SameSplit(layer->configs[c], split)) return static_cast<int>(c);
  LOOM_RETURN_IF_ERROR(LayerParts(*forward_, forward_->node(layer->node), layer->rules, split).status());
  layer->configs.push_back(split);
  return static_cast<int>(layer->configs.size() - 1);
}

StatusOr<Choice> SearchSpace::ChoiceOf(const Strategy& strategy) {
  if (strategy.devices() != devices_)
    return InvalidArgument(strategy.origin(), ": the strategy places parts on ", strategy.devices(),
                           " devices, the search has ", devices_);
  LOOM_ASSIGN_OR_RETURN(const auto resolved, strategy.Resolve(*forward_));
  std::map<NodeId, const LayerSplit*> by_node;
  for (const auto& [id, split] : resolved) by_node[id] = &split;
  Choice choice(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    LOOM_ASSIGN_OR_RETURN(choice[i], IndexOf(&layers_[i], *by_node.at(layers_[i].node)));
  }
  return choice;
}

}  // namespace loom
