// Optimizer updates and gradient clipping built by BuildTrainingGraph against
// hand-written torch.optim / clip_grad_norm_ updates for a few steps, in f64
// (and f32 with a looser tolerance); the clipping ops on their own; errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "graph/builder.h"
#include "graph/model.h"
#include "graph/training.h"
#include "ops/op.h"
#include "runtime/executor.h"

namespace loom {
namespace {

constexpr int kSteps = 4;

// loss = sum(w * p^2) / 2 + sum(u * q^2) / 2 with fixed w, u: the gradients
// are w * p and u * q, so they change every step and every optimizer state is
// exercised; two parameters make the clipping norm a global one. Flattened,
// the parameters are x = [p, q] with coefficients c = [w, u].
struct Problem {
  std::vector<double> p0 = {0.5, -1.0, 2.0}, w = {1.0, 0.5, -0.25};
  std::vector<double> q0 = {1.5, -2.0}, u = {2.0, 0.25};
};

Tensor MakeTensor(DType dtype, const Shape& shape, const std::vector<double>& v) {
  if (dtype == DType::kF64) return Tensor::FromVector<double>(shape, v);
  return Tensor::FromVector<float>(shape, std::vector<float>(v.begin(), v.end()));
}

Graph ProblemGraph(DType dtype) {
  Model m(dtype);
  Sym p = m.parameter("p", {3}, InitZeros());
  Sym q = m.parameter("q", {2}, InitZeros());
  Sym lp = m.scale(m.sum(m.mul(m.mul(p, p), m.input("w", {3}))), 0.5);
  Sym lq = m.scale(m.sum(m.mul(m.mul(q, q), m.input("u", {2}))), 0.5);
  m.set_output("loss", m.add(lp, lq));
  REQUIRE(m.status().ok());
  return m.graph();
}

struct LoomRun {
  std::vector<double> x;          // [p, q] after the steps
  std::vector<double> grad_norm;  // per step, when the graph outputs it
  // Optimizer state after the steps by torch's name, [p's, q's] flattened.
  std::map<std::string, std::vector<double>> slots;
};

std::unique_ptr<Executor> MakeExecutor(const OptimizerConfig& opt, DType dtype, const Problem& pr) {
  auto train = BuildTrainingGraph(ProblemGraph(dtype), "loss", opt);
  REQUIRE(train.status().ToString() == "OK");
  auto exec = Executor::Create(*train);
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(0).ok());
  REQUIRE((*exec)->SetState("p", MakeTensor(dtype, {3}, pr.p0)).ok());
  REQUIRE((*exec)->SetState("q", MakeTensor(dtype, {2}, pr.q0)).ok());
  return std::move(exec).value();
}

LoomRun RunLoom(const OptimizerConfig& opt, const Problem& pr, double lr, DType dtype = DType::kF64) {
  auto exec = MakeExecutor(opt, dtype, pr);
  LoomRun r;
  for (int s = 1; s <= kSteps; ++s) {
    auto out = exec->Run({{"w", MakeTensor(dtype, {3}, pr.w)},
                          {"u", MakeTensor(dtype, {2}, pr.u)},
                          {"lr", MakeTensor(dtype, {}, {lr})},
                          {"step", MakeTensor(dtype, {}, {static_cast<double>(s)})}});
    REQUIRE(out.ok());
    if (out->count(kGradNormOutput)) r.grad_norm.push_back(out->at(kGradNormOutput).ScalarAt(0));
  }
  // State names are "p" and "q", then "p/<slot>" and "q/<slot>" (in order).
  for (const auto& [name, t] : exec->state()) {
    std::vector<double>& dst = name.size() == 1 ? r.x : r.slots[name.substr(2)];
    for (double v : t.ToDoubleVector()) dst.push_back(v);
  }
  return r;
}

// torch.optim's algorithms (the pseudo-code of its documentation), one
// element at a time, with clip_grad_norm_ over all gradients first.
LoomRun RunReference(const OptimizerConfig& o, const Problem& pr, double lr) {
  std::vector<double> x = pr.p0, c = pr.w;
  x.insert(x.end(), pr.q0.begin(), pr.q0.end());
  c.insert(c.end(), pr.u.begin(), pr.u.end());
  const size_t n = x.size();
  std::vector<double> buf(n, 0), m(n, 0), v(n, 0), vmax(n, 0), sq(n, 0), acc(n, 0), gavg(n, 0);
  const double wd = o.EffectiveWeightDecay(), eps = o.EffectiveEps();
  LoomRun r;
  for (int t = 1; t <= kSteps; ++t) {
    std::vector<double> grad(n);
    double sumsq = 0;
    for (size_t i = 0; i < n; ++i) {
      grad[i] = c[i] * x[i];
      sumsq += grad[i] * grad[i];
    }
    r.grad_norm.push_back(std::sqrt(sumsq));
    const double coef = o.max_grad_norm / (std::sqrt(sumsq) + 1e-6);
    if (o.max_grad_norm > 0 && coef < 1)
      for (double& g : grad) g *= coef;
    for (size_t i = 0; i < n; ++i) {
      double g = grad[i];
      if (o.type == "sgd") {
        g += wd * x[i];
        if (o.momentum != 0) {
          buf[i] = t == 1 ? g : o.momentum * buf[i] + (1 - o.dampening) * g;  // torch: first buf = grad
          g = o.nesterov ? g + o.momentum * buf[i] : buf[i];
        }
        x[i] -= lr * g;
      } else if (o.type == "adam" || o.type == "adamw") {
        if (o.type == "adamw") x[i] *= 1 - lr * wd;
        else g += wd * x[i];
        m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
        v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
        vmax[i] = std::max(vmax[i], v[i]);
        double mhat = m[i] / (1 - std::pow(o.beta1, t));
        double vhat = (o.amsgrad ? vmax[i] : v[i]) / (1 - std::pow(o.beta2, t));
        x[i] -= lr * mhat / (std::sqrt(vhat) + eps);
      } else if (o.type == "adadelta") {
        g += wd * x[i];
        sq[i] = o.rho * sq[i] + (1 - o.rho) * g * g;
        double delta = std::sqrt(acc[i] + eps) / std::sqrt(sq[i] + eps) * g;
        acc[i] = o.rho * acc[i] + (1 - o.rho) * delta * delta;
        x[i] -= lr * delta;
      } else if (o.type == "rmsprop") {
        g += wd * x[i];
        sq[i] = o.alpha * sq[i] + (1 - o.alpha) * g * g;
        double var = sq[i];
        if (o.centered) {
          gavg[i] = o.alpha * gavg[i] + (1 - o.alpha) * g;
          var -= gavg[i] * gavg[i];
        }
        double avg = std::sqrt(var) + eps;
        if (o.momentum > 0) {
          buf[i] = o.momentum * buf[i] + g / avg;
          x[i] -= lr * buf[i];
        } else {
          x[i] -= lr * g / avg;
        }
      } else {
        FAIL("no reference for " << o.type);
      }
    }
  }
  r.x = x;
  r.slots = {{"momentum_buffer", buf}, {"exp_avg", m},     {"exp_avg_sq", v}, {"max_exp_avg_sq", vmax},
             {"square_avg", sq},       {"acc_delta", acc}, {"grad_avg", gavg}};
  return r;
}

std::vector<double> Initial(const Problem& pr) {
  std::vector<double> x = pr.p0;
  x.insert(x.end(), pr.q0.begin(), pr.q0.end());
  return x;
}

// Parameters and every optimizer state slot, f64 to 1e-12 relative and f32
// to 1e-5 (which also covers the f32 kernels).
void Compare(const OptimizerConfig& o, double lr) {
  Problem pr;
  const LoomRun want = RunReference(o, pr, lr), got = RunLoom(o, pr, lr), got32 = RunLoom(o, pr, lr, DType::kF32);
  const std::vector<double> x0 = Initial(pr);
  for (size_t i = 0; i < want.x.size(); ++i) {
    INFO(o.type << " element " << i);
    CHECK(got.x[i] == Approx(want.x[i]).epsilon(1e-12));
    CHECK(got32.x[i] == Approx(want.x[i]).epsilon(1e-5).margin(1e-6));
    CHECK(got.x[i] != Approx(x0[i]));  // it moved
  }
  for (const auto& [slot, values] : got.slots) {
    INFO(o.type << " state " << slot);
    REQUIRE(want.slots.count(slot));
    for (size_t i = 0; i < values.size(); ++i) CHECK(values[i] == Approx(want.slots.at(slot)[i]).epsilon(1e-12));
  }
}

// Optimizer state names in the training step's executor.
std::vector<std::string> StateNames(const OptimizerConfig& o) {
  auto exec = MakeExecutor(o, DType::kF64, Problem{});
  std::vector<std::string> names;
  for (const auto& [name, t] : exec->state()) {
    names.push_back(name);
    if (name != "p" && name != "q") {
      INFO(name << " starts at zero");
      for (double v : t.ToDoubleVector()) CHECK(v == 0);
    }
  }
  return names;
}

TEST_CASE("SGD matches torch.optim.SGD for a few steps") {
  OptimizerConfig o;
  Compare(o, 0.1);
  o.momentum = 0.9;
  Compare(o, 0.1);
  o.weight_decay = 0.05;
  Compare(o, 0.1);
  o.nesterov = true;
  Compare(o, 0.1);
  o.nesterov = false;
  o.dampening = 0.3;
  Compare(o, 0.1);
}

TEST_CASE("Adam and AdamW match torch.optim for a few steps") {
  OptimizerConfig o;
  o.type = "adam";
  Compare(o, 0.01);
  o.weight_decay = 0.1;
  Compare(o, 0.01);
  o.type = "adamw";
  Compare(o, 0.01);
  o.amsgrad = true;
  Compare(o, 0.01);
  o.type = "adam";
  o.beta1 = 0.5;
  o.beta2 = 0.9;
  o.eps = 1e-3;
  Compare(o, 0.01);
}

TEST_CASE("AMSGrad keeps the running maximum of the second moment") {
  // With a gradient that shrinks step by step, v falls and the maximum keeps
  // the step small: the amsgrad run moves less than plain Adam.
  OptimizerConfig o;
  o.type = "adam";
  o.beta2 = 0.5;
  Problem pr;
  pr.w = {4.0, 4.0, 4.0};
  double plain = RunLoom(o, pr, 0.1).x[0];
  o.amsgrad = true;
  double ams = RunLoom(o, pr, 0.1).x[0];
  CHECK(ams == Approx(RunReference(o, pr, 0.1).x[0]).epsilon(1e-12));
  CHECK(std::abs(ams - pr.p0[0]) < std::abs(plain - pr.p0[0]));
}

TEST_CASE("Adadelta matches torch.optim.Adadelta for a few steps") {
  OptimizerConfig o;
  o.type = "adadelta";
  Compare(o, 1.0);  // torch's default lr, rho 0.9, eps 1e-6
  o.weight_decay = 0.1;
  Compare(o, 1.0);
  o.rho = 0.5;
  o.eps = 1e-4;
  Compare(o, 0.5);
}

TEST_CASE("RMSprop matches torch.optim.RMSprop for a few steps") {
  OptimizerConfig o;
  o.type = "rmsprop";
  Compare(o, 0.01);
  o.alpha = 0.9;
  o.weight_decay = 0.05;
  Compare(o, 0.01);
  o.momentum = 0.8;
  Compare(o, 0.01);
  o.centered = true;
  Compare(o, 0.01);
  o.momentum = 0;
  Compare(o, 0.01);
}

TEST_CASE("torch's per-optimizer defaults apply when eps and weight decay are unset") {
  OptimizerConfig o;
  o.type = "adadelta";
  CHECK(o.EffectiveEps() == 1e-6);
  o.type = "rmsprop";
  CHECK(o.EffectiveEps() == 1e-8);
  CHECK(o.EffectiveWeightDecay() == 0);
  o.type = "adamw";
  CHECK(o.EffectiveWeightDecay() == 0.01);
  o.weight_decay = 0.0;
  CHECK(o.EffectiveWeightDecay() == 0);  // set explicitly: no decay
  o.eps = 1e-3;
  CHECK(o.EffectiveEps() == 1e-3);
  // Unset weight decay on AdamW decays (torch's 0.01): it differs from 0.
  OptimizerConfig unset, none;
  unset.type = none.type = "adamw";
  none.weight_decay = 0.0;
  Compare(unset, 0.01);
  Problem pr;
  CHECK(RunLoom(unset, pr, 0.01).x[0] != Approx(RunLoom(none, pr, 0.01).x[0]).epsilon(1e-9));

  CHECK(*DefaultLearningRate("sgd") == 1e-3);
  CHECK(*DefaultLearningRate("adam") == 1e-3);
  CHECK(*DefaultLearningRate("adamw") == 1e-3);
  CHECK(*DefaultLearningRate("adadelta") == 1.0);
  CHECK(*DefaultLearningRate("rmsprop") == 1e-2);
  auto bad = DefaultLearningRate("adagrad");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("unknown optimizer 'adagrad'") != std::string::npos);
}

TEST_CASE("optimizer state is one zeroed buffer per parameter and torch state name") {
  using V = std::vector<std::string>;
  OptimizerConfig o;
  CHECK(StateNames(o) == V{"p", "q"});  // plain SGD keeps no buffer
  o.momentum = 0.9;
  CHECK(StateNames(o) == V{"p", "p/momentum_buffer", "q", "q/momentum_buffer"});
  o = OptimizerConfig();
  o.type = "adamw";
  o.amsgrad = true;
  CHECK(StateNames(o) == V{"p", "p/exp_avg", "p/exp_avg_sq", "p/max_exp_avg_sq", "q", "q/exp_avg", "q/exp_avg_sq",
                           "q/max_exp_avg_sq"});
  o = OptimizerConfig();
  o.type = "adadelta";
  CHECK(StateNames(o) == V{"p", "p/acc_delta", "p/square_avg", "q", "q/acc_delta", "q/square_avg"});
  o.type = "rmsprop";
  CHECK(StateNames(o) == V{"p", "p/square_avg", "q", "q/square_avg"});
  o.momentum = 0.5;
  o.centered = true;
  CHECK(StateNames(o) == V{"p", "p/grad_avg", "p/momentum_buffer", "p/square_avg", "q", "q/grad_avg",
                           "q/momentum_buffer", "q/square_avg"});
}

// Step 1 by hand: g = [0.5, -0.5, -0.5, 3, -0.5], |g| = sqrt(10).
TEST_CASE("clipping by global norm scales every gradient when the norm is too large") {
  OptimizerConfig o;
  o.max_grad_norm = 1.0;
  Problem pr;
  LoomRun one = [&] {
    auto exec = MakeExecutor(o, DType::kF64, pr);
    auto out = exec->Run({{"w", MakeTensor(DType::kF64, {3}, pr.w)},
                          {"u", MakeTensor(DType::kF64, {2}, pr.u)},
                          {"lr", MakeTensor(DType::kF64, {}, {0.1})},
                          {"step", MakeTensor(DType::kF64, {}, {1.0})}});
    REQUIRE(out.ok());
    LoomRun r;
    r.grad_norm = {out->at("grad_norm").ScalarAt(0)};
    r.x = exec->GetState("p")->ToDoubleVector();
    for (double v : exec->GetState("q")->ToDoubleVector()) r.x.push_back(v);
    return r;
  }();
  CHECK(one.grad_norm[0] == Approx(std::sqrt(10.0)).epsilon(1e-14));  // the unclipped norm
  const double coef = 1.0 / (std::sqrt(10.0) + 1e-6);
  const std::vector<double> g = {0.5, -0.5, -0.5, 3.0, -0.5}, x0 = Initial(pr);
  for (size_t i = 0; i < g.size(); ++i) CHECK(one.x[i] == Approx(x0[i] - 0.1 * coef * g[i]).epsilon(1e-14));

  // Several steps, with momentum and with Adam, against the reference.
  o.momentum = 0.9;
  Compare(o, 0.1);
  OptimizerConfig adam;
  adam.type = "adam";
  adam.max_grad_norm = 0.5;
  Compare(adam, 0.01);
  LoomRun got = RunLoom(adam, pr, 0.01), want = RunReference(adam, pr, 0.01);
  REQUIRE(got.grad_norm.size() == kSteps);
  for (int s = 0; s < kSteps; ++s) CHECK(got.grad_norm[s] == Approx(want.grad_norm[s]).epsilon(1e-12));
}

TEST_CASE("clipping leaves gradients alone when the norm is within the limit") {
  OptimizerConfig o;
  o.momentum = 0.9;
  OptimizerConfig clipped = o;
  clipped.max_grad_norm = 3.17;  // just above sqrt(10) + 1e-6, and the norm falls from there
  Problem pr;
  for (double norm : RunReference(o, pr, 0.1).grad_norm) REQUIRE(norm + 1e-6 < clipped.max_grad_norm);
  LoomRun a = RunLoom(o, pr, 0.1), b = RunLoom(clipped, pr, 0.1);
  for (size_t i = 0; i < a.x.size(); ++i) CHECK(a.x[i] == b.x[i]);  // bit for bit: the factor is exactly 1
  CHECK(a.grad_norm.empty());
  REQUIRE(b.grad_norm.size() == kSteps);
  CHECK(b.grad_norm[0] == Approx(std::sqrt(10.0)).epsilon(1e-14));
  Compare(clipped, 0.1);
}

TEST_CASE("the gradient norm can be an output without clipping") {
  OptimizerConfig o;
  o.output_grad_norm = true;
  Problem pr;
  LoomRun got = RunLoom(o, pr, 0.1), want = RunReference(o, pr, 0.1);
  REQUIRE(got.grad_norm.size() == kSteps);
  for (int s = 0; s < kSteps; ++s) CHECK(got.grad_norm[s] == Approx(want.grad_norm[s]).epsilon(1e-12));
  for (size_t i = 0; i < got.x.size(); ++i) CHECK(got.x[i] == Approx(want.x[i]).epsilon(1e-12));
  LoomRun f32 = RunLoom(o, pr, 0.1, DType::kF32);
  for (int s = 0; s < kSteps; ++s) CHECK(f32.grad_norm[s] == Approx(want.grad_norm[s]).epsilon(1e-6));
}

// Runs one op on fed inputs; returns its first output.
StatusOr<Tensor> RunOp(const std::string& op, const std::vector<Tensor>& inputs, const AttrMap& attrs) {
  Graph g;
  GraphBuilder b(&g);
  std::vector<ValueId> ids;
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string name = "x" + std::to_string(i);
    ids.push_back(b.Input(name, {inputs[i].shape(), inputs[i].dtype()}));
    feeds[name] = inputs[i];
  }
  LOOM_ASSIGN_OR_RETURN(ValueId y, b.Add1(op, ids, attrs, "op"));
  g.outputs()["y"] = y;
  LOOM_ASSIGN_OR_RETURN(auto exec, Executor::Create(g));
  LOOM_ASSIGN_OR_RETURN(auto out, exec->Run(feeds));
  return out.at("y");
}

TEST_CASE("SquaredNorm and ClipScale compute clip_grad_norm_'s norm and factor") {
  for (DType dt : {DType::kF32, DType::kF64}) {
    INFO(DTypeName(dt));
    auto sq = RunOp("SquaredNorm", {MakeTensor(dt, {2}, {3, 4}), MakeTensor(dt, {1, 1}, {12}), MakeTensor(dt, {}, {0})},
                    {});
    REQUIRE(sq.ok());
    CHECK(sq->shape() == Shape{});
    CHECK(sq->ScalarAt(0) == 169);
    // More elements than one block of the deterministic reduction, over threads.
    const int64_t n = 3 * (1 << 14) + 5;
    auto big = RunOp("SquaredNorm", {MakeTensor(dt, {n}, std::vector<double>(n, 0.5))}, {});
    REQUIRE(big.ok());
    CHECK(big->ScalarAt(0) == 0.25 * n);

    auto clip = RunOp("ClipScale", {MakeTensor(dt, {}, {13})}, {{"max_norm", 6.5}});
    REQUIRE(clip.ok());
    CHECK(clip->ScalarAt(0) == Approx(6.5 / (13 + 1e-6)).epsilon(dt == DType::kF64 ? 1e-15 : 1e-7));
    auto keep = RunOp("ClipScale", {MakeTensor(dt, {}, {13})}, {{"max_norm", 20.0}});
    REQUIRE(keep.ok());
    CHECK(keep->ScalarAt(0) == 1.0);
    // torch's eps: a norm equal to max_norm still scales by a hair below 1.
    auto edge = RunOp("ClipScale", {MakeTensor(dt, {}, {2})}, {{"max_norm", 2.0}});
    REQUIRE(edge.ok());
    CHECK(edge->ScalarAt(0) < 1.0);
    auto nan = RunOp("ClipScale", {MakeTensor(dt, {}, {std::numeric_limits<double>::quiet_NaN()})},
                     {{"max_norm", 1.0}});
    REQUIRE(nan.ok());
    CHECK(std::isnan(nan->ScalarAt(0)));  // as torch: a NaN norm poisons the step rather than hiding
  }
  const OpDef* sq = OpRegistry::Global().FindOp("SquaredNorm");
  REQUIRE(sq != nullptr);
  TensorType a{Shape{4, 5}, DType::kF32}, b{Shape{3}, DType::kF32}, s{Shape{}, DType::kF32};
  CHECK(sq->Cost({}, {a, b}, {s}).flops == 2 * 23);
}

TEST_CASE("BuildTrainingGraph rejects bad requests clearly") {
  Model m(DType::kF64);
  Sym p = m.parameter("p", {3}, InitZeros());
  m.set_output("loss", m.op("SumToShape", {p}, AttrMap{{"shape", std::vector<int64_t>{}}})[0]);
  auto error = [&](const OptimizerConfig& o, const std::string& loss = "loss") {
    auto r = BuildTrainingGraph(m.graph(), loss, o);
    REQUIRE_FALSE(r.ok());
    return r.status().message();
  };
  using Catch::Matchers::Contains;
  OptimizerConfig o;
  CHECK_THAT(error(o, "los"), Contains("no output named 'los'"));
  o.type = "lion";
  CHECK_THAT(error(o), Contains("unknown optimizer 'lion' (expected sgd, adam, adamw, adadelta or rmsprop)"));
  o = OptimizerConfig();
  o.max_grad_norm = -1;
  CHECK_THAT(error(o), Contains("max_grad_norm must be >= 0 (0 = no clipping), got -1"));
  o.max_grad_norm = std::numeric_limits<double>::quiet_NaN();
  CHECK_THAT(error(o), Contains("max_grad_norm must be >= 0"));
  o = OptimizerConfig();
  o.weight_decay = -0.1;
  CHECK_THAT(error(o), Contains("node 'p/update' (SgdUpdate)") && Contains("weight_decay must be >= 0, got -0.1"));
  o = OptimizerConfig();
  o.nesterov = true;
  CHECK_THAT(error(o), Contains("nesterov needs momentum > 0 and dampening = 0"));
  o = OptimizerConfig();
  o.type = "adam";
  o.beta2 = 1.0;
  CHECK_THAT(error(o), Contains("AdamUpdate: beta2 must be in [0, 1), got 1"));
  o = OptimizerConfig();
  o.type = "adadelta";
  o.rho = 1.5;
  CHECK_THAT(error(o), Contains("AdadeltaUpdate: rho must be in [0, 1], got 1.5"));
  o.rho = 0.9;
  o.eps = -1e-6;
  CHECK_THAT(error(o), Contains("AdadeltaUpdate: eps must be >= 0, got -1e-06"));
  o = OptimizerConfig();
  o.type = "rmsprop";
  o.alpha = -0.5;
  CHECK_THAT(error(o), Contains("RmspropUpdate: alpha must be >= 0, got -0.5"));
  o.alpha = 0.99;
  o.momentum = -0.9;
  CHECK_THAT(error(o), Contains("RmspropUpdate: momentum must be >= 0, got -0.9"));

  Model clash(DType::kF64);
  Sym c = clash.parameter("p", {3}, InitZeros());
  clash.set_output("loss", clash.sum(c));
  clash.set_output("grad_norm", clash.sum(c));
  o = OptimizerConfig();
  o.max_grad_norm = 1;
  auto r = BuildTrainingGraph(clash.graph(), "loss", o);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Contains("already has an output named 'grad_norm'"));
}

TEST_CASE("the update and clipping ops check their inputs and attributes") {
  using Catch::Matchers::Contains;
  const TensorType v{Shape{3}, DType::kF64}, s{Shape{}, DType::kF64};
  auto infer = [](const std::string& op, const AttrMap& attrs, const std::vector<TensorType>& in) {
    return OpRegistry::Global().GetOp(op).value()->InferTypes(attrs, in);
  };
  // The slot count follows the attributes.
  auto sgd = infer("SgdUpdate", {{"momentum", 0.9}}, {v, v, s, s});
  REQUIRE_FALSE(sgd.ok());
  CHECK_THAT(sgd.status().message(),
             Contains("SgdUpdate (param, grad, 1 state tensor(s), lr, step) takes 5 input(s), got 4"));
  auto rms = infer("RmspropUpdate", {{"momentum", 0.9}, {"centered", true}}, {v, v, v, v, v, s, s});
  REQUIRE(rms.ok());
  CHECK(rms->size() == 4);
  auto bad_slot = infer("AdamUpdate", {}, {v, v, v, {Shape{4}, DType::kF64}, s, s});
  REQUIRE_FALSE(bad_slot.ok());
  CHECK_THAT(bad_slot.status().message(), Contains("state input 3 must match the param"));
  auto bad_lr = infer("AdadeltaUpdate", {}, {v, v, v, v, v, s});
  REQUIRE_FALSE(bad_lr.ok());
  CHECK_THAT(bad_lr.status().message(), Contains("AdadeltaUpdate lr must be a scalar"));
  auto lr_dtype = infer("AdadeltaUpdate", {}, {v, v, v, v, {Shape{}, DType::kF32}, s});
  REQUIRE_FALSE(lr_dtype.ok());
  CHECK_THAT(lr_dtype.status().message(), Contains("lr and step must have the param's dtype f64"));

  auto no_inputs = infer("SquaredNorm", {}, {});
  REQUIRE_FALSE(no_inputs.ok());
  CHECK_THAT(no_inputs.status().message(), Contains("SquaredNorm needs at least one input"));
  auto mixed = infer("SquaredNorm", {}, {v, {Shape{2}, DType::kF32}});
  REQUIRE_FALSE(mixed.ok());
  CHECK_THAT(mixed.status().message(), Contains("SquaredNorm: input 1 is f32, input 0 is f64"));
  auto no_max = infer("ClipScale", {}, {s});
  REQUIRE_FALSE(no_max.ok());
  CHECK_THAT(no_max.status().message(), Contains("ClipScale: max_norm must be > 0, got 0"));
  auto vector_norm = infer("ClipScale", {{"max_norm", 1.0}}, {v});
  REQUIRE_FALSE(vector_norm.ok());
  CHECK_THAT(vector_norm.status().message(), Contains("ClipScale total_norm must be a scalar"));
}

}  // namespace
}  // namespace loom
