#include "runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <optional>
#include <set>

#include "core/logging.h"
#include "core/rng.h"
#include "runtime/fold_activations.h"

namespace loom {

uint64_t NodeStreamKey(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// A fused state tensor [R, ...] (attr replica_seeds, graph/fusion.h) fills
// chunk r from replica r's seed, as the single model would be filled with
// that seed.
Status InitializeStateTensor(const Node& node, Tensor* t, uint64_t seed) {
  const AttrMap& a = node.attrs;
  std::string init = a.Str("init", "zeros");
  std::vector<uint64_t> seeds;
  for (int64_t s : a.Ints("replica_seeds")) seeds.push_back(static_cast<uint64_t>(s));
  if (seeds.empty()) seeds.push_back(seed);
  const int64_t n = t->numel() / static_cast<int64_t>(seeds.size());
  auto fill = [&](const std::function<double(Rng&)>& gen) {
    for (size_t r = 0; r < seeds.size(); ++r) {
      Rng rng = Rng::Stream(seeds[r], NodeStreamKey(node.name));
      const int64_t begin = static_cast<int64_t>(r) * n;
      if (t->dtype() == DType::kF32) {
        float* p = t->data<float>() + begin;
        for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(gen(rng));
      } else if (t->dtype() == DType::kF64) {
        double* p = t->data<double>() + begin;
        for (int64_t i = 0; i < n; ++i) p[i] = gen(rng);
      } else {
        LOOM_CHECK(false, "random init of a non-float tensor");
      }
    }
  };
  if (init == "zeros") {
    t->Fill(0);
  } else if (init == "ones") {
    t->Fill(1);
  } else if (init == "constant") {
    t->Fill(a.Float("value"));
  } else if (init == "normal") {
    if (!IsFloating(t->dtype())) return InvalidArgument("normal init of non-float state '", node.name, "'");
    double mean = a.Float("mean"), std = a.Float("std", 1.0);
    fill([&](Rng& rng) { return mean + std * rng.Normal(); });
  } else if (init == "uniform") {
    if (!IsFloating(t->dtype())) return InvalidArgument("uniform init of non-float state '", node.name, "'");
    double lo = a.Float("low", -1.0), hi = a.Float("high", 1.0);
    fill([&](Rng& rng) { return rng.Uniform(lo, hi); });
  } else if (init == "sinusoidal") {
    // [..., max_len, dim]; a fused [R, max_len, dim] gets the same table per
    // replica (it does not depend on the seed).
    if ((t->dtype() != DType::kF32 && t->dtype() != DType::kF64) || t->shape().rank() < 2)
      return InvalidArgument("sinusoidal init of state '", node.name, "' needs an f32 or f64 [max_len, dim] tensor, got ",
                             t->shape().ToString(), " ", DTypeName(t->dtype()));
    const int64_t rows = t->shape().dim(-2), dim = t->shape().dim(-1);
    for (int64_t i = 0; i < t->numel(); ++i) {
      const int64_t pos = (i / dim) % rows, col = i % dim, even = col - col % 2;
      const double angle = static_cast<double>(pos) * std::exp(static_cast<double>(even) * -std::log(10000.0) / dim);
      const double v = col % 2 == 0 ? std::sin(angle) : std::cos(angle);
      if (t->dtype() == DType::kF32) t->data<float>()[i] = static_cast<float>(v);
      else t->data<double>()[i] = v;
    }
  } else {
    return InvalidArgument("state '", node.name, "': unknown init '", init,
                           "' (expected zeros, ones, constant, normal, uniform or sinusoidal)");
  }
  return Status::Ok();
}

Graph ExecutedGraph(Graph graph, const ExecutorOptions& options) {
  if (options.fold_activations) FoldActivationsIntoBatchNorm(&graph);
  return graph;
}

MemoryPlan PlanStepMemory(const Graph& executed) {
  std::set<ValueId> keep;
  for (const auto& [name, v] : executed.outputs()) keep.insert(v);
  for (const StateUpdate& u : executed.state_updates()) keep.insert(u.new_value);
  return PlanMemory(executed, keep);
}

StatusOr<std::unique_ptr<Executor>> Executor::Create(const Graph& graph, const ExecutorOptions& options) {
  std::unique_ptr<Executor> e(new Executor(graph, options));
  LOOM_RETURN_IF_ERROR(e->Prepare());
  return e;
}

Status Executor::Prepare() {
  if (!options_.pool) options_.pool = &ThreadPool::Default();
  // A missing device (no GPU, a CPU-only build) is the error, not the first
  // op without a kernel there.
  LOOM_ASSIGN_OR_RETURN(Allocator * allocator, GetAllocator(options_.device));
  const OpRegistry& registry = OpRegistry::Global();
  graph_ = ExecutedGraph(std::move(graph_), options_);
  for (const Node& node : graph_.nodes()) {
    // Kernels read attributes without defaults; a graph that was not built
    // or loaded (a hand-made node) gets its defaults here.
    Node& n = graph_.mutable_node(node.id);
    if (const OpDef* def = registry.FindOp(n.op))
      LOOM_RETURN_IF_ERROR(CanonicalizeAttrs(*def, &n.attrs).WithContext("node '" + n.name + "' (" + n.op + ")"));
    node_index_[n.id] = static_cast<int>(node_keys_.size());
    node_keys_.push_back(NodeStreamKey(n.name));
    if (options_.profile) profile_.push_back({n.name, n.op, 0.0, 0});
    if (IsSourceOp(n.op)) {
      kernels_.push_back(nullptr);
      continue;
    }
    // Fails here, not at the first step, for an op or dtype the device lacks.
    std::vector<TensorType> in_types, out_types;
    for (ValueId v : n.inputs) in_types.push_back(graph_.type(v));
    for (ValueId v : n.outputs) out_types.push_back(graph_.type(v));
    LOOM_RETURN_IF_ERROR(registry.SupportsNode(n, in_types, out_types, options_.device.type));
    kernels_.push_back(registry.FindKernel(n.op, options_.device.type));
  }

  plan_ = PlanStepMemory(graph_);
  // A view runs no kernel (in-place results are written by their op's).
  for (const auto& [v, root] : plan_.aliases) {
    const Node& producer = graph_.node(graph_.value(v).producer);
    const OpDef* def = registry.FindOp(producer.op);
    if (def && def->IsView()) kernels_[node_index_.at(producer.id)] = nullptr;
  }
  PlanGroups();
  arena_ = std::make_shared<Buffer>(allocator, std::max<size_t>(plan_.arena_bytes, 1));
  if (!arena_->data())
    return ResourceExhausted("cannot allocate the ", plan_.arena_bytes, "-byte activation arena on ",
                             options_.device.ToString());

  int max_value = 0;
  for (const Node& n : graph_.nodes())
    for (ValueId v : n.outputs) max_value = std::max(max_value, v + 1);
  values_.assign(max_value, Tensor());
  for (const auto& [v, slot] : plan_.slots) {
    const TensorType& t = graph_.type(v);
    values_[v] = Tensor::View(arena_, slot.offset, t.shape, t.dtype);
  }
  for (const Node& n : graph_.nodes()) {
    if (!IsStateOp(n.op)) continue;
    const TensorType& t = graph_.type(n.outputs[0]);
    LOOM_ASSIGN_OR_RETURN(Tensor s, Tensor::Empty(t.shape, t.dtype, options_.device));
    state_[n.name] = s;
    values_[n.outputs[0]] = s;
  }
  return Status::Ok();
}

// A group is a run of nodes of one op that has a group kernel on the device,
// with equal attributes and dtypes, consecutive but for nodes that run no
// kernel (sources and views, whose values exist before the step's kernels
// run). Its members must not see each other's writes, since the group
// kernel runs them in any order:
//  - every output is written in place over its input (memory plan aliases),
//    so no member writes arena bytes that the plan had freed after an
//    earlier member read them;
//  - no member reads a value that another member writes.
// Random ops never group (their streams are per node).
void Executor::PlanGroups() {
  const auto& nodes = graph_.nodes();
  groups_.assign(nodes.size(), {});
  in_earlier_group_.assign(nodes.size(), false);
  group_kernels_.assign(nodes.size(), nullptr);
  if (!options_.group_kernels || options_.profile) return;
  const OpRegistry& registry = OpRegistry::Global();
  std::map<ValueId, ValueId> root(plan_.aliases.begin(), plan_.aliases.end());
  auto root_of = [&](ValueId v) {
    auto it = root.find(v);
    return it == root.end() ? v : it->second;
  };
  // The roots a node writes, or nullopt when an output is not in place.
  auto in_place_writes = [&](const Node& n) -> std::optional<std::set<ValueId>> {
    const OpDef* def = registry.FindOp(n.op);
    std::set<ValueId> writes;
    for (int o = 0; o < static_cast<int>(n.outputs.size()); ++o) {
      const int k = def ? def->InPlaceInput(n.attrs, o) : -1;
      if (k < 0 || k >= static_cast<int>(n.inputs.size())) return std::nullopt;
      auto it = root.find(n.outputs[o]);
      if (it == root.end() || it->second != root_of(n.inputs[k])) return std::nullopt;
      writes.insert(it->second);
    }
    return writes;
  };
  auto meets = [](const std::set<ValueId>& a, const std::set<ValueId>& b) {
    return std::any_of(a.begin(), a.end(), [&](ValueId v) { return b.count(v) > 0; });
  };
  auto same_kind = [&](const Node& a, const Node& b) {
    if (a.op != b.op || !(a.attrs == b.attrs) || a.inputs.size() != b.inputs.size() ||
        a.outputs.size() != b.outputs.size())
      return false;
    for (size_t k = 0; k < a.inputs.size(); ++k)
      if (graph_.type(a.inputs[k]).dtype != graph_.type(b.inputs[k]).dtype) return false;
    for (size_t k = 0; k < a.outputs.size(); ++k)
      if (graph_.type(a.outputs[k]).dtype != graph_.type(b.outputs[k]).dtype) return false;
    return true;
  };
  for (size_t i = 0; i < nodes.size();) {
    const Node& head = nodes[i];
    const GroupKernelFn* group = kernels_[i] ? registry.FindGroupKernel(head.op, options_.device.type) : nullptr;
    const OpDef* def = registry.FindOp(head.op);
    std::optional<std::set<ValueId>> written = group && def && !def->IsRandom() ? in_place_writes(head) : std::nullopt;
    if (!written) {
      ++i;
      continue;
    }
    std::set<ValueId> read;
    for (ValueId v : head.inputs) read.insert(root_of(v));
    std::vector<size_t> members = {i};
    size_t end = i + 1;
    for (; end < nodes.size(); ++end) {
      if (!kernels_[end]) continue;
      if (!same_kind(head, nodes[end])) break;
      const std::optional<std::set<ValueId>> writes = in_place_writes(nodes[end]);
      if (!writes) break;
      std::set<ValueId> reads;
      for (ValueId v : nodes[end].inputs) reads.insert(root_of(v));
      // Against the members before it (its own state is in both of its sets).
      if (meets(reads, *written) || meets(*writes, read)) break;
      written->insert(writes->begin(), writes->end());
      read.insert(reads.begin(), reads.end());
      members.push_back(end);
    }
    if (members.size() > 1) {
      for (size_t j = 1; j < members.size(); ++j) in_earlier_group_[members[j]] = true;
      groups_[i] = std::move(members);
      group_kernels_[i] = group;
    }
    i = end;
  }
}

int Executor::kernel_calls_per_step() const {
  int calls = 0;
  for (size_t i = 0; i < kernels_.size(); ++i) calls += kernels_[i] && !in_earlier_group_[i] ? 1 : 0;
  return calls;
}

KernelContext Executor::ContextFor(size_t i) {
  const Node& n = graph_.nodes()[i];
  KernelContext ctx;
  ctx.node = &n;
  ctx.attrs = &n.attrs;
  ctx.device = options_.device;
  ctx.pool = options_.pool;
  for (ValueId v : n.inputs) ctx.inputs.push_back(&values_[v]);
  for (ValueId v : n.outputs) ctx.outputs.push_back(&values_[v]);
  // Keyed by node name, not id: ids change when a graph is rebuilt or
  // reloaded, names do not, so a dropout mask is a function of the model.
  ctx.rng_key = node_keys_[i];
  ctx.step = static_cast<uint64_t>(step_);
  return ctx;
}

Status Executor::InitializeState(uint64_t seed) {
  for (const Node& n : graph_.nodes()) {
    if (!IsStateOp(n.op)) continue;
    const TensorType& t = graph_.type(n.outputs[0]);
    Tensor host = Tensor::Zeros(t.shape, t.dtype);
    LOOM_RETURN_IF_ERROR(InitializeStateTensor(n, &host, seed));
    LOOM_RETURN_IF_ERROR(state_[n.name].CopyFrom(host));
  }
  return Status::Ok();
}

std::vector<std::string> Executor::StateNames() const {
  std::vector<std::string> names;
  for (const auto& [name, t] : state_) names.push_back(name);
  return names;
}

StatusOr<Tensor> Executor::GetState(const std::string& name) const {
  auto it = state_.find(name);
  if (it == state_.end()) return NotFound("no parameter or buffer named '", name, "'");
  return it->second;
}

Status Executor::SetState(const std::string& name, const Tensor& value) {
  auto it = state_.find(name);
  if (it == state_.end()) return NotFound("no parameter or buffer named '", name, "'");
  return it->second.CopyFrom(value).WithContext("setting state '" + name + "'");
}

StatusOr<std::map<std::string, Tensor>> Executor::Run(const std::map<std::string, Tensor>& feeds) {
  LOOM_RETURN_IF_ERROR(Step(feeds));
  std::map<std::string, Tensor> results;  // before the state updates: a state output shows the step's input
  for (const auto& [name, v] : graph_.outputs()) {
    LOOM_ASSIGN_OR_RETURN(results[name], ResultOf(name, values_[v]));
  }
  LOOM_RETURN_IF_ERROR(FinishStep());
  return results;
}

Status Executor::RunInPlace(const std::map<std::string, Tensor>& feeds) {
  LOOM_RETURN_IF_ERROR(Step(feeds));
  return FinishStep();
}

StatusOr<Tensor> Executor::OutputView(const std::string& name) const {
  auto it = graph_.outputs().find(name);
  if (it == graph_.outputs().end()) return NotFound("'", name, "' is not an output of the graph");
  if (!stepped_) return FailedPrecondition("output '", name, "' before the first step");
  return values_[it->second];
}

Status Executor::Step(const std::map<std::string, Tensor>& feeds) {
  size_t fed = 0;
  for (const Node& n : graph_.nodes()) {
    if (n.op != kInputOp) continue;
    auto it = feeds.find(n.name);
    if (it == feeds.end()) return InvalidArgument("input '", n.name, "' was not fed");
    const TensorType& want = graph_.type(n.outputs[0]);
    if (it->second.shape() != want.shape || it->second.dtype() != want.dtype)
      return InvalidArgument("input '", n.name, "' expects ", want.ToString(), ", got ", it->second.shape().ToString(),
                             " ", DTypeName(it->second.dtype()));
    if (it->second.device() == options_.device) {
      values_[n.outputs[0]] = it->second;
    } else {
      LOOM_ASSIGN_OR_RETURN(values_[n.outputs[0]], it->second.To(options_.device));
    }
    ++fed;
  }
  // Aliases see their root's bytes; a fed root changes every step.
  for (const auto& [v, root] : plan_.aliases) {
    LOOM_ASSIGN_OR_RETURN(values_[v], values_[root].Reshape(graph_.type(v).shape));
  }
  if (fed != feeds.size()) {
    for (const auto& [name, t] : feeds) {
      auto id = graph_.FindNode(name);
      if (!id || graph_.node(*id).op != kInputOp) return InvalidArgument("feed '", name, "' is not an input of the graph");
    }
  }

  const auto& nodes = graph_.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!kernels_[i] || in_earlier_group_[i]) continue;
    const Node& n = nodes[i];
    if (!groups_[i].empty()) {
      std::vector<KernelContext> group;
      for (size_t j : groups_[i]) group.push_back(ContextFor(j));
      AttrTypeErrors attr_errors;
      Status s = (*group_kernels_[i])(group);
      if (s.ok() && !attr_errors.first().empty()) s = InvalidArgument(attr_errors.first());
      if (!s.ok())
        return s.WithContext("nodes '" + n.name + "' to '" + nodes[groups_[i].back()].name + "' (" + n.op +
                             ", run as one group of " + std::to_string(groups_[i].size()) + ")");
      continue;
    }
    KernelContext ctx = ContextFor(i);
    Rng rng = ctx.StreamFor(options_.seed);
    ctx.rng = &rng;
    // Type inference normally catches mistyped attributes; this scope covers
    // graphs built without it (a wrong type becomes this node's error).
    AttrTypeErrors attr_errors;
    // Kernels on an asynchronous device (CUDA) return once queued: a profile
    // waits for the device before and after each one, so it times the kernel.
    if (options_.profile) LOOM_RETURN_IF_ERROR(WaitForDevice(options_.device));
    const auto start = options_.profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    Status s = (*kernels_[i])(ctx);
    if (options_.profile && s.ok()) s = WaitForDevice(options_.device);
    if (options_.profile) {
      profile_[i].seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      ++profile_[i].calls;
    }
    if (s.ok() && !attr_errors.first().empty()) s = InvalidArgument(attr_errors.first());
    if (!s.ok()) return s.WithContext("node '" + n.name + "' (" + n.op + ")");
  }
  return Status::Ok();
}

Status Executor::FinishStep() {
  for (const StateUpdate& u : graph_.state_updates()) {
    if (values_[u.new_value].raw_data() == values_[u.state].raw_data()) continue;  // updated in place
    LOOM_RETURN_IF_ERROR(values_[u.state].CopyFrom(values_[u.new_value]));
  }
  ++step_;
  stepped_ = true;
  return Status::Ok();
}

// The values are views of the arena, whose bytes the next step overwrites,
// so a result is a copy. It goes into the buffer of the last step's result
// of that name when nothing else holds that buffer any more (the caller
// dropped it and no view of it was kept or fed back in): large outputs then
// cost a copy a step, not also a fresh allocation whose pages the kernel
// zeroes on first touch.
StatusOr<Tensor> Executor::ResultOf(const std::string& name, const Tensor& value) {
  Tensor& kept = results_[name];
  if (kept.defined() && kept.buffer().use_count() == 1 && kept.shape() == value.shape() &&
      kept.dtype() == value.dtype()) {
    LOOM_RETURN_IF_ERROR(kept.CopyFrom(value));
  } else {
    LOOM_ASSIGN_OR_RETURN(kept, value.To(Device::Cpu()));
  }
  return kept;
}

size_t Executor::PeakStepBytes() const {
  size_t bytes = plan_.arena_bytes;
  for (const auto& [name, t] : state_) bytes += t.nbytes();
  return bytes;
}

}  // namespace loom
