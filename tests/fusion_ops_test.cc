// Horizontal fusion, op by op: for every forward op of the catalogue, the
// fused graph of R = 3 replicas (graph/fusion.h), each with its own
// parameters, must compute exactly what 3 separate single-op graphs compute:
// the same outputs, the same parameter gradients per replica and, for inputs
// that all replicas share, the sum of the replicas' gradients. Everything
// runs in f64, so the tolerance (1e-9 relative) only absorbs a different
// summation order (a batched GEMM, a grouped convolution).
//
// The numbers cannot tell a fused op from a per-replica fallback or from a
// rule that copies its inputs around, so each case also states the fused
// form's structure (XLA-style): which ops the pass emits for the op, and
// whether it runs once per replica, which must agree with the op's declared
// FusionKind.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "core/rng.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/fusion.h"
#include "graph/verifier.h"
#include "runtime/executor.h"
#include "tests/fusion_structure.h"

namespace loom {
namespace {

constexpr int kR = 3;
const std::vector<uint64_t> kSeeds = {101, 202, 303};

enum class Kind {
  kReplicated,       // a Parameter: its own values per replica
  kShared,           // an Input fed once for all replicas
  kPerReplicaInput,  // an Input with its own data per replica
};

struct In {
  Shape shape;
  Kind kind = Kind::kReplicated;
  DType dtype = DType::kF64;
  double lo = -1, hi = 1;  // values drawn uniformly (integers: in [lo, hi])
};

In Rep(Shape s, double lo = -1, double hi = 1) { return {std::move(s), Kind::kReplicated, DType::kF64, lo, hi}; }
In Shr(Shape s, double lo = -1, double hi = 1) { return {std::move(s), Kind::kShared, DType::kF64, lo, hi}; }
In SharedIndex(Shape s, int64_t n) { return {std::move(s), Kind::kShared, DType::kI64, 0, double(n - 1)}; }
In ReplicaIndex(Shape s, int64_t n) { return {std::move(s), Kind::kPerReplicaInput, DType::kI64, 0, double(n - 1)}; }

// The structure of a case's fused form, among the nodes the pass emitted for
// the op under test (node "layer"; its rule's helpers are "layer/..."):
// exact counts of `ops`, where the ops that copy data to move or repeat it
// (Transpose, BroadcastTo, Slice, Concat) count 0 unless listed; Int
// attributes of the fused node "layer"; or, for per_replica, R copies of the
// op on the replicas' slices. Reshapes are views and are not counted.
struct Structure {
  std::map<std::string, int> ops;
  std::map<std::string, int64_t> attrs;
  bool per_replica = false;
};

Structure Fused(std::map<std::string, int> ops, std::map<std::string, int64_t> attrs = {}) {
  return {std::move(ops), std::move(attrs), false};
}
Structure PerReplica() { return {{}, {}, true}; }

struct FuseCase {
  std::string label;
  std::string op;
  AttrMap attrs;
  std::vector<In> in;
  Structure structure;
  std::vector<std::string> unfused;  // FusionOptions::unfused_layers
  std::vector<int> loss_outputs;     // outputs the loss reads (default: every float output)
};

// The name of the model node under test, and of its value.
constexpr const char* kLayer = "layer";

std::string InName(size_t i) { return "in" + std::to_string(i); }

Tensor Random(const In& in, uint64_t key1, uint64_t key2) {
  Rng rng = Rng::Stream(7, key1, key2);
  Tensor t = Tensor::Zeros(in.shape, in.dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (in.dtype == DType::kI64)
      t.data<int64_t>()[i] = static_cast<int64_t>(in.lo) + rng.UniformInt(static_cast<int64_t>(in.hi - in.lo) + 1);
    else
      t.data<double>()[i] = rng.Uniform(in.lo, in.hi);
  }
  return t;
}

// [R, ...] from R tensors of one shape.
Tensor Stack(const std::vector<Tensor>& parts) {
  std::vector<int64_t> dims = parts[0].shape().dims();
  dims.insert(dims.begin(), static_cast<int64_t>(parts.size()));
  Tensor t = Tensor::Zeros(Shape(dims), parts[0].dtype());
  const size_t bytes = parts[0].nbytes();
  for (size_t r = 0; r < parts.size(); ++r)
    std::memcpy(static_cast<char*>(t.raw_data()) + r * bytes, parts[r].raw_data(), bytes);
  return t;
}

// Chunk r of a fused [R, ...] tensor, as doubles.
std::vector<double> Chunk(const Tensor& t, int r) {
  const std::vector<double> all = t.ToDoubleVector();
  const size_t n = all.size() / kR;
  return std::vector<double>(all.begin() + r * n, all.begin() + (r + 1) * n);
}

void ExpectClose(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      CHECK(std::isnan(got[i]));
      continue;
    }
    const double tol = 1e-9 * std::max(1.0, std::abs(want[i]));
    if (std::abs(got[i] - want[i]) > tol) {
      INFO("element " << i << ": fused " << got[i] << " vs separate " << want[i]);
      CHECK(false);
      return;
    }
  }
}

// The single-replica graph: the op on its inputs, outputs "out<i>", and a
// scalar "loss" = sum_i sum(out_i * probe_i) over its float outputs.
Graph BuildSingle(const FuseCase& c, std::vector<TensorType>* probe_types) {
  Graph g;
  GraphBuilder b(&g);
  std::vector<ValueId> ins;
  for (size_t i = 0; i < c.in.size(); ++i) {
    const TensorType t{c.in[i].shape, c.in[i].dtype};
    ins.push_back(c.in[i].kind == Kind::kReplicated ? b.Parameter(InName(i), t, {}) : b.Input(InName(i), t));
  }
  auto outs = b.Add(c.op, ins, c.attrs, kLayer);
  INFO(c.label);
  REQUIRE(outs.ok());
  ValueId loss = kNoValue;
  for (size_t i = 0; i < outs->size(); ++i) {
    const ValueId out = (*outs)[i];
    g.outputs()["out" + std::to_string(i)] = out;
    if (!IsFloating(g.type(out).dtype)) continue;
    if (!c.loss_outputs.empty() &&
        std::find(c.loss_outputs.begin(), c.loss_outputs.end(), static_cast<int>(i)) == c.loss_outputs.end())
      continue;
    probe_types->push_back(g.type(out));
    const ValueId probe = b.Input("probe" + std::to_string(i), g.type(out));
    ValueId term = *b.Add1("ReduceSum", {*b.Add1("Mul", {out, probe}, {}, "loss/mul")}, {}, "loss/sum");
    loss = loss == kNoValue ? term : *b.Add1("Add", {loss, term}, {}, "loss/add");
  }
  REQUIRE(loss != kNoValue);
  g.outputs()["loss"] = loss;
  return g;
}

// Adds d(loss)/d(every float in<i>) as outputs "grad<i>"; `loss` is a
// scalar value of g.
void AddGradients(Graph* g, ValueId loss, const FuseCase& c) {
  std::vector<ValueId> wrt;
  std::vector<size_t> which;
  for (size_t i = 0; i < c.in.size(); ++i) {
    if (c.in[i].dtype == DType::kI64) continue;
    wrt.push_back(g->node(*g->FindNode(InName(i))).outputs[0]);
    which.push_back(i);
  }
  if (wrt.empty()) return;
  auto grads = BuildGradients(g, loss, wrt);
  if (!grads.ok()) FAIL(c.label << ": " << grads.status().ToString());
  for (size_t k = 0; k < wrt.size(); ++k) g->outputs()["grad" + std::to_string(which[k])] = grads->at(wrt[k]);
}

std::map<std::string, Tensor> RunGraph(const Graph& g, uint64_t seed, const std::map<std::string, Tensor>& state,
                                       const std::map<std::string, Tensor>& feeds, const std::string& label) {
  INFO(label);
  auto e = Executor::Create(g, ExecutorOptions{Device::Cpu(), nullptr, seed, false});
  REQUIRE(e.ok());
  for (const auto& [name, t] : state) REQUIRE((*e)->SetState(name, t).ok());
  auto out = (*e)->Run(feeds);
  if (!out.ok()) FAIL(out.status().ToString());
  return *out;
}

StatusOr<Graph> Fuse(const FuseCase& c, const Graph& single, const std::vector<std::string>& unfused) {
  FusionOptions options;
  options.replicas = kR;
  options.seeds = kSeeds;
  options.unfused_layers = unfused;
  for (size_t i = 0; i < c.in.size(); ++i)
    if (c.in[i].kind == Kind::kPerReplicaInput) options.per_replica_inputs.insert(InName(i));
  return FuseReplicas(single, options);
}

bool AnyReplicatedInput(const FuseCase& c) {
  for (const In& in : c.in)
    if (in.kind != Kind::kShared) return true;
  return false;
}

// "" when the fused forward graph has the case's structure, else the first
// difference.
std::string StructureMismatch(const FuseCase& c, const Graph& single, const Graph& fused) {
  if (Status valid = VerifyGraph(fused); !valid.ok()) return "the fused graph fails the verifier: " + valid.ToString();
  for (NodeId id : fused.NodesWithOp(kParameterOp))
    if (fused.value(fused.node(id).outputs[0]).replica_layout != ReplicaLayout::Axis(0))
      return "Parameter '" + fused.node(id).name + "' is not laid out [R, ...]";
  std::map<std::string, int> per_replica;  // op -> nodes on one replica's slice
  for (NodeId id : testing::PerReplicaNodes(fused)) {
    const Node& n = fused.node(id);
    if (testing::ModelNodeOf(n.name, single) != kLayer)
      return "node '" + n.name + "' (" + n.op + ") outside the op under test runs per replica";
    ++per_replica[n.op];
  }
  const Structure& want = c.structure;
  const bool runs_per_replica = per_replica.count(c.op) != 0;
  if (runs_per_replica != want.per_replica || (want.per_replica && per_replica[c.op] != kR))
    return StrCat(c.op, " runs ", per_replica[c.op], " times on single replicas; expected ",
                  want.per_replica ? StrCat(kR, " (once per replica)") : std::string("0 (fused)"));
  if (want.per_replica) return "";
  std::map<std::string, int> ops = testing::OpsEmittedFor(fused, single, kLayer);
  std::map<std::string, int> expected = {{"Transpose", 0}, {"BroadcastTo", 0}, {"Slice", 0}, {"Concat", 0}};
  for (const auto& [op, count] : want.ops) expected[op] = count;
  for (const auto& [op, count] : expected)
    if (ops[op] != count) return StrCat("the fused form holds ", ops[op], " ", op, " node(s), expected ", count);
  const Node& layer = fused.node(*fused.FindNode(kLayer));
  for (const auto& [attr, value] : want.attrs)
    if (layer.attrs.Int(attr, -1) != value)
      return StrCat("the fused node's ", attr, " is ", layer.attrs.Int(attr, -1), ", expected ", value);
  return "";
}

// What the case says agrees with what the op declares: a declared fused op
// never runs per replica (the pass enforces it), a declared per-replica op
// always does.
std::string KindMismatch(const FuseCase& c) {
  if (!c.unfused.empty() || !AnyReplicatedInput(c)) return "";  // the pass decides, not the op
  const FusionKind kind = OpRegistry::Global().FindOp(c.op)->fusion_kind();
  const bool ok = kind == FusionKind::kFusedOrPerReplica ||
                  c.structure.per_replica == (kind == FusionKind::kPerReplica);
  if (ok) return "";
  return StrCat(c.op, " declares fusion kind '", FusionKindName(kind), "' but the case expects it ",
                c.structure.per_replica ? "per replica" : "fused");
}

void CheckFusedAgainstSeparate(const FuseCase& c) {
  INFO("case: " << c.label);
  std::vector<TensorType> probe_types;
  const Graph single = BuildSingle(c, &probe_types);

  auto fused = Fuse(c, single, c.unfused);
  if (!fused.ok()) FAIL(fused.status().ToString());
  CHECK(KindMismatch(c) == "");
  CHECK(StructureMismatch(c, single, *fused) == "");
  {
    GraphBuilder b(&*fused);
    auto total = b.Add1("ReduceSum", {fused->outputs().at("loss")}, {}, "loss/replicas");
    REQUIRE(total.ok());
    AddGradients(&*fused, *total, c);
  }
  // Autodiff gives each gradient its value's layout.
  for (size_t i = 0; i < c.in.size(); ++i) {
    auto grad = fused->outputs().find("grad" + std::to_string(i));
    if (grad == fused->outputs().end()) continue;
    const ValueId in = fused->node(*fused->FindNode(InName(i))).outputs[0];
    INFO("gradient of " << InName(i));
    CHECK(fused->value(grad->second).replica_layout == fused->value(in).replica_layout);
  }
  Graph separate = single;
  AddGradients(&separate, separate.outputs().at("loss"), c);

  // Inputs: per replica, or one for all.
  std::vector<std::vector<Tensor>> values(c.in.size());
  for (size_t i = 0; i < c.in.size(); ++i)
    for (int r = 0; r < (c.in[i].kind == Kind::kShared ? 1 : kR); ++r) values[i].push_back(Random(c.in[i], i, r));
  std::map<std::string, Tensor> probes;
  for (size_t i = 0; i < probe_types.size(); ++i)
    probes["probe" + std::to_string(i)] = Random(Shr(probe_types[i].shape), 100 + i, 0);

  std::vector<std::map<std::string, Tensor>> single_out;
  for (int r = 0; r < kR; ++r) {
    std::map<std::string, Tensor> state, feeds = probes;
    for (size_t i = 0; i < c.in.size(); ++i) {
      const Tensor& v = values[i][c.in[i].kind == Kind::kShared ? 0 : r];
      (c.in[i].kind == Kind::kReplicated ? state : feeds)[InName(i)] = v;
    }
    single_out.push_back(RunGraph(separate, kSeeds[r], state, feeds, "separate replica " + std::to_string(r)));
  }
  std::map<std::string, Tensor> state, feeds = probes;
  for (size_t i = 0; i < c.in.size(); ++i) {
    const Tensor v = c.in[i].kind == Kind::kShared ? values[i][0] : Stack(values[i]);
    (c.in[i].kind == Kind::kReplicated ? state : feeds)[InName(i)] = v;
  }
  const auto fused_out = RunGraph(*fused, 999, state, feeds, "fused");

  for (const auto& [name, t] : single_out[0]) {
    const Tensor& f = fused_out.at(name);
    const bool shared_grad =
        name.rfind("grad", 0) == 0 && c.in[std::stoul(name.substr(4))].kind == Kind::kShared;
    if (shared_grad) {  // a shared input's gradient sums the replicas'
      std::vector<double> sum(t.numel(), 0.0);
      for (int r = 0; r < kR; ++r) {
        const auto v = single_out[r].at(name).ToDoubleVector();
        for (size_t k = 0; k < sum.size(); ++k) sum[k] += v[k];
      }
      ExpectClose(f.ToDoubleVector(), sum, name + " (shared input, summed over replicas)");
      continue;
    }
    REQUIRE(f.numel() == kR * t.numel());
    for (int r = 0; r < kR; ++r)
      ExpectClose(Chunk(f, r), single_out[r].at(name).ToDoubleVector(), name + " of replica " + std::to_string(r));
  }
}

AttrMap A(std::initializer_list<std::pair<const std::string, AttrValue>> init) { return AttrMap(init); }

std::vector<FuseCase> Cases() {
  std::vector<FuseCase> cases;
  auto add = [&](std::string label, std::string op, AttrMap attrs, std::vector<In> in, Structure structure,
                 std::vector<std::string> unfused = {}) {
    cases.push_back({std::move(label), std::move(op), std::move(attrs), std::move(in), std::move(structure),
                     std::move(unfused), {}});
  };
  // Fused forms that are the op itself.
  auto same = [](const std::string& op) { return Fused({{op, 1}}); };
  // Element-wise unary ops, on per-replica and on shared inputs.
  for (const char* op : {"Identity", "Neg", "ReLU", "ReLU6", "GELU", "Sigmoid", "Tanh", "Hardswish", "Hardsigmoid",
                         "SiLU", "Exp", "Abs"}) {
    add(std::string(op) + " replicated", op, {}, {Rep({4, 5}, -4, 4)}, same(op));
  }
  add("LeakyReLU", "LeakyReLU", A({{"negative_slope", 0.2}}), {Rep({4, 5})}, same("LeakyReLU"));
  add("GELU tanh", "GELU", A({{"approximate", "tanh"}}), {Rep({2, 3, 4})}, same("GELU"));
  for (const char* op : {"Log", "Sqrt", "Rsqrt"}) add(std::string(op), op, {}, {Rep({3, 4}, 0.5, 2)}, same(op));
  add("AddScalar", "AddScalar", A({{"value", 0.5}}), {Rep({3, 4})}, same("AddScalar"));
  add("MulScalar", "MulScalar", A({{"value", -2.0}}), {Rep({3, 4})}, same("MulScalar"));
  add("PowScalar", "PowScalar", A({{"value", 3.0}}), {Rep({3, 4})}, same("PowScalar"));
  add("Cast", "Cast", A({{"to", "f64"}}), {Rep({3, 4})}, same("Cast"));
  // Broadcasting binary ops: shared data against per-replica parameters.
  add("Add shared x + bias", "Add", {}, {Shr({4, 3, 5}), Rep({5})}, same("Add"));
  add("Sub bias - shared x", "Sub", {}, {Rep({3, 1}), Shr({4, 3, 5})}, same("Sub"));
  add("Mul replicated", "Mul", {}, {Rep({4, 3, 5}), Rep({3, 1})}, same("Mul"));
  add("Div", "Div", {}, {Rep({2, 3}), Rep({3}, 0.5, 2)}, same("Div"));
  add("Add scalar param", "Add", {}, {Shr({2, 3}), Rep({})}, same("Add"));
  // Products: one batched Linear (bias in its pass), reading a shared x in
  // place for every replica or a replicated x's own rows.
  add("Linear shared x", "Linear", {}, {Shr({4, 6}), Rep({5, 6}), Rep({5})},
      Fused({{"Linear", 1}, {"BatchMatMul", 0}}));
  add("Linear shared 3-D x, no bias", "Linear", {}, {Shr({2, 3, 6}), Rep({5, 6})},
      Fused({{"Linear", 1}, {"BatchMatMul", 0}}));
  add("Linear replicated x", "Linear", {}, {Rep({4, 6}), Rep({5, 6}), Rep({5})},
      Fused({{"Linear", 1}, {"BatchMatMul", 0}, {"Add", 0}}));
  add("Linear replicated 3-D x, no bias", "Linear", {}, {Rep({2, 3, 6}), Rep({5, 6})},
      Fused({{"Linear", 1}, {"BatchMatMul", 0}}));
  add("Linear unfused", "Linear", {}, {Shr({4, 6}), Rep({5, 6}), Rep({5})}, PerReplica(), {kLayer});
  add("MatMul", "MatMul", {}, {Rep({3, 4}), Rep({4, 5})}, Fused({{"BatchMatMul", 1}, {"MatMul", 0}}));
  // A shared operand is broadcast to R copies.
  add("MatMul shared a, transposed b", "MatMul", A({{"transpose_b", true}}), {Shr({3, 4}), Rep({5, 4})},
      Fused({{"BatchMatMul", 1}, {"BroadcastTo", 1}}));
  add("BatchMatMul", "BatchMatMul", A({{"transpose_a", true}}), {Rep({2, 4, 3}), Rep({2, 4, 5})},
      same("BatchMatMul"));
  // Convolutions: one plain conv into R*O channels on shared x (one group),
  // a grouped conv with R times the groups otherwise. x here is a Parameter [R, N, C, ...],
  // whose replica axis moves to 1 with one Transpose; an activation made by
  // an earlier fused op is [N, R, C, ...] already.
  add("Conv2d shared x", "Conv2d", A({{"padding", int64_t{1}}}), {Shr({2, 3, 5, 5}), Rep({4, 3, 3, 3}), Rep({4})},
      same("Conv2d"));
  add("Conv2d replicated x, stride 2", "Conv2d", A({{"stride", int64_t{2}}}), {Rep({2, 3, 5, 5}), Rep({4, 3, 3, 3})},
      Fused({{"Conv2d", 1}, {"Transpose", 1}}, {{"groups", kR}}));
  add("Conv2d groups 2 shared x", "Conv2d", A({{"groups", int64_t{2}}}),
      {Shr({2, 4, 4, 4}), Rep({6, 2, 3, 3}), Rep({6})},
      Fused({{"Conv2d", 1}, {"BroadcastTo", 1}}, {{"groups", 2 * kR}}));
  add("Conv1d", "Conv1d", A({{"padding", int64_t{1}}}), {Shr({2, 3, 7}), Rep({4, 3, 3}), Rep({4})}, same("Conv1d"));
  add("ConvTranspose2d", "ConvTranspose2d", A({{"stride", int64_t{2}}}),
      {Shr({2, 3, 3, 3}), Rep({3, 2, 3, 3}), Rep({2})},
      Fused({{"ConvTranspose2d", 1}, {"BroadcastTo", 1}}, {{"groups", kR}}));
  add("ConvTranspose1d groups 2", "ConvTranspose1d", A({{"groups", int64_t{2}}}),
      {Rep({2, 4, 5}), Rep({4, 3, 2}), Rep({6})},
      Fused({{"ConvTranspose1d", 1}, {"Transpose", 1}}, {{"groups", 2 * kR}}));
  // Normalization: BatchNorm over R*C channels (x a Parameter, as above).
  add("BatchNorm train 4-D", "BatchNorm", A({{"training", true}}),
      {Rep({3, 2, 3, 3}), Rep({2}), Rep({2}), Rep({2}), Rep({2}, 0.5, 2)}, Fused({{"BatchNorm", 1}, {"Transpose", 1}}));
  add("BatchNorm train [N, C] shared x", "BatchNorm", A({{"training", true}}),
      {Shr({5, 3}), Rep({3}), Rep({3}), Rep({3}), Rep({3}, 0.5, 2)}, Fused({{"BatchNorm", 1}, {"BroadcastTo", 1}}));
  add("BatchNorm eval", "BatchNorm", A({{"training", false}}),
      {Rep({2, 3, 4}), Rep({3}), Rep({3}), Rep({3}), Rep({3}, 0.5, 2)}, Fused({{"BatchNorm", 1}, {"Transpose", 1}}));
  add("BatchNorm train with the ReLU epilogue", "BatchNorm", A({{"training", true}, {"activation", "relu"}}),
      {Rep({3, 2, 3, 3}), Rep({2}), Rep({2}), Rep({2}), Rep({2}, 0.5, 2)}, Fused({{"BatchNorm", 1}, {"Transpose", 1}}));
  add("BatchNorm train with the ReLU6 epilogue", "BatchNorm", A({{"training", true}, {"activation", "relu6"}}),
      {Rep({3, 2, 3, 3}), Rep({2}, 4, 8), Rep({2}), Rep({2}), Rep({2}, 0.5, 2)},
      Fused({{"BatchNorm", 1}, {"Transpose", 1}}));
  // Per-replica gamma and beta: rows of [R, normalized_shape] in LayerNorm's own pass, no Mul or Add.
  add("LayerNorm affine", "LayerNorm", A({{"normalized_shape", std::vector<int64_t>{5}}}),
      {Rep({2, 3, 5}), Rep({5}), Rep({5})}, Fused({{"LayerNorm", 1}, {"Mul", 0}, {"Add", 0}}));
  add("LayerNorm gamma only", "LayerNorm", A({{"normalized_shape", std::vector<int64_t>{5}}}),
      {Rep({2, 3, 5}), Rep({5})}, Fused({{"LayerNorm", 1}, {"Mul", 0}}));
  add("LayerNorm shared x", "LayerNorm", A({{"normalized_shape", std::vector<int64_t>{3, 4}}}),
      {Shr({2, 3, 4}), Rep({3, 4}), Rep({3, 4})}, Fused({{"LayerNorm", 1}, {"BroadcastTo", 1}, {"Mul", 0}, {"Add", 0}}));
  add("LayerNorm shared affine", "LayerNorm", A({{"normalized_shape", std::vector<int64_t>{4}}}),
      {Rep({2, 3, 4}), Shr({4}), Shr({4})}, same("LayerNorm"));
  add("LayerNorm no affine", "LayerNorm", A({{"normalized_shape", std::vector<int64_t>{4}}}), {Rep({3, 4})},
      same("LayerNorm"));
  // Pooling over [N, R*C, H, W] (x a Parameter, as above).
  add("MaxPool2d", "MaxPool2d", A({{"kernel", int64_t{2}}}), {Rep({2, 3, 4, 4})},
      Fused({{"MaxPool2d", 1}, {"Transpose", 1}}));
  add("AvgPool2d", "AvgPool2d", A({{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"padding", int64_t{1}}}),
      {Rep({2, 2, 5, 5})}, Fused({{"AvgPool2d", 1}, {"Transpose", 1}}));
  add("AdaptiveAvgPool2d", "AdaptiveAvgPool2d", A({{"output_size", int64_t{2}}}), {Rep({2, 3, 5, 5})},
      Fused({{"AdaptiveAvgPool2d", 1}, {"Transpose", 1}}));
  // Shape ops.
  add("Reshape", "Reshape", A({{"shape", std::vector<int64_t>{3, -1}}}), {Rep({2, 3, 4})}, same("Reshape"));
  add("Reshape keeps batch", "Reshape", A({{"shape", std::vector<int64_t>{2, 12}}}), {Rep({2, 3, 4})}, same("Reshape"));
  add("Flatten", "Flatten", {}, {Rep({2, 3, 4})}, Fused({{"Reshape", 1}, {"Flatten", 0}}));
  add("Transpose", "Transpose", A({{"perm", std::vector<int64_t>{2, 0, 1}}}), {Rep({2, 3, 4})}, same("Transpose"));
  add("Permute", "Permute", A({{"perm", std::vector<int64_t>{1, 0}}}), {Rep({2, 3})}, same("Permute"));
  add("Concat shared + replicated", "Concat", A({{"axis", int64_t{1}}}), {Shr({2, 3}), Rep({2, 2})},
      Fused({{"Concat", 1}, {"BroadcastTo", 1}}));
  add("Split", "Split", A({{"axis", int64_t{-1}}, {"sizes", std::vector<int64_t>{1, 3}}}), {Rep({2, 4})},
      same("Split"));
  add("Slice", "Slice", A({{"axis", int64_t{1}}, {"start", int64_t{1}}, {"end", int64_t{4}}, {"step", int64_t{2}}}),
      {Rep({2, 5})}, same("Slice"));
  add("BroadcastTo", "BroadcastTo", A({{"shape", std::vector<int64_t>{2, 3, 4}}}), {Rep({3, 1})}, same("BroadcastTo"));
  add("SumToShape", "SumToShape", A({{"shape", std::vector<int64_t>{3, 1}}}), {Rep({2, 3, 4})}, PerReplica());
  // No inputs: shared, kept as it is.
  add("Fill", "Fill", A({{"shape", std::vector<int64_t>{2, 2}}, {"dtype", "f64"}, {"value", 1.5}}), {}, same("Fill"));
  // Reductions and softmax.
  add("ReduceSum all", "ReduceSum", {}, {Rep({2, 3})}, same("ReduceSum"));
  add("ReduceMean axis keepdims", "ReduceMean", A({{"axes", std::vector<int64_t>{-1}}, {"keepdims", true}}),
      {Rep({2, 3, 4})}, same("ReduceMean"));
  add("ReduceMax axis 0", "ReduceMax", A({{"axes", std::vector<int64_t>{0}}}), {Rep({4, 3})}, same("ReduceMax"));
  add("ReduceMax two axes", "ReduceMax", A({{"axes", std::vector<int64_t>{0, 2}}}), {Rep({3, 2, 4})}, same("ReduceMax"));
  // Over no axis (a scalar): the identity, its index a shared 0.
  add("ReduceMax scalar", "ReduceMax", {}, {Rep({})}, Fused({{"Identity", 1}, {"Fill", 1}}));
  add("Softmax", "Softmax", {}, {Rep({2, 5}, -3, 3)}, same("Softmax"));
  add("LogSoftmax axis 0", "LogSoftmax", A({{"axis", int64_t{0}}}), {Rep({4, 3}, -3, 3)}, same("LogSoftmax"));
  // Random: one mask per replica along the replica axis (a shared x is
  // broadcast to R copies first, each masked differently).
  add("Dropout replicated", "Dropout", A({{"p", 0.3}}), {Rep({6, 7})},
      Fused({{"Dropout", 1}}, {{kReplicaAxisAttr, 0}}));
  add("Dropout shared x", "Dropout", A({{"p", 0.5}}), {Shr({5, 4})},
      Fused({{"Dropout", 1}, {"BroadcastTo", 1}}, {{kReplicaAxisAttr, 1}}));
  add("Dropout eval", "Dropout", A({{"p", 0.5}, {"training", false}}), {Rep({5, 4})}, same("Dropout"));
  // Lookup: shared indices read the tables side by side, [V, R*D], which
  // moves the [R, V, D] parameter's replica axis with one Transpose.
  add("Embedding shared indices", "Embedding", {}, {SharedIndex({2, 3}, 5), Rep({5, 4})},
      Fused({{"Embedding", 1}, {"Transpose", 1}}));
  add("Embedding per-replica indices", "Embedding", A({{"padding_idx", int64_t{1}}}),
      {ReplicaIndex({4}, 6), Rep({6, 3})}, PerReplica());
  // Replica-major q, k, v (as fused Linears make them) are R*B batch
  // entries: nothing moves. With a shared q, the replicas become R*H heads.
  add("ScaledDotProductAttention", "ScaledDotProductAttention", {},
      {Rep({2, 2, 3, 4}), Rep({2, 2, 5, 4}), Rep({2, 2, 5, 3})}, Fused({{"ScaledDotProductAttention", 1}}));
  add("ScaledDotProductAttention causal, shared q", "ScaledDotProductAttention", A({{"causal", true}}),
      {Shr({1, 2, 4, 3}), Rep({1, 2, 4, 3}), Rep({1, 2, 4, 3})},
      Fused({{"ScaledDotProductAttention", 1}, {"BroadcastTo", 1}}));
  // LSTM: one node, replica-major (attribute replicas); shared inputs are
  // broadcast to R copies, others move their replica axis first.
  add("LSTM shared x and state", "LSTM", {},
      {Shr({3, 2, 4}), Shr({2, 3}), Shr({2, 3}), Rep({12, 4}, -0.5, 0.5), Rep({12, 3}, -0.5, 0.5), Rep({12}),
       Rep({12})},
      Fused({{"LSTM", 1}, {"BroadcastTo", 3}}, {{"replicas", kR}}));
  cases.back().loss_outputs = {0, 1, 2};  // y, h_T, c_T (gates and cells are saved for the backward op)
  add("LSTM replicated x and state", "LSTM", {},
      {Rep({3, 2, 4}), Rep({2, 3}, -0.5, 0.5), Rep({2, 3}, -0.5, 0.5), Rep({12, 4}, -0.5, 0.5),
       Rep({12, 3}, -0.5, 0.5), Rep({12}), Rep({12})},
      Fused({{"LSTM", 1}, {"BroadcastTo", 0}}, {{"replicas", kR}}));
  cases.back().loss_outputs = {0, 1, 2};
  // Losses: the fused loss is the replicas' own losses, [R]. CrossEntropy
  // makes them in one node (attribute replicas).
  add("CrossEntropy", "CrossEntropy", A({{"label_smoothing", 0.1}}), {Rep({4, 5}, -2, 2), SharedIndex({4}, 5)},
      Fused({{"CrossEntropy", 1}}, {{"replicas", kR}}));
  add("CrossEntropy per-replica targets", "CrossEntropy", A({{"reduction", "sum"}}),
      {Rep({4, 3}), ReplicaIndex({4}, 3)}, Fused({{"CrossEntropy", 1}}, {{"replicas", kR}}));
  add("CrossEntropy shared logits, per-replica targets", "CrossEntropy", {}, {Shr({4, 3}), ReplicaIndex({4}, 3)},
      Fused({{"CrossEntropy", 1}, {"BroadcastTo", 1}}, {{"replicas", kR}}));
  add("NLL", "NLL", {}, {Rep({4, 5}, -3, -0.1), SharedIndex({4}, 5)}, PerReplica());
  add("MSE shared target", "MSE", {}, {Rep({3, 4}), Shr({3, 4})}, PerReplica());
  // BCEWithLogits: one node (attribute replicas) unless pos_weight is per
  // replica.
  add("BCEWithLogits shared targets", "BCEWithLogits", {}, {Rep({3, 4}), Shr({3, 4}, 0, 1)},
      Fused({{"BCEWithLogits", 1}}, {{"replicas", kR}}));
  add("BCEWithLogits per-replica targets, shared pos_weight", "BCEWithLogits", A({{"reduction", "sum"}}),
      {Rep({3, 4}), Rep({3, 4}, 0, 1), Shr({4}, 0.5, 2)}, Fused({{"BCEWithLogits", 1}}, {{"replicas", kR}}));
  add("BCEWithLogits per-replica pos_weight", "BCEWithLogits", {}, {Rep({3, 4}), Shr({3, 4}, 0, 1), Rep({4}, 0.5, 2)},
      PerReplica());
  return cases;
}

// Test-only ops, outside the catalogue: element-wise copies, one without a
// fused form (the default rule) and one that declares a fused form its rule
// does not have.
constexpr const char* kTestOpPrefix = "TestOnly";
constexpr const char* kNoFusedFormOp = "TestOnlyNoFusedForm";
constexpr const char* kFalselyFusedOp = "TestOnlyFalselyFused";

class TestCopyOp : public OpDef {
 public:
  TestCopyOp(const char* name, FusionKind kind) : name_(name), kind_(kind) {}
  std::string name() const override { return name_; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap&, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, name_));
    return in;
  }
  Status Gradient(GradBuilder& g) const override {
    g.SetInputGrad(0, g.output_grad(0));
    return Status::Ok();
  }
  FusionKind fusion_kind() const override { return kind_; }

 private:
  const char* name_;
  FusionKind kind_;
};
LOOM_REGISTER_OP(TestCopyOp, kNoFusedFormOp, FusionKind::kPerReplica);
LOOM_REGISTER_OP(TestCopyOp, kFalselyFusedOp, FusionKind::kFused);
Status CopyKernel(KernelContext& ctx) {
  std::memcpy(ctx.out(0).raw_data(), ctx.in(0).raw_data(), ctx.in(0).nbytes());
  return Status::Ok();
}
LOOM_REGISTER_KERNEL(kNoFusedFormOp, DeviceType::kCpu, CopyKernel);
LOOM_REGISTER_KERNEL(kFalselyFusedOp, DeviceType::kCpu, CopyKernel);

// Ops that never appear in a graph being fused: fusion runs on the forward
// graph, before autodiff and the optimizer add these.
bool IsTrainingOnlyOp(const std::string& op) {
  static const std::set<std::string> ops = {"SgdUpdate", "AdamUpdate", "AdadeltaUpdate", "RmspropUpdate",
                                            "SquaredNorm", "ClipScale",  "IsFinite",       "LossScaleUpdate",
                                            "Input",      "Parameter",  "Buffer",
                                            // emitted by the task graph's expansions of split nodes
                                            "BatchNormPivot", "BatchNormStats", "BatchNormApply", "CountTargets"};
  return ops.count(op) || op.find("Backward") != std::string::npos;
}

bool IsCatalogueForwardOp(const std::string& op) { return !IsTrainingOnlyOp(op) && op.rfind(kTestOpPrefix, 0) != 0; }

TEST_CASE("every forward op of the catalogue has a fusion case") {
  std::set<std::string> covered;
  for (const FuseCase& c : Cases()) covered.insert(c.op);
  for (const std::string& op : OpRegistry::Global().OpNames()) {
    if (!IsCatalogueForwardOp(op)) continue;
    INFO("op " << op << " has no case in tests/fusion_ops_test.cc");
    CHECK(covered.count(op) == 1);
  }
}

// The ops that forgo (some of) the speed-up. An op added without a fused
// rule lands here: list it only when per-replica is the intended choice.
TEST_CASE("the forward ops without a fused form are the declared ones") {
  const std::map<std::string, FusionKind> not_fused = {
      {"NLL", FusionKind::kPerReplica},
      {"MSE", FusionKind::kPerReplica},
      {"BCEWithLogits", FusionKind::kFusedOrPerReplica},     // per-replica pos_weight
      {"SumToShape", FusionKind::kPerReplica},
      {"Embedding", FusionKind::kFusedOrPerReplica},            // per-replica indices
      {"ScaledDotProductAttention", FusionKind::kFusedOrPerReplica},  // per-replica key padding mask
  };
  for (const std::string& op : OpRegistry::Global().OpNames()) {
    if (!IsCatalogueForwardOp(op)) continue;
    INFO("op " << op);
    const FusionKind kind = OpRegistry::Global().FindOp(op)->fusion_kind();
    auto it = not_fused.find(op);
    CHECK(FusionKindName(kind) == std::string(FusionKindName(it == not_fused.end() ? FusionKind::kFused : it->second)));
  }
}

TEST_CASE("fused ops of 3 replicas equal 3 separate ops, forward and backward, in their fused form") {
  for (const FuseCase& c : Cases()) CheckFusedAgainstSeparate(c);
}

FuseCase FindCase(const std::string& label) {
  for (const FuseCase& c : Cases())
    if (c.label == label) return c;
  FAIL("no case " << label);
  return {};
}

// A fallback computes the right numbers: only the structure shows it.
TEST_CASE("a planted per-replica fallback passes the numbers and fails the structural checks") {
  SECTION("an unfused layer") {
    FuseCase c = FindCase("Conv2d replicated x, stride 2");
    std::vector<TensorType> probes;
    const Graph single = BuildSingle(c, &probes);
    auto fused = Fuse(c, single, {kLayer});
    REQUIRE(fused.ok());
    CHECK_THAT(StructureMismatch(c, single, *fused),
               Catch::Matchers::Contains("Conv2d runs 3 times on single replicas; expected 0 (fused)"));
    c.unfused = {kLayer};
    c.structure = PerReplica();
    CheckFusedAgainstSeparate(c);
  }
  SECTION("an op without a fused form") {
    FuseCase c{"planted", kNoFusedFormOp, {}, {Rep({2, 3})}, Fused({{kNoFusedFormOp, 1}}), {}, {}};
    std::vector<TensorType> probes;
    const Graph single = BuildSingle(c, &probes);
    auto fused = Fuse(c, single, {});
    REQUIRE(fused.ok());
    CHECK_THAT(StructureMismatch(c, single, *fused), Catch::Matchers::Contains("runs 3 times on single replicas"));
    CHECK_THAT(KindMismatch(c), Catch::Matchers::Contains("declares fusion kind 'per replica'"));
    c.structure = PerReplica();
    CheckFusedAgainstSeparate(c);
  }
  SECTION("an op that declares a fused form its rule does not have") {
    FuseCase c{"planted", kFalselyFusedOp, {}, {Rep({2, 3})}, Fused({{kFalselyFusedOp, 1}}), {}, {}};
    std::vector<TensorType> probes;
    auto fused = Fuse(c, BuildSingle(c, &probes), {});
    REQUIRE(!fused.ok());
    CHECK_THAT(fused.status().ToString(),
               Catch::Matchers::Contains("op TestOnlyFalselyFused declares a fused form, but its rule ran it once per "
                                         "replica"));
  }
}

}  // namespace
}  // namespace loom
