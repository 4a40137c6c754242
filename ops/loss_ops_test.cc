#include <catch2/catch.hpp>

#include <cmath>

#include "core/rng.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "runtime/executor.h"
#include "tests/op_harness.h"

namespace loom::testing {
namespace {

Tensor ScalarF64(double v) {
  Tensor t = ZerosF64({});
  At(t, 0) = v;
  return t;
}

double Reduce(double total, int64_t count, const AttrMap& attrs) {
  return attrs.Str("reduction") == "mean" ? total / static_cast<double>(count) : total;
}

// Loops over samples of scores [N, C, d...] (or [C]) with targets [N, d...]
// (or []): fn(score offset of class 0, class stride, target).
template <typename Fn>
void ForSamples(const Tensor& scores, const Tensor& targets, Fn&& fn) {
  const Shape& s = scores.shape();
  const int64_t n = s.rank() == 1 ? 1 : s[0], classes = s.rank() == 1 ? s[0] : s[1];
  int64_t spatial = 1;
  for (int d = 2; d < s.rank(); ++d) spatial *= s[d];
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < spatial; ++k)
      fn(i * classes * spatial + k, spatial, classes, static_cast<int64_t>(targets.ScalarAt(i * spatial + k)));
}

// The cases below pick ignore_index among the drawn classes on purpose;
// make sure the draw really has both ignored and counted targets.
void RequireSomeIgnored(const Tensor& targets, int64_t ignore) {
  int64_t ignored = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) ignored += targets.ScalarAt(i) == ignore;
  INFO("targets hitting ignore_index " << ignore << ": " << ignored << " of " << targets.numel());
  REQUIRE(ignored > 0);
  REQUIRE(ignored < targets.numel());
}

// -log_softmax written out per sample, then PyTorch's label smoothing.
double CrossEntropyOf(const Tensor& logits, const Tensor& targets, const AttrMap& attrs) {
  const double eps = attrs.Float("label_smoothing");
  const int64_t ignore = attrs.Int("ignore_index");
  const std::vector<Tensor> in = {logits, targets};
  double total = 0;
  int64_t count = 0;
  ForSamples(in[0], in[1], [&](int64_t base, int64_t stride, int64_t classes, int64_t y) {
    if (y == ignore) return;
    double mx = At(in[0], base);
    for (int64_t c = 0; c < classes; ++c) mx = std::max(mx, At(in[0], base + c * stride));
    double z = 0;
    for (int64_t c = 0; c < classes; ++c) z += std::exp(At(in[0], base + c * stride) - mx);
    auto neg_log_p = [&](int64_t c) { return std::log(z) - (At(in[0], base + c * stride) - mx); };
    double smooth = 0;
    for (int64_t c = 0; c < classes; ++c) smooth += neg_log_p(c);
    total += (1 - eps) * neg_log_p(y) + eps / static_cast<double>(classes) * smooth;
    ++count;
  });
  return Reduce(total, count, attrs);
}

// Unfused (a scalar) or fused (attribute replicas: replica r's loss over
// logits row r and its targets, shared or row r).
std::vector<Tensor> CrossEntropyRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  const int64_t ignore = attrs.Int("ignore_index");
  if (ignore >= 0) RequireSomeIgnored(in[1], ignore);  // a class the case picked
  const int64_t replicas = attrs.Int("replicas", 0);
  if (replicas == 0) return {ScalarF64(CrossEntropyOf(in[0], in[1], attrs))};
  const bool shared = in[1].shape().rank() == in[0].shape().rank() - 2;
  Tensor losses = ZerosF64({replicas});
  for (int64_t r = 0; r < replicas; ++r)
    At(losses, r) = CrossEntropyOf(in[0].Row(r).value(), shared ? in[1] : in[1].Row(r).value(), attrs);
  return {losses};
}

std::vector<Tensor> NllRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  const int64_t ignore = attrs.Int("ignore_index");
  if (ignore >= 0) RequireSomeIgnored(in[1], ignore);  // a class the case picked
  double total = 0;
  int64_t count = 0;
  ForSamples(in[0], in[1], [&](int64_t base, int64_t stride, int64_t, int64_t y) {
    if (y == ignore) return;
    total -= At(in[0], base + y * stride);
    ++count;
  });
  return {ScalarF64(Reduce(total, count, attrs))};
}

std::vector<Tensor> MseRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  double total = 0;
  for (int64_t i = 0; i < in[0].numel(); ++i) total += std::pow(At(in[0], i) - At(in[1], i), 2);
  return {ScalarF64(Reduce(total, in[0].numel(), attrs))};
}

// The textbook form -[pw * t * log(sigmoid(x)) + (1 - t) * log(1 - sigmoid(x))]
// (fine in f64 for the moderate logits used here). pos_weight broadcasts
// against the trailing dims of the logits.
double BceOf(const std::vector<Tensor>& in, const AttrMap& attrs) {
  const Shape& xs = in[0].shape();
  double total = 0;
  for (int64_t i = 0; i < in[0].numel(); ++i) {
    double pw = 1;
    if (in.size() == 3) {
      const Shape& ws = in[2].shape();
      int64_t flat = i, offset = 0, stride = 1;
      for (int d = xs.rank() - 1, dw = ws.rank() - 1; d >= 0; --d, --dw) {
        const int64_t coord = flat % xs[d];
        flat /= xs[d];
        if (dw >= 0) {
          if (ws[dw] != 1) offset += coord * stride;
          stride *= ws[dw];
        }
      }
      pw = At(in[2], offset);
    }
    const double x = At(in[0], i), t = At(in[1], i), sig = 1 / (1 + std::exp(-x));
    total -= pw * t * std::log(sig) + (1 - t) * std::log(1 - sig);
  }
  return Reduce(total, in[0].numel(), attrs);
}

// Unfused (a scalar) or fused (attribute replicas: replica r's loss over
// logits row r and its targets, shared or row r; pos_weight shared).
std::vector<Tensor> BceRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  const int64_t replicas = attrs.Int("replicas", 0);
  if (replicas == 0) return {ScalarF64(BceOf(in, attrs))};
  const bool shared = in[1].shape() != in[0].shape();
  Tensor losses = ZerosF64({replicas});
  for (int64_t r = 0; r < replicas; ++r) {
    std::vector<Tensor> one = {in[0].Row(r).value(), shared ? in[1] : in[1].Row(r).value()};
    if (in.size() == 3) one.push_back(in[2]);
    At(losses, r) = BceOf(one, attrs);
  }
  return {losses};
}

std::vector<OpCase> Cases() {
  auto logits = [](Shape s) { return InputSpec::Uniform(std::move(s), -3.0, 3.0); };
  auto idx = [](Shape s, int64_t classes) { return InputSpec::Index(std::move(s), classes); };
  std::vector<OpCase> c;
  c.push_back({"ce mean", "CrossEntropy", {}, {logits({4, 5}), idx({4}, 5)}, CrossEntropyRef});
  c.push_back({"ce sum", "CrossEntropy", {{"reduction", "sum"}}, {logits({4, 5}), idx({4}, 5)}, CrossEntropyRef});
  c.push_back({"ce label smoothing", "CrossEntropy", {{"label_smoothing", 0.1}}, {logits({6, 4}), idx({6}, 4)},
               CrossEntropyRef});
  c.push_back({"ce ignore_index hit, mean", "CrossEntropy", {{"ignore_index", 0}}, {logits({10, 3}), idx({10}, 3)},
               CrossEntropyRef});
  c.push_back({"ce ignore_index hit, sum, label smoothing", "CrossEntropy",
               {{"ignore_index", 1}, {"reduction", "sum"}, {"label_smoothing", 0.25}}, {logits({10, 3}), idx({10}, 3)},
               CrossEntropyRef});
  c.push_back({"ce [N, C, L]", "CrossEntropy", {}, {logits({2, 4, 3}), idx({2, 3}, 4)}, CrossEntropyRef});
  c.push_back({"ce [N, C, H, W] smoothing and ignore", "CrossEntropy", {{"label_smoothing", 0.1}, {"ignore_index", 2}},
               {logits({2, 3, 2, 3}), idx({2, 2, 3}, 3)}, CrossEntropyRef});
  c.push_back({"ce i32 targets", "CrossEntropy", {}, {logits({5, 6}), InputSpec::Index({5}, 6, DType::kI32)},
               CrossEntropyRef});
  c.push_back({"ce one sample [C]", "CrossEntropy", {{"label_smoothing", 0.2}}, {logits({7}), idx({}, 7)},
               CrossEntropyRef});
  c.push_back({"ce large (threaded)", "CrossEntropy", {{"label_smoothing", 0.05}}, {logits({700, 100}), idx({700}, 100)},
               CrossEntropyRef});
  // The CUDA row kernels pick a group per row by C: 8 threads (C <= 128), a
  // warp (C <= 4096) or the whole block; [N, C, d...] takes a thread per sample.
  c.push_back({"ce wide rows, label smoothing", "CrossEntropy", {{"label_smoothing", 0.1}},
               {logits({3, 5000}), idx({3}, 5000)}, CrossEntropyRef});
  c.push_back({"ce mid rows, sum", "CrossEntropy", {{"reduction", "sum"}}, {logits({33, 300}), idx({33}, 300)},
               CrossEntropyRef});
  c.push_back({"ce [N, C, H, W] many samples, ignore_index", "CrossEntropy", {{"ignore_index", 3}},
               {logits({4, 10, 30, 20}), idx({4, 30, 20}, 10)}, CrossEntropyRef});
  // Fused (horizontal fusion): R replicas' losses [R], dy [R].
  c.push_back({"ce fused, shared targets, label smoothing", "CrossEntropy",
               {{"replicas", int64_t{3}}, {"label_smoothing", 0.1}}, {logits({3, 6, 5}), idx({6}, 5)}, CrossEntropyRef});
  c.push_back({"ce fused, per-replica targets, sum, ignore_index hit", "CrossEntropy",
               {{"replicas", int64_t{2}}, {"reduction", "sum"}, {"ignore_index", 0}},
               {logits({2, 10, 3}), idx({2, 10}, 3)}, CrossEntropyRef});
  c.push_back({"ce fused, per-replica targets, mean, ignore_index hit", "CrossEntropy",
               {{"replicas", int64_t{2}}, {"ignore_index", 1}}, {logits({2, 12, 3}), idx({2, 12}, 3)},
               CrossEntropyRef});
  c.push_back({"ce fused [R, N, C, L], per-replica i32 targets", "CrossEntropy", {{"replicas", int64_t{2}}},
               {logits({2, 2, 4, 3}), InputSpec::Index({2, 2, 3}, 4, DType::kI32)}, CrossEntropyRef});
  c.push_back({"ce fused, one sample each [R, C]", "CrossEntropy", {{"replicas", int64_t{3}}},
               {logits({3, 7}), idx({}, 7)}, CrossEntropyRef});
  c.push_back({"ce fused large (threaded)", "CrossEntropy", {{"replicas", int64_t{4}}, {"label_smoothing", 0.05}},
               {logits({4, 300, 50}), idx({300}, 50)}, CrossEntropyRef});

  c.push_back({"nll mean", "NLL", {}, {logits({5, 4}), idx({5}, 4)}, NllRef});
  c.push_back({"nll sum ignore_index hit", "NLL", {{"reduction", "sum"}, {"ignore_index", 0}},
               {logits({10, 3}), idx({10}, 3)}, NllRef});
  c.push_back({"nll mean ignore_index hit", "NLL", {{"ignore_index", 0}}, {logits({10, 3}), idx({10}, 3)}, NllRef});
  c.push_back({"nll [N, C, L] i32", "NLL", {}, {logits({2, 4, 3}), InputSpec::Index({2, 3}, 4, DType::kI32)}, NllRef});
  c.push_back({"nll [N, C, L] many samples, i32, sum, ignore_index", "NLL", {{"reduction", "sum"}, {"ignore_index", 2}},
               {logits({3, 7, 500}), InputSpec::Index({3, 500}, 7, DType::kI32)}, NllRef});
  c.push_back({"nll many rows", "NLL", {}, {logits({3000, 5}), idx({3000}, 5)}, NllRef});

  c.push_back({"mse mean", "MSE", {}, {InputSpec::Uniform({3, 4}), InputSpec::Uniform({3, 4})}, MseRef});
  c.push_back({"mse sum", "MSE", {{"reduction", "sum"}}, {InputSpec::Uniform({5}), InputSpec::Uniform({5})}, MseRef});
  c.push_back({"mse scalar", "MSE", {}, {InputSpec::Uniform({}), InputSpec::Uniform({})}, MseRef});
  c.push_back({"mse odd size", "MSE", {}, {InputSpec::Uniform({1001, 3}), InputSpec::Uniform({1001, 3})}, MseRef});
  c.push_back({"mse large (threaded)", "MSE", {}, {InputSpec::Uniform({300, 250}), InputSpec::Uniform({300, 250})}, MseRef});

  auto wide = [](Shape s) { return InputSpec::Uniform(std::move(s), -6.0, 6.0); };
  auto prob = [](Shape s) { return InputSpec::Uniform(std::move(s), 0.0, 1.0); };
  c.push_back({"bce mean", "BCEWithLogits", {}, {wide({4, 3}), prob({4, 3})}, BceRef});
  c.push_back({"bce sum", "BCEWithLogits", {{"reduction", "sum"}}, {wide({2, 5}), prob({2, 5})}, BceRef});
  c.push_back({"bce pos_weight [C]", "BCEWithLogits", {}, {wide({4, 3}), prob({4, 3}), InputSpec::Uniform({3}, 0.5, 3.0)},
               BceRef});
  c.push_back({"bce pos_weight broadcast [C, 1]", "BCEWithLogits", {{"reduction", "sum"}},
               {wide({2, 3, 4}), prob({2, 3, 4}), InputSpec::Uniform({3, 1}, 0.5, 3.0)}, BceRef});
  c.push_back({"bce scalar", "BCEWithLogits", {}, {wide({}), prob({})}, BceRef});
  c.push_back({"bce large (threaded) with pos_weight", "BCEWithLogits", {},
               {wide({300, 40}), prob({300, 40}), InputSpec::Uniform({40}, 0.5, 3.0)}, BceRef});
  c.push_back({"bce pos_weight [C, 1] many elements", "BCEWithLogits", {},
               {wide({8, 16, 33}), prob({8, 16, 33}), InputSpec::Uniform({16, 1}, 0.5, 3.0)}, BceRef});
  // Fused: R replicas' losses [R], dy [R]; targets shared or per replica.
  c.push_back({"bce fused, shared targets", "BCEWithLogits", {{"replicas", int64_t{3}}},
               {wide({3, 4, 5}), prob({4, 5})}, BceRef});
  c.push_back({"bce fused, per-replica targets, sum, pos_weight [C]", "BCEWithLogits",
               {{"replicas", int64_t{2}}, {"reduction", "sum"}},
               {wide({2, 4, 3}), prob({2, 4, 3}), InputSpec::Uniform({3}, 0.5, 3.0)}, BceRef});
  c.push_back({"bce fused, one element each", "BCEWithLogits", {{"replicas", int64_t{3}}}, {wide({3}), prob({})},
               BceRef});
  c.push_back({"bce fused large (threaded), pos_weight [C, 1]", "BCEWithLogits", {{"replicas", int64_t{4}}},
               {wide({4, 60, 16, 9}), prob({4, 60, 16, 9}), InputSpec::Uniform({16, 1}, 0.5, 3.0)}, BceRef});
  return c;
}

TEST_CASE("loss ops pass the op harness") {
  for (const OpCase& c : Cases()) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

TEST_CASE("losses reject mismatched inputs and bad attributes with clear messages") {
  using Catch::Matchers::Contains;
  const TensorType logits{{4, 3}, DType::kF32};
  const TensorType targets{{4}, DType::kI64};
  CHECK_THAT(InferError("CrossEntropy", {}, {logits, TensorType{{5}, DType::kI64}}),
             Contains("targets [5] do not match logits [4, 3]") && Contains("expected targets [4]"));
  CHECK_THAT(InferError("CrossEntropy", {}, {TensorType{{2, 4, 3}, DType::kF32}, TensorType{{2, 4}, DType::kI64}}),
             Contains("expected targets [2, 3]"));
  CHECK_THAT(InferError("CrossEntropy", {}, {logits, TensorType{{4}, DType::kF32}}),
             Contains("targets must be integer class indices (i32 or i64), got f32"));
  CHECK_THAT(InferError("CrossEntropy", {{"label_smoothing", 1.5}}, {logits, targets}),
             Contains("'label_smoothing' must be in [0, 1], got 1.5"));
  CHECK_THAT(InferError("CrossEntropy", {{"reduction", "none"}}, {logits, targets}),
             Contains("'reduction' must be \"mean\" or \"sum\", got \"none\""));
  CHECK_THAT(InferError("CrossEntropy", {}, {TensorType{{4, 0}, DType::kF32}, targets}), Contains("no classes"));
  CHECK_THAT(InferError("NLL", {}, {logits, TensorType{{4, 1}, DType::kI64}}),
             Contains("targets [4, 1] do not match log_probs [4, 3]"));
  CHECK_THAT(InferError("MSE", {}, {TensorType{{2, 3}, DType::kF32}, TensorType{{3, 2}, DType::kF32}}),
             Contains("MSE: prediction and target differ: [2, 3] f32 vs [3, 2] f32"));
  CHECK_THAT(InferError("BCEWithLogits", {}, {logits, logits, TensorType{{5}, DType::kF32}}),
             Contains("pos_weight [5] does not broadcast to logits [4, 3]"));
  CHECK_THAT(InferError("BCEWithLogits", {}, {logits, TensorType{{4, 3}, DType::kF64}}),
             Contains("logits and targets differ"));
  CHECK_THAT(InferError("CrossEntropyBackward", {}, {logits, targets, TensorType{{1}, DType::kF32}}),
             Contains("dy must be [] f32 (the loss's type), got [1] f32"));
  // Fused: the scores' leading axis holds the replicas; targets are one
  // replica's or stacked.
  const AttrMap fused{{"replicas", int64_t{4}}};
  CHECK_THAT(InferError("CrossEntropy", {{"replicas", int64_t{3}}}, {logits, targets}),
             Contains("replicas = 3 needs logits [3, ...], got [4, 3]"));
  CHECK_THAT(InferError("CrossEntropy", fused, {TensorType{{4, 2, 3}, DType::kF32}, TensorType{{3, 2}, DType::kI64}}),
             Contains("per-replica targets must be [4, ...], got [3, 2]"));
  CHECK_THAT(InferError("CrossEntropy", fused, {TensorType{{4, 2, 3}, DType::kF32}, TensorType{{3}, DType::kI64}}),
             Contains("targets [3] do not match logits [2, 3]"));
  CHECK_THAT(InferError("CrossEntropy", {{"replicas", int64_t{-1}}}, {logits, targets}),
             Contains("replicas must be >= 1"));
  CHECK_THAT(InferError("CrossEntropyBackward", fused,
                        {TensorType{{4, 2, 3}, DType::kF32}, TensorType{{2}, DType::kI64}, TensorType{{}, DType::kF32}}),
             Contains("dy must be [4] f32 (the loss's type), got [] f32"));
  CHECK_THAT(InferError("CountTargets", {{"classes", int64_t{3}}, {"replicas", int64_t{2}}}, {targets}),
             Contains("replicas = 2 needs targets [2, ...], got [4]"));
  const TensorType stacked{{4, 2, 3}, DType::kF32}, one{{2, 3}, DType::kF32};
  CHECK_THAT(InferError("BCEWithLogits", {{"replicas", int64_t{3}}}, {stacked, stacked}),
             Contains("replicas = 3 needs logits [3, ...], got [4, 2, 3]"));
  CHECK_THAT(InferError("BCEWithLogits", fused, {stacked, TensorType{{4, 3}, DType::kF32}}),
             Contains("targets [4, 3] f32 must be f32 [2, 3] (shared) or [4, 2, 3] (per replica)"));
  CHECK_THAT(InferError("BCEWithLogits", fused, {stacked, one, TensorType{{2}, DType::kF32}}),
             Contains("pos_weight [2] does not broadcast to one replica's logits [2, 3]"));
  CHECK_THAT(InferError("BCEWithLogitsBackward", fused, {TensorType{{}, DType::kF32}, stacked, one}),
             Contains("dy must be [4] f32 (the loss's type), got [] f32"));
}

// Builds loss = op(inputs) and its gradient with respect to input 0.
struct LossRun {
  Status status;
  double loss = 0;
  std::vector<double> grad;
};

LossRun RunLoss(const std::string& op, const AttrMap& attrs, const std::vector<Tensor>& ins) {
  Graph graph;
  GraphBuilder b(&graph);
  std::vector<ValueId> vs;
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < ins.size(); ++i) {
    const std::string name = "in" + std::to_string(i);
    vs.push_back(b.Input(name, {ins[i].shape(), ins[i].dtype()}));
    feeds[name] = ins[i];
  }
  ValueId loss = b.Add1(op, vs, attrs, "loss").value();
  auto grads = BuildGradients(&graph, loss, {vs[0]});
  REQUIRE(grads.ok());
  graph.outputs()["loss"] = loss;
  graph.outputs()["grad"] = grads->at(vs[0]);
  auto exec = Executor::Create(graph);
  REQUIRE(exec.ok());
  auto r = (*exec)->Run(feeds);
  LossRun out;
  out.status = r.status();
  if (r.ok()) {
    out.loss = (*r)["loss"].ScalarAt(0);
    out.grad = (*r)["grad"].ToDoubleVector();
  }
  return out;
}

TEST_CASE("CrossEntropy rejects out-of-range targets in the kernel, naming the position") {
  using Catch::Matchers::Contains;
  Tensor x = Tensor::Zeros({3, 5});
  LossRun r = RunLoss("CrossEntropy", {}, {x, Tensor::FromVector<int64_t>({3}, {0, 7, 1})});
  CHECK(r.status.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(r.status.message(), Contains("target 7 at position [1] is out of range for 5 classes"));
  r = RunLoss("CrossEntropy", {}, {Tensor::Zeros({2, 5, 3}), Tensor::FromVector<int32_t>({2, 3}, {0, 1, 2, 3, 4, -1})});
  CHECK_THAT(r.status.message(), Contains("target -1 at position [1, 2] is out of range"));
  // ignore_index itself is fine even though it is not a class.
  r = RunLoss("CrossEntropy", {}, {x, Tensor::FromVector<int64_t>({3}, {0, -100, 1})});
  CHECK(r.status.ok());
}

// loss = sum_r w_r * CrossEntropy(...)_r over a fused op (dy = w), or
// w * CrossEntropy(...) for one replica: the loss and d loss / d logits.
struct WeightedLossRun {
  Tensor loss, grad;
};
WeightedLossRun RunWeightedLoss(const std::string& op, const AttrMap& attrs, const Tensor& logits,
                                const Tensor& targets, const Tensor& w) {
  Graph graph;
  GraphBuilder b(&graph);
  const ValueId x = b.Input("x", {logits.shape(), logits.dtype()});
  const ValueId t = b.Input("t", {targets.shape(), targets.dtype()});
  const ValueId wv = b.Input("w", {w.shape(), w.dtype()});
  const ValueId loss = b.Add1(op, {x, t}, attrs, "loss").value();
  const ValueId total = b.Add1("ReduceSum", {b.Add1("Mul", {loss, wv}, {}, "weighted").value()}, {}, "total").value();
  auto grads = BuildGradients(&graph, total, {x});
  REQUIRE(grads.ok());
  graph.outputs()["loss"] = loss;
  graph.outputs()["grad"] = grads->at(x);
  auto exec = Executor::Create(graph);
  REQUIRE(exec.ok());
  auto r = (*exec)->Run({{"x", logits}, {"t", targets}, {"w", w}});
  REQUIRE(r.status().ToString() == "OK");
  return {(*r)["loss"], (*r)["grad"]};
}

// Horizontal fusion claims each replica computes exactly what it would
// alone: the fused op's loss and gradient rows are the unfused op's bits,
// in f32 and in f64 (whose loss shows the order of the sums' last bits).
TEST_CASE("a fused CrossEntropy gives each replica the unfused op's bits") {
  const int64_t R = 3;
  Rng rng(7);
  auto uniform = [&](const Shape& s, DType dtype) {
    std::vector<double> v(static_cast<size_t>(s.numel()));
    for (double& x : v) x = rng.Uniform(-4, 4);
    return Tensor::FromVector<double>(s, v).Cast(dtype).value();
  };
  auto classes = [&](const Shape& s, int64_t c) {
    std::vector<int64_t> v(static_cast<size_t>(s.numel()));
    for (int64_t& x : v) x = rng.UniformInt(c);
    return Tensor::FromVector<int64_t>(s, v);
  };
  for (DType dtype : {DType::kF32, DType::kF64}) {
    for (bool shared : {true, false}) {
      for (const AttrMap& attrs : {AttrMap{}, AttrMap{{"label_smoothing", 0.1}, {"ignore_index", 2}}}) {
        INFO(DTypeName(dtype) << ", " << (shared ? "shared" : "per-replica") << " targets, label_smoothing "
                              << attrs.Float("label_smoothing", 0));
        // 700 rows of 100 classes: the sums run in several blocks on the pool.
        const Tensor logits = uniform({R, 700, 100}, dtype);
        const Tensor targets = shared ? classes({700}, 100) : classes({R, 700}, 100);
        const Tensor w = uniform({R}, dtype);
        AttrMap fused_attrs = attrs;
        fused_attrs.Set("replicas", R);
        const WeightedLossRun fused = RunWeightedLoss("CrossEntropy", fused_attrs, logits, targets, w);
        for (int64_t r = 0; r < R; ++r) {
          const WeightedLossRun alone =
              RunWeightedLoss("CrossEntropy", attrs, logits.Row(r).value(), shared ? targets : targets.Row(r).value(),
                              w.Reshape({R, 1}).value().Row(r).value().Reshape({}).value());
          CheckBitwiseEqual("loss of replica " + std::to_string(r), alone.loss.Reshape({1}).value(),
                            fused.loss.Reshape({R, 1}).value().Row(r).value());
          CheckBitwiseEqual("gradient of replica " + std::to_string(r), alone.grad, fused.grad.Row(r).value());
        }
      }
    }
  }
}

// The same for BCEWithLogits: each replica's loss and logits gradient are
// the unfused op's bits (its sum's blocks and their order).
TEST_CASE("a fused BCEWithLogits gives each replica the unfused op's bits") {
  const int64_t R = 3;
  Rng rng(9);
  auto uniform = [&](const Shape& s, DType dtype, double lo, double hi) {
    std::vector<double> v(static_cast<size_t>(s.numel()));
    for (double& x : v) x = rng.Uniform(lo, hi);
    return Tensor::FromVector<double>(s, v).Cast(dtype).value();
  };
  for (DType dtype : {DType::kF32, DType::kF64}) {
    for (bool shared : {true, false}) {
      for (const AttrMap& attrs : {AttrMap{}, AttrMap{{"reduction", "sum"}}}) {
        INFO(DTypeName(dtype) << ", " << (shared ? "shared" : "per-replica") << " targets, reduction "
                              << attrs.Str("reduction", "mean"));
        // 900 rows of 40: the sums run in several blocks on the pool.
        const Tensor logits = uniform({R, 900, 40}, dtype, -6, 6);
        const Tensor targets = shared ? uniform({900, 40}, dtype, 0, 1) : uniform({R, 900, 40}, dtype, 0, 1);
        const Tensor w = uniform({R}, dtype, -1, 1);
        AttrMap fused_attrs = attrs;
        fused_attrs.Set("replicas", R);
        const WeightedLossRun fused = RunWeightedLoss("BCEWithLogits", fused_attrs, logits, targets, w);
        for (int64_t r = 0; r < R; ++r) {
          const WeightedLossRun alone =
              RunWeightedLoss("BCEWithLogits", attrs, logits.Row(r).value(), shared ? targets : targets.Row(r).value(),
                              w.Reshape({R, 1}).value().Row(r).value().Reshape({}).value());
          CheckBitwiseEqual("loss of replica " + std::to_string(r), alone.loss.Reshape({1}).value(),
                            fused.loss.Reshape({R, 1}).value().Row(r).value());
          CheckBitwiseEqual("gradient of replica " + std::to_string(r), alone.grad, fused.grad.Row(r).value());
        }
      }
    }
  }
}

TEST_CASE("a fused CrossEntropy names a bad target's position in the stacked targets") {
  using Catch::Matchers::Contains;
  Graph graph;
  GraphBuilder b(&graph);
  const ValueId x = b.Input("x", {{2, 3, 4}, DType::kF32});
  const ValueId t = b.Input("t", {{2, 3}, DType::kI64});
  graph.outputs()["loss"] = b.Add1("CrossEntropy", {x, t}, {{"replicas", int64_t{2}}}, "loss").value();
  auto exec = Executor::Create(graph);
  REQUIRE(exec.ok());
  auto r = (*exec)->Run({{"x", Tensor::Zeros({2, 3, 4})}, {"t", Tensor::FromVector<int64_t>({2, 3}, {0, 1, 2, 3, 9, 0})}});
  CHECK_THAT(r.status().ToString(), Contains("target 9 at position [1, 1] is out of range for 4 classes"));
}

TEST_CASE("CrossEntropy matches PyTorch on hand-worked values") {
  // log_softmax([1, 2, 3]) = [1, 2, 3] - 3.40760596; label_smoothing 0.2:
  // 0.8 * 2.40760596 + 0.2 * (2.40760596 + 1.40760596 + 0.40760596) / 3.
  Tensor x = Tensor::FromVector<double>({1, 3}, {1, 2, 3});
  LossRun r = RunLoss("CrossEntropy", {{"label_smoothing", 0.2}}, {x, Tensor::FromVector<int64_t>({1}, {0})});
  REQUIRE(r.status.ok());
  CHECK(r.loss == Approx(0.8 * 2.40760596 + 0.2 * 1.40760596).epsilon(1e-8));
  // Gradient: softmax - 0.2 / 3 - 0.8 * onehot.
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  CHECK(r.grad[0] == Approx(std::exp(1.0) / z - 0.2 / 3 - 0.8));
  CHECK(r.grad[2] == Approx(std::exp(3.0) / z - 0.2 / 3));
}

TEST_CASE("CrossEntropy with every target ignored") {
  Tensor x = Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor t = Tensor::FromVector<int64_t>({2}, {-100, -100});
  LossRun mean = RunLoss("CrossEntropy", {}, {x, t});
  REQUIRE(mean.status.ok());
  CHECK(std::isnan(mean.loss));  // 0 / 0, as PyTorch
  for (double g : mean.grad) CHECK(g == 0);
  LossRun sum = RunLoss("CrossEntropy", {{"reduction", "sum"}}, {x, t});
  CHECK(sum.loss == 0);
}

TEST_CASE("CrossEntropy and BCEWithLogits stay finite for extreme logits") {
  Tensor x = Tensor::FromVector<float>({2, 2}, {1000, -1000, -1000, 1000});
  LossRun ce = RunLoss("CrossEntropy", {}, {x, Tensor::FromVector<int64_t>({2}, {1, 1})});
  CHECK(ce.loss == Approx(1000.0));  // one sample is off by 2000, the other right: mean 1000
  CHECK(ce.grad == std::vector<double>{0.5, -0.5, 0, 0});
  LossRun bce = RunLoss("BCEWithLogits", {}, {x, Tensor::FromVector<float>({2, 2}, {0, 1, 0, 1})});
  CHECK(bce.loss == Approx(500.0));  // two of the four elements are wrong by a margin of 1000
  for (double g : bce.grad) CHECK(std::isfinite(g));
}

}  // namespace
}  // namespace loom::testing
