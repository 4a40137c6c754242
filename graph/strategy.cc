#include "graph/strategy.h"

#include <google/protobuf/text_format.h>

#include <numeric>
#include <set>

#include "ops/op.h"

namespace loom {
namespace {

// The split an entry writes, checked on its own (not against a graph).
StatusOr<LayerSplit> SplitOf(const proto::LayerSplit& e, int64_t devices, const std::string& where_degrees,
                             const std::string& where_devices, const std::string& field) {
  LayerSplit s;
  const int64_t given[kSplitDims] = {e.sample(), e.replica(), e.attribute(), e.parameter()};
  for (int d = 0; d < kSplitDims; ++d) {
    if (given[d] < 0)
      return InvalidArgument(where_degrees, ": field ", field, ".", SplitDimName(kAllSplitDims[d]),
                             ": must be >= 1 (0 or unset: 1), got ", given[d]);
    s.degree[d] = given[d] == 0 ? 1 : given[d];
  }
  s.parameter_split = e.parameter_split();
  if (!s.parameter_split.empty() && s.degree_of(SplitDim::kParameter) == 1)
    return InvalidArgument(where_degrees, ": field ", field, ".parameter_split: '", s.parameter_split,
                           "' names how to split along parameter, but parameter is 1");
  const int64_t parts = s.parts();
  if (e.devices().empty()) {
    if (parts > devices)
      return InvalidArgument(where_degrees, ": field ", field, ": ", parts, " parts need ", parts,
                             " devices, the strategy has ", devices);
    s.devices.resize(static_cast<size_t>(parts));
    for (int64_t p = 0; p < parts; ++p) s.devices[static_cast<size_t>(p)] = p;
    return s;
  }
  s.devices.assign(e.devices().begin(), e.devices().end());
  if (static_cast<int64_t>(e.devices_size()) != parts)
    return InvalidArgument(where_devices, ": field ", field, ".devices: ", e.devices_size(), " device(s) for ", parts,
                           " part(s) (", s.ToString(), "): one device per part");
  std::set<int64_t> seen;
  for (int64_t d : e.devices()) {
    if (d < 0 || d >= devices)
      return InvalidArgument(where_devices, ": field ", field, ".devices: device ", d, " is not one of the strategy's ",
                             devices, " (0 to ", devices - 1, ")");
    if (!seen.insert(d).second)
      return InvalidArgument(where_devices, ": field ", field, ".devices: device ", d,
                             " holds two parts of one layer (each part needs its own device)");
  }
  return s;
}

// What a degree along `rule` must divide: the extent of every axis it
// splits (a reshape that merges the batch into rows splits [B, T] and
// [B * T]); `what` names the first, or the one that narrows it. Windowed
// inputs follow their outputs' rows.
int64_t ExtentOf(const DimSplit& rule, const std::vector<TensorType>& inputs, const std::vector<TensorType>& outputs,
                 std::string* what) {
  int64_t extent = 0;
  *what = "no split axis";
  auto visit = [&](const std::vector<AxisSplit>& splits, const std::vector<TensorType>& types, const char* kind) {
    for (size_t i = 0; i < splits.size() && i < types.size(); ++i) {
      const AxisSplit& a = splits[i];
      if (a.axis < 0 || a.stride != 1 || a.span != 1 || a.padding != 0) continue;
      const int64_t e = types[i].shape[a.axis];
      const int64_t narrowed = extent == 0 ? e : std::gcd(extent, e);
      if (narrowed != extent) *what = StrCat(kind, " ", i, " axis ", a.axis, " of ", types[i].shape.ToString());
      extent = narrowed;
    }
  };
  visit(rule.outputs, outputs, "output");
  visit(rule.inputs, inputs, "input");
  return extent;
}

}  // namespace

int64_t ReplicasOf(const Value& v) {
  const ReplicaLayout& l = v.replica_layout;
  if (!l.replicated()) return 0;
  return v.type.shape[l.dim] / l.per_replica;
}

const char* SplitDimName(SplitDim d) {
  switch (d) {
    case SplitDim::kSample: return "sample";
    case SplitDim::kReplica: return "replica";
    case SplitDim::kAttribute: return "attribute";
    case SplitDim::kParameter: return "parameter";
  }
  return "?";
}

std::string LayerSplit::ToString() const {
  std::string dims;
  for (SplitDim d : kAllSplitDims)
    if (degree_of(d) > 1) {
      dims += StrCat(dims.empty() ? "" : " x ", SplitDimName(d), " ", degree_of(d));
      if (d == SplitDim::kParameter && !parameter_split.empty()) dims += StrCat(" (", parameter_split, ")");
    }
  std::string devs;
  for (int64_t d : devices) devs += StrCat(devs.empty() ? "" : ",", d);
  if (dims.empty()) return StrCat("whole on device ", devs);
  return StrCat(dims, " on devices ", devs);
}

void LayerSplit::PlaceGroupedByReplica(int64_t first) {
  const int64_t replicas = degree_of(SplitDim::kReplica), per_group = parts() / replicas;
  // A part's coordinates: its sample, its replica group, and its index
  // among the attribute x parameter parts inside them.
  const int64_t inner = per_group / degree_of(SplitDim::kSample);
  devices.resize(static_cast<size_t>(parts()));
  for (int64_t p = 0; p < parts(); ++p) {
    const int64_t in = p % inner, replica = p / inner % replicas, sample = p / (inner * replicas);
    devices[static_cast<size_t>(p)] = first + replica * per_group + sample * inner + in;
  }
}

bool GlobMatch(const std::string& pattern, const std::string& name) {
  // Iterative matching with backtracking to the last '*'.
  size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::optional<DimSplit> ReplicaSplit(const Graph& graph, const Node& n, const SplitRules& rules, std::string* why) {
  DimSplit want = SplitAlong(-1, n.inputs.size(), n.outputs.size());
  for (size_t i = 0; i < n.inputs.size() + n.outputs.size(); ++i) {
    const bool input = i < n.inputs.size();
    const ValueId v = input ? n.inputs[i] : n.outputs[i - n.inputs.size()];
    const ReplicaLayout& layout = graph.value(v).replica_layout;
    if (!layout.known()) {
      *why = StrCat("value '", graph.value(v).name, "' has no known replica layout");
      return std::nullopt;
    }
    (input ? want.inputs[i] : want.outputs[i - n.inputs.size()]).axis = layout.shared() ? -1 : layout.dim;
  }
  for (const DimSplit& d : rules.All())
    if (!d.partial_sums && !d.HasWindow() && !d.HasOwnedInputs() && d.SameAxes(want)) return d;
  *why = "no split rule of its op divides it along its replicas";
  return std::nullopt;
}

StatusOr<Strategy> Strategy::Load(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path, "strategy file"));
  return Parse(text, path);
}

StatusOr<Strategy> Strategy::Parse(const std::string& text, const std::string& origin) {
  Strategy s;
  LOOM_ASSIGN_OR_RETURN(s.locations_, ParseTextProto(text, origin, &s.proto_));
  s.origin_ = origin;
  LOOM_RETURN_IF_ERROR(s.Check());
  return s;
}

StatusOr<Strategy> Strategy::FromProto(const proto::Strategy& strategy, const std::string& origin) {
  Strategy s;
  s.proto_ = strategy;
  s.origin_ = origin;
  LOOM_RETURN_IF_ERROR(s.Check());
  return s;
}

Status Strategy::Check() {
  if (proto_.devices() < 1)
    return InvalidArgument(Where("devices"), ": field devices: must be >= 1, got ", proto_.devices());
  if (!proto_.default_split().layer().empty())
    return InvalidArgument(Where("default_split.layer"),
                           ": field default_split.layer: the default applies to every layer no entry names; "
                           "write a layer { } entry to name one");
  LOOM_ASSIGN_OR_RETURN(default_, SplitOf(proto_.default_split(), proto_.devices(), Where("default_split"),
                                          Where("default_split.devices"), "default_split"));
  entries_.clear();
  for (int i = 0; i < proto_.layer_size(); ++i) {
    const std::string field = StrCat("layer[", i, "]");
    if (proto_.layer(i).layer().empty())
      return InvalidArgument(Where(field), ": field ", field, ".layer: is required (a layer's name or a pattern)");
    LOOM_ASSIGN_OR_RETURN(LayerSplit e, SplitOf(proto_.layer(i), proto_.devices(), Where(field),
                                                Where(field + ".devices"), field));
    entries_.push_back(std::move(e));
  }
  return Status::Ok();
}

std::string Strategy::Where(const std::string& path) const {
  const std::string w = locations_.Where(path);
  return w.empty() ? origin_ : w;
}

namespace {

// Whether `rule` splits every input that holds a known batch along it, and
// no output along its replica axis. A rule the op realises by its expansion
// (a training BatchNorm's) says where the batch goes as well as any, but
// cannot stand for another as the sample rule (`expands_ok`: BatchAxes).
bool SplitsBatch(const DimSplit& rule, const Graph& graph, const Node& node, const std::vector<int>& batch_axes,
                 bool expands_ok = false) {
  if (rule.HasWindow() || (rule.expands && !expands_ok) || rule.alone || rule.HasOwnedInputs()) return false;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const size_t v = static_cast<size_t>(node.inputs[i]);
    const int batch = v < batch_axes.size() ? batch_axes[v] : -1;
    if (batch >= 0 && rule.inputs[i].axis != batch) return false;
  }
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    const ReplicaLayout& layout = graph.value(node.outputs[i]).replica_layout;
    if (layout.replicated() && rule.outputs[i].axis == layout.dim) return false;
  }
  return true;
}

bool HoldsBatch(const Node& node, const std::vector<int>& batch_axes) {
  for (ValueId v : node.inputs)
    if (static_cast<size_t>(v) < batch_axes.size() && batch_axes[static_cast<size_t>(v)] >= 0) return true;
  return false;
}

// Whether `node` reads parameters and state alone (inputs all kNoSamples).
bool ReadsOnlyParameters(const Node& node, const std::vector<int>& batch_axes) {
  for (ValueId v : node.inputs)
    if (static_cast<size_t>(v) >= batch_axes.size() || batch_axes[static_cast<size_t>(v)] != kNoSamples) return false;
  return !node.inputs.empty();
}

}  // namespace

SplitRules FollowBatch(SplitRules rules, const Graph& graph, const Node& node, const std::vector<int>& batch_axes) {
  if (ReadsOnlyParameters(node, batch_axes)) {
    const OpDef* def = OpRegistry::Global().FindOp(node.op);
    if (def && !def->IsRandom()) {
      if (rules.sample) rules.other.push_back(std::move(*rules.sample));
      rules.sample = SplitAlong(-1, node.inputs.size(), node.outputs.size());
      return rules;
    }
  }
  if (!HoldsBatch(node, batch_axes)) return rules;
  if (rules.sample && SplitsBatch(*rules.sample, graph, node, batch_axes)) return rules;
  for (size_t i = 0; i < rules.other.size(); ++i) {
    if (!SplitsBatch(rules.other[i], graph, node, batch_axes)) continue;
    if (rules.sample) {
      std::swap(*rules.sample, rules.other[i]);
    } else {
      rules.sample = std::move(rules.other[i]);
      rules.other.erase(rules.other.begin() + static_cast<std::ptrdiff_t>(i));
    }
    break;
  }
  return rules;
}

std::vector<int> BatchAxes(const Graph& graph) {
  std::vector<int> axes;
  auto set = [&](ValueId v, int axis) {
    if (static_cast<size_t>(v) >= axes.size()) axes.resize(static_cast<size_t>(v) + 1, -1);
    axes[static_cast<size_t>(v)] = axis;
  };
  for (const Node& n : graph.nodes()) {
    if (n.op == kInputOp) {
      for (ValueId v : n.outputs)
        if (graph.type(v).shape.rank() >= 1 && !graph.value(v).replica_layout.replicated()) set(v, 0);
      continue;
    }
    if (IsSourceOp(n.op) || ReadsOnlyParameters(n, axes)) {
      for (ValueId v : n.outputs) set(v, kNoSamples);
      continue;
    }
    if (!HoldsBatch(n, axes)) continue;
    StatusOr<SplitRules> rules = NodeSplitRules(graph, n, axes);
    if (!rules.ok() || !rules->sample || !SplitsBatch(*rules->sample, graph, n, axes, /*expands_ok=*/true)) continue;
    for (size_t i = 0; i < n.outputs.size(); ++i)
      if (rules->sample->outputs[i].axis >= 0) set(n.outputs[i], rules->sample->outputs[i].axis);
  }
  return axes;
}

StatusOr<SplitRules> NodeSplitRules(const Graph& graph, const Node& node, const std::vector<int>& batch_axes) {
  const OpDef* def = OpRegistry::Global().FindOp(node.op);
  if (!def) return InvalidArgument("layer '", node.name, "': unknown op ", node.op);
  std::vector<TensorType> in, out;
  for (ValueId v : node.inputs) in.push_back(graph.type(v));
  for (ValueId v : node.outputs) out.push_back(graph.type(v));
  return FollowBatch(def->Splits(node.attrs, in, out), graph, node, batch_axes);
}

std::optional<DimSplit> LabelledRule(const SplitRules& rules, SplitDim d, const std::string& parameter_split,
                                     std::string* why) {
  const std::optional<DimSplit> rule = d == SplitDim::kSample      ? rules.sample
                                       : d == SplitDim::kAttribute ? rules.attribute
                                       : d == SplitDim::kParameter ? rules.Parameter(parameter_split)
                                                                   : std::nullopt;
  if (!rule)
    *why = d == SplitDim::kParameter && !parameter_split.empty()
               ? StrCat("its op has no parameter split '", parameter_split, "' (its variants: ", rules.VariantNames(),
                        ")")
               : StrCat("its op cannot be split along ", SplitDimName(d));
  return rule;
}

int64_t SplitExtent(const Graph& graph, const Node& node, const SplitRules& rules, SplitDim d, std::string* what,
                    const std::string& parameter_split) {
  std::vector<TensorType> in, out;
  for (ValueId v : node.inputs) in.push_back(graph.type(v));
  for (ValueId v : node.outputs) out.push_back(graph.type(v));
  if (d == SplitDim::kReplica) {
    const int64_t replicas = node.outputs.empty() ? 0 : ReplicasOf(graph.value(node.outputs[0]));
    if (replicas == 0) {
      *what = "its output has no replica axis (not a fused array's layer)";
      return 0;
    }
    if (!ReplicaSplit(graph, node, rules, what)) {
      *what = "its replicas cannot be split: " + *what;
      return 0;
    }
    *what = "replicas";
    return replicas;
  }
  const std::optional<DimSplit> rule = LabelledRule(rules, d, parameter_split, what);
  if (!rule) return 0;
  const int64_t extent = ExtentOf(*rule, in, out, what);
  if (extent <= 0) *what = StrCat("its extent ", extent, " (", *what, ") cannot be split");
  return std::max<int64_t>(extent, 0);
}

StatusOr<std::vector<std::pair<NodeId, LayerSplit>>> Strategy::Resolve(const Graph& graph) const {
  std::vector<bool> used(entries_.size(), false);
  std::vector<std::pair<NodeId, LayerSplit>> out;
  const std::vector<int> batch_axes = BatchAxes(graph);
  for (const Node& n : graph.nodes()) {
    if (IsSourceOp(n.op)) continue;
    int entry = -1;
    for (int i = 0; i < proto_.layer_size() && entry < 0; ++i)
      if (GlobMatch(proto_.layer(i).layer(), n.name)) entry = i;
    LOOM_ASSIGN_OR_RETURN(const SplitRules rules, NodeSplitRules(graph, n, batch_axes));
    LayerSplit split = entry >= 0 ? entries_[static_cast<size_t>(entry)] : default_;
    const std::string at = entry >= 0 ? Where(StrCat("layer[", entry, "]")) : Where("default_split");
    bool reduced = false;  // the default dropped a dimension the layer cannot split
    for (SplitDim d : kAllSplitDims) {
      const int64_t degree = split.degree_of(d);
      if (degree == 1 || (d == SplitDim::kSample && rules.sample && rules.sample->Replicates())) continue;
      std::string why;
      const int64_t extent = SplitExtent(graph, n, rules, d, &why, split.parameter_split);
      if (extent > 0 && extent % degree != 0)
        why = d == SplitDim::kReplica ? StrCat("its ", extent, " replicas are not divisible by ", degree)
                                      : StrCat("its extent ", extent, " (", why, ") is not divisible by ", degree);
      else if (extent > 0)
        why.clear();
      if (why.empty()) continue;
      if (entry >= 0)
        return InvalidArgument(at, ": layer '", n.name, "' (", n.op, "): ", SplitDimName(d), " ", degree, ": ", why);
      split.degree[static_cast<int>(d)] = 1;
      if (d == SplitDim::kParameter) split.parameter_split.clear();
      reduced = true;
    }
    if (reduced) split.devices.resize(static_cast<size_t>(split.parts()));
    if (entry >= 0) used[static_cast<size_t>(entry)] = true;
    out.emplace_back(n.id, std::move(split));
  }
  for (size_t i = 0; i < used.size(); ++i)
    if (!used[i])
      return InvalidArgument(Where(StrCat("layer[", i, "].layer")), ": layer pattern '", proto_.layer(i).layer(),
                             "' matches no layer of the model");
  return out;
}

std::string StrategyToText(const proto::Strategy& strategy) {
  std::string text;
  google::protobuf::TextFormat::Printer printer;
  printer.PrintToString(strategy, &text);
  return text;
}

}  // namespace loom
