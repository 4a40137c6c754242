// Optimizer updates and gradient clipping built by BuildTrainingGraph against
// hand-written torch.optim / clip_grad_norm_ updates for a few steps, in f64
// (and f32 with a looser tolerance); the clipping ops on their own; errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <variant>

#include "core/allocator.h"
#include "graph/builder.h"
#include "graph/model.h"
#include "graph/training.h"
#include "ops/op.h"
#include "runtime/executor.h"
#include "tests/op_harness.h"

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

std::unique_ptr<Executor> MakeExecutor(const StepOptimizer& opt, DType dtype, const Problem& pr) {
  auto train = BuildTrainingGraph(ProblemGraph(dtype), "loss", opt);
  REQUIRE(train.status().ToString() == "OK");
  auto exec = Executor::Create(*train);
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(0).ok());
  REQUIRE((*exec)->SetState("p", MakeTensor(dtype, {3}, pr.p0)).ok());
  REQUIRE((*exec)->SetState("q", MakeTensor(dtype, {2}, pr.q0)).ok());
  return std::move(exec).value();
}

LoomRun RunLoom(const StepOptimizer& opt, const Problem& pr, double lr, DType dtype = DType::kF64) {
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
LoomRun RunReference(const StepOptimizer& step, const Problem& pr, double lr) {
  const proto::OptimizerConfig o = OptimizerWithDefaults(step.config).value();
  std::vector<double> x = pr.p0, c = pr.w;
  x.insert(x.end(), pr.q0.begin(), pr.q0.end());
  c.insert(c.end(), pr.u.begin(), pr.u.end());
  const size_t n = x.size();
  std::vector<double> buf(n, 0), m(n, 0), v(n, 0), vmax(n, 0), sq(n, 0), acc(n, 0), gavg(n, 0);
  const double wd = o.weight_decay(), eps = o.eps();
  LoomRun r;
  for (int t = 1; t <= kSteps; ++t) {
    std::vector<double> grad(n);
    double sumsq = 0;
    for (size_t i = 0; i < n; ++i) {
      grad[i] = c[i] * x[i];
      sumsq += grad[i] * grad[i];
    }
    r.grad_norm.push_back(std::sqrt(sumsq));
    const double coef = o.clip_grad_norm() / (std::sqrt(sumsq) + 1e-6);
    if (o.clip_grad_norm() > 0 && coef < 1)
      for (double& g : grad) g *= coef;
    for (size_t i = 0; i < n; ++i) {
      double g = grad[i];
      if (o.type() == "sgd") {
        g += wd * x[i];
        if (o.momentum() != 0) {
          buf[i] = t == 1 ? g : o.momentum() * buf[i] + (1 - o.dampening()) * g;  // torch: first buf = grad
          g = o.nesterov() ? g + o.momentum() * buf[i] : buf[i];
        }
        x[i] -= lr * g;
      } else if (o.type() == "adam" || o.type() == "adamw") {
        if (o.type() == "adamw") x[i] *= 1 - lr * wd;
        else g += wd * x[i];
        m[i] = o.beta1() * m[i] + (1 - o.beta1()) * g;
        v[i] = o.beta2() * v[i] + (1 - o.beta2()) * g * g;
        vmax[i] = std::max(vmax[i], v[i]);
        double mhat = m[i] / (1 - std::pow(o.beta1(), t));
        double vhat = (o.amsgrad() ? vmax[i] : v[i]) / (1 - std::pow(o.beta2(), t));
        x[i] -= lr * mhat / (std::sqrt(vhat) + eps);
      } else if (o.type() == "adadelta") {
        g += wd * x[i];
        sq[i] = o.rho() * sq[i] + (1 - o.rho()) * g * g;
        double delta = std::sqrt(acc[i] + eps) / std::sqrt(sq[i] + eps) * g;
        acc[i] = o.rho() * acc[i] + (1 - o.rho()) * delta * delta;
        x[i] -= lr * delta;
      } else if (o.type() == "rmsprop") {
        g += wd * x[i];
        sq[i] = o.alpha() * sq[i] + (1 - o.alpha()) * g * g;
        double var = sq[i];
        if (o.centered()) {
          gavg[i] = o.alpha() * gavg[i] + (1 - o.alpha()) * g;
          var -= gavg[i] * gavg[i];
        }
        double avg = std::sqrt(var) + eps;
        if (o.momentum() > 0) {
          buf[i] = o.momentum() * buf[i] + g / avg;
          x[i] -= lr * buf[i];
        } else {
          x[i] -= lr * g / avg;
        }
      } else {
        FAIL("no reference for " << o.type());
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
void Compare(const StepOptimizer& o, double lr) {
  Problem pr;
  const LoomRun want = RunReference(o, pr, lr), got = RunLoom(o, pr, lr), got32 = RunLoom(o, pr, lr, DType::kF32);
  const std::vector<double> x0 = Initial(pr);
  for (size_t i = 0; i < want.x.size(); ++i) {
    INFO(o.config.type() << " element " << i);
    CHECK(got.x[i] == Approx(want.x[i]).epsilon(1e-12));
    CHECK(got32.x[i] == Approx(want.x[i]).epsilon(1e-5).margin(1e-6));
    CHECK(got.x[i] != Approx(x0[i]));  // it moved
  }
  for (const auto& [slot, values] : got.slots) {
    INFO(o.config.type() << " state " << slot);
    REQUIRE(want.slots.count(slot));
    for (size_t i = 0; i < values.size(); ++i) CHECK(values[i] == Approx(want.slots.at(slot)[i]).epsilon(1e-12));
  }
}

// Optimizer state names in the training step's executor.
std::vector<std::string> StateNames(const StepOptimizer& o) {
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
  StepOptimizer o;
  Compare(o, 0.1);
  o.config.set_momentum(0.9);
  Compare(o, 0.1);
  o.config.set_weight_decay(0.05);
  Compare(o, 0.1);
  o.config.set_nesterov(true);
  Compare(o, 0.1);
  o.config.set_nesterov(false);
  o.config.set_dampening(0.3);
  Compare(o, 0.1);
}

TEST_CASE("Adam and AdamW match torch.optim for a few steps") {
  StepOptimizer o;
  o.config.set_type("adam");
  Compare(o, 0.01);
  o.config.set_weight_decay(0.1);
  Compare(o, 0.01);
  o.config.set_type("adamw");
  Compare(o, 0.01);
  o.config.set_amsgrad(true);
  Compare(o, 0.01);
  o.config.set_type("adam");
  o.config.set_beta1(0.5);
  o.config.set_beta2(0.9);
  o.config.set_eps(1e-3);
  Compare(o, 0.01);
}

TEST_CASE("AMSGrad keeps the running maximum of the second moment") {
  // With a gradient that shrinks step by step, v falls and the maximum keeps
  // the step small: the amsgrad run moves less than plain Adam.
  StepOptimizer o;
  o.config.set_type("adam");
  o.config.set_beta2(0.5);
  Problem pr;
  pr.w = {4.0, 4.0, 4.0};
  double plain = RunLoom(o, pr, 0.1).x[0];
  o.config.set_amsgrad(true);
  double ams = RunLoom(o, pr, 0.1).x[0];
  CHECK(ams == Approx(RunReference(o, pr, 0.1).x[0]).epsilon(1e-12));
  CHECK(std::abs(ams - pr.p0[0]) < std::abs(plain - pr.p0[0]));
}

TEST_CASE("Adadelta matches torch.optim.Adadelta for a few steps") {
  StepOptimizer o;
  o.config.set_type("adadelta");
  Compare(o, 1.0);  // torch's default lr, rho 0.9, eps 1e-6
  o.config.set_weight_decay(0.1);
  Compare(o, 1.0);
  o.config.set_rho(0.5);
  o.config.set_eps(1e-4);
  Compare(o, 0.5);
}

TEST_CASE("RMSprop matches torch.optim.RMSprop for a few steps") {
  StepOptimizer o;
  o.config.set_type("rmsprop");
  Compare(o, 0.01);
  o.config.set_alpha(0.9);
  o.config.set_weight_decay(0.05);
  Compare(o, 0.01);
  o.config.set_momentum(0.8);
  Compare(o, 0.01);
  o.config.set_centered(true);
  Compare(o, 0.01);
  o.config.set_momentum(0);
  Compare(o, 0.01);
}

TEST_CASE("torch's per-optimizer defaults apply to unset fields") {
  auto with_defaults = [](const std::string& type) {
    proto::OptimizerConfig c;
    c.set_type(type);
    return OptimizerWithDefaults(c).value();
  };
  CHECK(with_defaults("adadelta").eps() == 1e-6);
  CHECK(with_defaults("rmsprop").eps() == 1e-8);
  CHECK(with_defaults("rmsprop").weight_decay() == 0);
  CHECK(with_defaults("rmsprop").alpha() == 0.99);
  CHECK(with_defaults("adamw").weight_decay() == 0.01);
  CHECK(with_defaults("adam").beta1() == 0.9);
  CHECK(with_defaults("adam").beta2() == 0.999);
  CHECK(with_defaults("adadelta").rho() == 0.9);
  CHECK(OptimizerWithDefaults(proto::OptimizerConfig{}).value().type() == "sgd");
  proto::OptimizerConfig set;
  set.set_type("adamw");
  set.set_weight_decay(0.0);
  set.set_eps(1e-3);
  CHECK(OptimizerWithDefaults(set).value().weight_decay() == 0);  // set explicitly: no decay
  CHECK(OptimizerWithDefaults(set).value().eps() == 1e-3);
  // Unset weight decay on AdamW decays (torch's 0.01): it differs from 0.
  StepOptimizer unset, none;
  unset.config.set_type("adamw");
  none.config.set_type("adamw");
  none.config.set_weight_decay(0.0);
  Compare(unset, 0.01);
  Problem pr;
  CHECK(RunLoom(unset, pr, 0.01).x[0] != Approx(RunLoom(none, pr, 0.01).x[0]).epsilon(1e-9));

  CHECK(with_defaults("sgd").lr() == 1e-3);
  CHECK(with_defaults("adam").lr() == 1e-3);
  CHECK(with_defaults("adamw").lr() == 1e-3);
  CHECK(with_defaults("adadelta").lr() == 1.0);
  CHECK(with_defaults("rmsprop").lr() == 1e-2);
  proto::OptimizerConfig adagrad;
  adagrad.set_type("adagrad");
  auto bad = OptimizerWithDefaults(adagrad);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("unknown optimizer 'adagrad'") != std::string::npos);
}

TEST_CASE("optimizer state is one zeroed buffer per parameter and torch state name") {
  using V = std::vector<std::string>;
  StepOptimizer o;
  CHECK(StateNames(o) == V{"p", "q"});  // plain SGD keeps no buffer
  o.config.set_momentum(0.9);
  CHECK(StateNames(o) == V{"p", "p/momentum_buffer", "q", "q/momentum_buffer"});
  o = StepOptimizer();
  o.config.set_type("adamw");
  o.config.set_amsgrad(true);
  CHECK(StateNames(o) == V{"p", "p/exp_avg", "p/exp_avg_sq", "p/max_exp_avg_sq", "q", "q/exp_avg", "q/exp_avg_sq",
                           "q/max_exp_avg_sq"});
  o = StepOptimizer();
  o.config.set_type("adadelta");
  CHECK(StateNames(o) == V{"p", "p/acc_delta", "p/square_avg", "q", "q/acc_delta", "q/square_avg"});
  o.config.set_type("rmsprop");
  CHECK(StateNames(o) == V{"p", "p/square_avg", "q", "q/square_avg"});
  o.config.set_momentum(0.5);
  o.config.set_centered(true);
  CHECK(StateNames(o) == V{"p", "p/grad_avg", "p/momentum_buffer", "p/square_avg", "q", "q/grad_avg",
                           "q/momentum_buffer", "q/square_avg"});
}

// Step 1 by hand: g = [0.5, -0.5, -0.5, 3, -0.5], |g| = sqrt(10).
TEST_CASE("clipping by global norm scales every gradient when the norm is too large") {
  StepOptimizer o;
  o.config.set_clip_grad_norm(1.0);
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
  o.config.set_momentum(0.9);
  Compare(o, 0.1);
  StepOptimizer adam;
  adam.config.set_type("adam");
  adam.config.set_clip_grad_norm(0.5);
  Compare(adam, 0.01);
  LoomRun got = RunLoom(adam, pr, 0.01), want = RunReference(adam, pr, 0.01);
  REQUIRE(got.grad_norm.size() == kSteps);
  for (int s = 0; s < kSteps; ++s) CHECK(got.grad_norm[s] == Approx(want.grad_norm[s]).epsilon(1e-12));
}

TEST_CASE("clipping leaves gradients alone when the norm is within the limit") {
  StepOptimizer o;
  o.config.set_momentum(0.9);
  StepOptimizer clipped = o;
  clipped.config.set_clip_grad_norm(3.17);  // just above sqrt(10) + 1e-6, and the norm falls from there
  Problem pr;
  for (double norm : RunReference(o, pr, 0.1).grad_norm) REQUIRE(norm + 1e-6 < clipped.config.clip_grad_norm());
  LoomRun a = RunLoom(o, pr, 0.1), b = RunLoom(clipped, pr, 0.1);
  for (size_t i = 0; i < a.x.size(); ++i) CHECK(a.x[i] == b.x[i]);  // bit for bit: the factor is exactly 1
  CHECK(a.grad_norm.empty());
  REQUIRE(b.grad_norm.size() == kSteps);
  CHECK(b.grad_norm[0] == Approx(std::sqrt(10.0)).epsilon(1e-14));
  Compare(clipped, 0.1);
}

TEST_CASE("the gradient norm can be an output without clipping") {
  StepOptimizer o;
  o.output_grad_norm = true;
  Problem pr;
  LoomRun got = RunLoom(o, pr, 0.1), want = RunReference(o, pr, 0.1);
  REQUIRE(got.grad_norm.size() == kSteps);
  for (int s = 0; s < kSteps; ++s) CHECK(got.grad_norm[s] == Approx(want.grad_norm[s]).epsilon(1e-12));
  for (size_t i = 0; i < got.x.size(); ++i) CHECK(got.x[i] == Approx(want.x[i]).epsilon(1e-12));
  LoomRun f32 = RunLoom(o, pr, 0.1, DType::kF32);
  for (int s = 0; s < kSteps; ++s) CHECK(f32.grad_norm[s] == Approx(want.grad_norm[s]).epsilon(1e-6));
}

// Runs one op on fed inputs on `device`; returns all its outputs.
StatusOr<std::vector<Tensor>> RunOpOn(Device device, const std::string& op, const std::vector<Tensor>& inputs,
                                      const AttrMap& attrs) {
  Graph g;
  GraphBuilder b(&g);
  std::vector<ValueId> ids;
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string name = "x" + std::to_string(i);
    ids.push_back(b.Input(name, {inputs[i].shape(), inputs[i].dtype()}));
    feeds[name] = inputs[i];
  }
  LOOM_ASSIGN_OR_RETURN(std::vector<ValueId> ys, b.Add(op, ids, attrs, "op"));
  for (size_t i = 0; i < ys.size(); ++i) g.outputs()["y" + std::to_string(i)] = ys[i];
  ExecutorOptions opts;
  opts.device = device;
  LOOM_ASSIGN_OR_RETURN(auto exec, Executor::Create(g, opts));
  LOOM_ASSIGN_OR_RETURN(auto out, exec->Run(feeds));
  std::vector<Tensor> result;
  for (size_t i = 0; i < ys.size(); ++i) result.push_back(out.at("y" + std::to_string(i)));
  return result;
}

StatusOr<std::vector<Tensor>> RunOpOutputs(const std::string& op, const std::vector<Tensor>& inputs,
                                           const AttrMap& attrs) {
  return RunOpOn(Device::Cpu(), op, inputs, attrs);
}

// Runs one op on fed inputs; returns its first output.
StatusOr<Tensor> RunOp(const std::string& op, const std::vector<Tensor>& inputs, const AttrMap& attrs) {
  LOOM_ASSIGN_OR_RETURN(std::vector<Tensor> out, RunOpOutputs(op, inputs, attrs));
  return out.at(0);
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
    // Distinct values, so that every lane and the tail of each block count.
    std::vector<double> ramp(static_cast<size_t>(n));
    long double want = 0;
    for (int64_t i = 0; i < n; ++i) {
      ramp[static_cast<size_t>(i)] = static_cast<double>(i % 97) / 8 - 6;  // exact in f32
      want += static_cast<long double>(ramp[static_cast<size_t>(i)]) * ramp[static_cast<size_t>(i)];
    }
    auto varied = RunOp("SquaredNorm", {MakeTensor(dt, {n}, ramp)}, {});
    REQUIRE(varied.ok());
    CHECK(varied->ScalarAt(0) == Approx(static_cast<double>(want)).epsilon(dt == DType::kF64 ? 1e-14 : 1e-7));

    // The documented order, exactly: blocks of 2^14 elements added in block
    // order, each block's squares in 32 lanes (element i in lane i mod 32),
    // then its tail, then its lanes in order. Values of many magnitudes, so
    // another order rounds differently.
    std::vector<double> spread(static_cast<size_t>(n));
    uint64_t bits = 12345;
    for (double& v : spread) {
      bits = bits * 6364136223846793005ull + 1442695040888963407ull;
      const double mantissa = 1 + static_cast<double>(bits >> 41) / (1 << 23);  // 23 bits: exact in f32
      v = std::ldexp(mantissa, static_cast<int>((bits >> 33) % 40) - 20);
    }
    double ordered = 0;
    for (int64_t block = 0; block < n; block += 1 << 14) {
      const double* x = spread.data() + block;
      const int64_t count = std::min<int64_t>(1 << 14, n - block);
      double lanes[32] = {}, block_sum = 0;
      int64_t i = 0;
      for (; i + 32 <= count; i += 32)
        for (int l = 0; l < 32; ++l) lanes[l] += x[i + l] * x[i + l];
      for (; i < count; ++i) block_sum += x[i] * x[i];
      for (double lane : lanes) block_sum += lane;
      ordered += block_sum;
    }
    auto exact = RunOp("SquaredNorm", {MakeTensor(dt, {n}, spread)}, {});
    REQUIRE(exact.ok());
    CHECK(exact->ScalarAt(0) == (dt == DType::kF32 ? static_cast<double>(static_cast<float>(ordered)) : ordered));

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
  auto error = [&](const StepOptimizer& o, const std::string& loss = "loss") {
    auto r = BuildTrainingGraph(m.graph(), loss, o);
    REQUIRE_FALSE(r.ok());
    return r.status().message();
  };
  using Catch::Matchers::Contains;
  StepOptimizer o;
  CHECK_THAT(error(o, "los"), Contains("no output named 'los'"));
  o.config.set_type("lion");
  CHECK_THAT(error(o), Contains("unknown optimizer 'lion' (expected sgd, adam, adamw, adadelta or rmsprop)"));
  o = StepOptimizer();
  o.config.set_clip_grad_norm(-1);
  CHECK_THAT(error(o), Contains("clip_grad_norm must be >= 0 (0 = no clipping), got -1"));
  o.config.set_clip_grad_norm(std::numeric_limits<double>::quiet_NaN());
  CHECK_THAT(error(o), Contains("clip_grad_norm must be >= 0"));
  o = StepOptimizer();
  o.config.set_weight_decay(-0.1);
  CHECK_THAT(error(o), Contains("node 'p/update' (SgdUpdate)") && Contains("weight_decay must be >= 0, got -0.1"));
  o = StepOptimizer();
  o.config.set_nesterov(true);
  CHECK_THAT(error(o), Contains("nesterov needs momentum > 0 and dampening = 0"));
  o = StepOptimizer();
  o.config.set_type("adam");
  o.config.set_beta2(1.0);
  CHECK_THAT(error(o), Contains("AdamUpdate: beta2 must be in [0, 1), got 1"));
  o = StepOptimizer();
  o.config.set_type("adadelta");
  o.config.set_rho(1.5);
  CHECK_THAT(error(o), Contains("AdadeltaUpdate: rho must be in [0, 1], got 1.5"));
  o.config.set_rho(0.9);
  o.config.set_eps(-1e-6);
  CHECK_THAT(error(o), Contains("AdadeltaUpdate: eps must be >= 0, got -1e-06"));
  o = StepOptimizer();
  o.config.set_type("rmsprop");
  o.config.set_alpha(-0.5);
  CHECK_THAT(error(o), Contains("RmspropUpdate: alpha must be >= 0, got -0.5"));
  o.config.set_alpha(0.99);
  o.config.set_momentum(-0.9);
  CHECK_THAT(error(o), Contains("RmspropUpdate: momentum must be >= 0, got -0.9"));

  Model clash(DType::kF64);
  Sym c = clash.parameter("p", {3}, InitZeros());
  clash.set_output("loss", clash.sum(c));
  clash.set_output("grad_norm", clash.sum(c));
  o = StepOptimizer();
  o.config.set_clip_grad_norm(1);
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
             Contains("SgdUpdate (param, grad, 1 state tensor(s), lr, step[, active]) takes 5 input(s), got 4"));
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

// ---- Fused replicas (horizontal fusion) ----
//
// A fused update op (attribute replicas = R) must do, chunk by chunk, exactly
// what R unfused ops do with each replica's own scalars: the tests run both
// and compare bit patterns; a frozen replica (active = 0) keeps its old bits.

constexpr int64_t kR = 3;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// The bit pattern of every element (f32 or f64), for bit-exact comparisons.
std::vector<uint64_t> Bits(const Tensor& t) {
  std::vector<uint64_t> bits(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.dtype() == DType::kF32) {
      uint32_t u;
      std::memcpy(&u, t.data<float>() + i, sizeof u);
      bits[static_cast<size_t>(i)] = u;
    } else {
      std::memcpy(&bits[static_cast<size_t>(i)], t.data<double>() + i, sizeof(double));
    }
  }
  return bits;
}

// The first element whose bits differ, or -1 when a and b are bit for bit
// equal (a size mismatch is element 0).
int64_t FirstBitDifference(const Tensor& a, const Tensor& b) {
  const std::vector<uint64_t> x = Bits(a), y = Bits(b);
  if (x.size() != y.size()) return 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] != y[i]) return static_cast<int64_t>(i);
  return -1;
}

// Chunk r of a fused [R, ...] tensor, as a copy shaped like the rest.
Tensor ChunkOf(const Tensor& fused, int64_t r) {
  const std::vector<int64_t>& d = fused.shape().dims();
  Tensor c = Tensor::Zeros(Shape(std::vector<int64_t>(d.begin() + 1, d.end())), fused.dtype());
  std::memcpy(c.raw_data(), static_cast<const char*>(fused.raw_data()) + r * c.nbytes(), c.nbytes());
  return c;
}

// [R, ...] from R tensors of one shape.
Tensor Stack(const std::vector<Tensor>& parts) {
  std::vector<int64_t> d = parts[0].shape().dims();
  d.insert(d.begin(), static_cast<int64_t>(parts.size()));
  Tensor t = Tensor::Zeros(Shape(d), parts[0].dtype());
  for (size_t r = 0; r < parts.size(); ++r)
    std::memcpy(static_cast<char*>(t.raw_data()) + r * parts[r].nbytes(), parts[r].raw_data(), parts[r].nbytes());
  return t;
}

// The unfused attributes of replica r: entry r of every list, no replicas.
AttrMap ReplicaAttrs(const AttrMap& fused, int64_t r) {
  AttrMap a;
  for (const auto& [name, value] : fused.values()) {
    if (name == "replicas") continue;
    if (const auto* list = std::get_if<std::vector<double>>(&value)) a.Set(name, (*list)[static_cast<size_t>(r)]);
    else a.Set(name, value);
  }
  return a;
}

// Whether some replica's value of a float attribute (absent: 0) passes.
bool AnyValue(const AttrMap& a, const std::string& name, const std::function<bool(double)>& pred) {
  if (!a.Has(name)) return pred(0);
  const AttrValue& v = a.values().at(name);
  if (const auto* list = std::get_if<std::vector<double>>(&v)) return std::any_of(list->begin(), list->end(), pred);
  return pred(std::get<double>(v));
}

// The state slots of an update op, in input order (docs/optimizers.md).
std::vector<std::string> SlotNames(const std::string& op, const AttrMap& a) {
  if (op == "SgdUpdate")
    return AnyValue(a, "momentum", [](double m) { return m != 0; }) ? std::vector<std::string>{"momentum_buffer"}
                                                                     : std::vector<std::string>{};
  if (op == "AdamUpdate") {
    std::vector<std::string> s = {"exp_avg", "exp_avg_sq"};
    if (a.Bool("amsgrad")) s.push_back("max_exp_avg_sq");
    return s;
  }
  if (op == "AdadeltaUpdate") return {"square_avg", "acc_delta"};
  REQUIRE(op == "RmspropUpdate");
  std::vector<std::string> s = {"square_avg"};
  if (AnyValue(a, "momentum", [](double m) { return m > 0; })) s.push_back("momentum_buffer");
  if (a.Bool("centered")) s.push_back("grad_avg");
  return s;
}

struct FusedCase {
  std::string name, op;
  AttrMap attrs;               // without replicas; float lists have kR entries
  std::vector<double> lr;      // per replica
  Shape chunk{4, 5};           // one replica's parameter shape
};

// Which replicas update at steps 1..4: all, then replica 1 frozen twice
// (its gradient is NaN, as after a divergence), then replica 0 frozen while
// replica 1 resumes from its frozen state.
const std::vector<std::vector<double>> kActive = {{1, 1, 1}, {1, 0, 1}, {1, 0, 1}, {0, 1, 1}};

// A fused run of kActive.size() steps against kR unfused runs on the chunks.
void CheckFusedMatchesUnfused(const FusedCase& c, DType dt) {
  INFO(c.name << " in " << DTypeName(dt));
  AttrMap fused_attrs = c.attrs;
  fused_attrs.Set("replicas", kR);
  const std::vector<std::string> fused_slots = SlotNames(c.op, fused_attrs);
  const int64_t n = c.chunk.numel();
  // Unfused state per replica: param and slots by name.
  std::vector<Tensor> p(kR);
  std::vector<std::map<std::string, Tensor>> slots(kR);
  std::vector<AttrMap> replica_attrs(kR);
  for (int64_t r = 0; r < kR; ++r) {
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = std::sin(1.0 + 0.7 * static_cast<double>(i) + 2.1 * r);
    p[r] = MakeTensor(dt, c.chunk, v);
    replica_attrs[r] = ReplicaAttrs(fused_attrs, r);
    for (const std::string& name : SlotNames(c.op, replica_attrs[r])) slots[r][name] = Tensor::Zeros(c.chunk, dt);
  }
  // Fused state. A slot that replica r does not use (SGD momentum 0) starts
  // at a marker value that must survive every step.
  constexpr double kUnused = 7.25;
  Tensor fp = Stack(p);
  std::vector<Tensor> fslots;
  for (const std::string& name : fused_slots) {
    std::vector<Tensor> parts;
    for (int64_t r = 0; r < kR; ++r) {
      Tensor t = Tensor::Zeros(c.chunk, dt);
      if (!slots[r].count(name)) t.Fill(kUnused);
      parts.push_back(t);
    }
    fslots.push_back(Stack(parts));
  }
  for (size_t s = 0; s < kActive.size(); ++s) {
    const double step = static_cast<double>(s + 1);
    INFO("step " << step);
    // Gradients from the unfused params (they change every step); a frozen
    // replica's gradient is NaN, which must not reach its state.
    std::vector<Tensor> g(kR);
    for (int64_t r = 0; r < kR; ++r) {
      std::vector<double> pv = p[r].ToDoubleVector(), gv(pv.size());
      for (size_t i = 0; i < pv.size(); ++i)
        gv[i] = kActive[s][r] != 0 ? (0.5 + 0.25 * r) * pv[i] + 0.1 * std::cos(step + static_cast<double>(i)) : kNaN;
      g[r] = MakeTensor(dt, c.chunk, gv);
    }
    std::vector<Tensor> in = {fp, Stack(g)};
    for (const Tensor& t : fslots) in.push_back(t);
    in.push_back(MakeTensor(dt, {kR}, c.lr));
    in.push_back(MakeTensor(dt, {}, {step}));
    in.push_back(MakeTensor(dt, {kR}, kActive[s]));
    auto fused = RunOpOutputs(c.op, in, fused_attrs);
    REQUIRE(fused.status().ToString() == "OK");
    REQUIRE(fused->size() == 1 + fused_slots.size());
    for (int64_t r = 0; r < kR; ++r) {
      INFO("replica " << r);
      const std::vector<uint64_t> old_p = Bits(p[r]);
      if (kActive[s][r] != 0) {
        const std::vector<std::string> names = SlotNames(c.op, replica_attrs[r]);
        std::vector<Tensor> rin = {p[r], g[r]};
        for (const std::string& name : names) rin.push_back(slots[r][name]);
        rin.push_back(MakeTensor(dt, {}, {c.lr[r]}));
        rin.push_back(MakeTensor(dt, {}, {step}));
        auto out = RunOpOutputs(c.op, rin, replica_attrs[r]);
        REQUIRE(out.status().ToString() == "OK");
        REQUIRE(out->size() == 1 + names.size());
        p[r] = (*out)[0];
        for (size_t k = 0; k < names.size(); ++k) slots[r][names[k]] = (*out)[1 + k];
        CHECK(Bits(p[r]) != old_p);  // it moved, so the comparison below means something
      }
      CHECK(FirstBitDifference(ChunkOf((*fused)[0], r), p[r]) == -1);
      for (size_t k = 0; k < fused_slots.size(); ++k) {
        INFO("slot " << fused_slots[k]);
        const Tensor got = ChunkOf((*fused)[1 + k], r);
        if (slots[r].count(fused_slots[k])) {
          CHECK(FirstBitDifference(got, slots[r][fused_slots[k]]) == -1);
        } else {
          const std::vector<double> values = got.ToDoubleVector();
          CHECK(std::count(values.begin(), values.end(), kUnused) == n);
        }
      }
    }
    fp = (*fused)[0];
    for (size_t k = 0; k < fused_slots.size(); ++k) fslots[k] = (*fused)[1 + k];
  }
}

void CheckFusedMatchesUnfused(const FusedCase& c) {
  CheckFusedMatchesUnfused(c, DType::kF64);
  CheckFusedMatchesUnfused(c, DType::kF32);
}

using Floats = std::vector<double>;

TEST_CASE("fused SGD updates each replica as an unfused SGD with its own hyper-parameters") {
  const Floats lr = {0.1, 0.05, 0.2};
  CheckFusedMatchesUnfused({"plain", "SgdUpdate", {}, lr});
  CheckFusedMatchesUnfused({"weight decay", "SgdUpdate", {{"weight_decay", Floats{0.0, 0.05, 0.3}}}, lr});
  CheckFusedMatchesUnfused({"momentum and dampening",
                            "SgdUpdate",
                            {{"momentum", Floats{0.9, 0.5, 0.8}},
                             {"dampening", Floats{0.0, 0.3, 0.1}},
                             {"weight_decay", 0.01}},
                            lr});
  CheckFusedMatchesUnfused({"nesterov",
                            "SgdUpdate",
                            {{"momentum", Floats{0.9, 0.5, 0.7}}, {"nesterov", true}, {"weight_decay", Floats{0.1, 0, 0.02}}},
                            lr});
  // A single float applies to every replica.
  CheckFusedMatchesUnfused({"shared momentum", "SgdUpdate", {{"momentum", 0.9}}, lr});
}

TEST_CASE("fused SGD: a replica with momentum 0 is plain SGD and leaves its buffer chunk alone") {
  const Floats lr = {0.1, 0.05, 0.2};
  // Replica 1 has momentum 0 (the op still keeps one buffer for all three).
  CheckFusedMatchesUnfused({"mixed momentum", "SgdUpdate", {{"momentum", Floats{0.9, 0.0, 0.5}}}, lr});
  CheckFusedMatchesUnfused({"mixed momentum, dampening", "SgdUpdate",
                            {{"momentum", Floats{0.0, 0.8, 0.0}}, {"dampening", Floats{0.5, 0.2, 0.0}}}, lr});
  // All momenta 0: no buffer at all.
  auto out = RunOpOutputs("SgdUpdate",
                          {MakeTensor(DType::kF64, {kR}, {1, 2, 3}), MakeTensor(DType::kF64, {kR}, {1, 1, 1}),
                           MakeTensor(DType::kF64, {kR}, {0.1, 0.2, 0.3}), MakeTensor(DType::kF64, {}, {1}),
                           MakeTensor(DType::kF64, {kR}, {1, 1, 0})},
                          {{"replicas", kR}, {"momentum", Floats{0, 0, 0}}});
  REQUIRE(out.ok());
  REQUIRE(out->size() == 1);
  // By hand: p - lr * g per replica, replica 2 frozen.
  CHECK((*out)[0].ToDoubleVector() == std::vector<double>{1 - 0.1, 2 - 0.2, 3});
}

TEST_CASE("fused SGD follows each replica's lr and weight decay (by hand)") {
  // p = [[1, -2], [0.5, 4], [3, 3]], g = 1, lr = [0.1, 0.2, 0.3], wd = [0, 0.5, 0.25]:
  // new p = p - lr * (g + wd * p), replica 2 frozen.
  auto out = RunOpOutputs("SgdUpdate",
                          {MakeTensor(DType::kF64, {kR, 2}, {1, -2, 0.5, 4, 3, 3}),
                           MakeTensor(DType::kF64, {kR, 2}, {1, 1, 1, 1, kInf, kNaN}),
                           MakeTensor(DType::kF64, {kR}, {0.1, 0.2, 0.3}), MakeTensor(DType::kF64, {}, {1}),
                           MakeTensor(DType::kF64, {kR}, {1, 2, 0})},
                          {{"replicas", kR}, {"weight_decay", Floats{0, 0.5, 0.25}}});
  REQUIRE(out.ok());
  const std::vector<double> got = (*out)[0].ToDoubleVector();
  const std::vector<double> want = {1 - 0.1, -2 - 0.1, 0.5 - 0.2 * 1.25, 4 - 0.2 * 3, 3, 3};
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-15));
}

TEST_CASE("fused Adam, AdamW and AMSGrad update each replica as the unfused op") {
  const Floats lr = {0.01, 0.003, 0.02};
  CheckFusedMatchesUnfused({"adam", "AdamUpdate", {{"beta1", Floats{0.9, 0.8, 0.5}}, {"beta2", Floats{0.999, 0.9, 0.99}}},
                            lr});
  CheckFusedMatchesUnfused({"adam L2",
                            "AdamUpdate",
                            {{"eps", Floats{1e-8, 1e-3, 1e-6}}, {"weight_decay", Floats{0.1, 0.0, 0.01}}},
                            lr});
  CheckFusedMatchesUnfused({"adamw",
                            "AdamUpdate",
                            {{"decoupled", true}, {"weight_decay", Floats{0.01, 0.1, 0.5}}, {"beta1", Floats{0.9, 0.7, 0.0}}},
                            lr});
  CheckFusedMatchesUnfused({"amsgrad",
                            "AdamUpdate",
                            {{"amsgrad", true}, {"beta2", Floats{0.5, 0.9, 0.3}}, {"weight_decay", 0.05}},
                            lr});
  CheckFusedMatchesUnfused({"adamw amsgrad",
                            "AdamUpdate",
                            {{"decoupled", true}, {"amsgrad", true}, {"weight_decay", Floats{0.01, 0.2, 0.0}}},
                            lr});
}

TEST_CASE("fused Adadelta updates each replica as the unfused op") {
  CheckFusedMatchesUnfused({"adadelta",
                            "AdadeltaUpdate",
                            {{"rho", Floats{0.9, 0.5, 1.0}}, {"eps", Floats{1e-6, 1e-4, 1e-2}},
                             {"weight_decay", Floats{0, 0.1, 0.01}}},
                            {1.0, 0.5, 2.0}});
}

TEST_CASE("fused RMSprop updates each replica as the unfused op") {
  const Floats lr = {0.01, 0.003, 0.02};
  CheckFusedMatchesUnfused({"rmsprop", "RmspropUpdate", {{"alpha", Floats{0.99, 0.9, 0.5}}}, lr});
  CheckFusedMatchesUnfused({"centered momentum",
                            "RmspropUpdate",
                            {{"centered", true},
                             {"momentum", Floats{0.8, 0.5, 0.9}},
                             {"alpha", Floats{0.9, 0.99, 0.7}},
                             {"eps", Floats{1e-8, 1e-4, 1e-6}},
                             {"weight_decay", Floats{0.05, 0, 0.1}}},
                            lr});
  // Replica 0 without momentum: its momentum buffer chunk stays as it was.
  CheckFusedMatchesUnfused({"centered mixed momentum", "RmspropUpdate",
                            {{"centered", true}, {"momentum", Floats{0.0, 0.5, 0.9}}}, lr});
  CheckFusedMatchesUnfused({"mixed momentum", "RmspropUpdate", {{"momentum", Floats{0.3, 0.0, 0.0}}}, lr});
}

TEST_CASE("fused updates of chunks large enough to run on several threads") {
  // 70000 elements a replica: more than ParallelRange's two chunks of 32768.
  CheckFusedMatchesUnfused({"adam big",
                            "AdamUpdate",
                            {{"beta1", Floats{0.9, 0.8, 0.5}}, {"amsgrad", true}},
                            {0.01, 0.003, 0.02},
                            Shape{70000}},
                           DType::kF32);
  CheckFusedMatchesUnfused({"sgd big", "SgdUpdate", {{"momentum", Floats{0.9, 0, 0.5}}}, {0.1, 0.05, 0.2},
                            Shape{7, 10000}},
                           DType::kF64);
}

TEST_CASE("an update's element does not depend on where it sits: vector loops and their scalar ends agree") {
  // 37 elements run through the update loops' vector body and their
  // remainder; each element alone runs through the remainder only. A
  // difference (an FMA formed on one path and not the other) would make
  // results depend on a tensor's size and the threads' split of it.
  struct Case {
    std::string op;
    AttrMap attrs;
  };
  const std::vector<Case> cases = {
      {"SgdUpdate", {}},
      {"SgdUpdate", {{"weight_decay", 0.1}}},
      {"SgdUpdate", {{"momentum", 0.9}, {"dampening", 0.2}}},
      {"SgdUpdate", {{"momentum", 0.9}, {"nesterov", true}, {"weight_decay", 0.01}}},
      {"AdamUpdate", {{"weight_decay", 0.1}}},
      {"AdamUpdate", {{"decoupled", true}, {"weight_decay", 0.1}, {"amsgrad", true}}},
      {"AdadeltaUpdate", {{"weight_decay", 0.1}}},
      {"RmspropUpdate", {{"weight_decay", 0.1}}},
      {"RmspropUpdate", {{"centered", true}, {"momentum", 0.8}}},
  };
  constexpr int64_t n = 37;
  for (DType dt : {DType::kF32, DType::kF64})
    for (const Case& c : cases) {
      INFO(c.op << " " << c.attrs.ToString() << " in " << DTypeName(dt));
      // Param, grad and slots (positive: some are squares).
      const size_t slots = SlotNames(c.op, c.attrs).size();
      std::vector<std::vector<double>> values(2 + slots, std::vector<double>(n));
      for (size_t t = 0; t < values.size(); ++t)
        for (int64_t i = 0; i < n; ++i)
          values[t][static_cast<size_t>(i)] = (t >= 2 ? 0.02 : -0.5) + std::abs(std::sin(1.3 * i + 0.7 * t));
      auto run = [&](int64_t begin, int64_t count) {
        std::vector<Tensor> in;
        for (const auto& v : values)
          in.push_back(MakeTensor(dt, {count}, std::vector<double>(v.begin() + begin, v.begin() + begin + count)));
        in.push_back(MakeTensor(dt, {}, {0.05}));  // lr
        in.push_back(MakeTensor(dt, {}, {3.0}));   // step: past SGD's first
        auto out = RunOpOutputs(c.op, in, c.attrs);
        REQUIRE(out.status().ToString() == "OK");
        return *out;
      };
      const std::vector<Tensor> whole = run(0, n);
      for (int64_t i = 0; i < n; ++i) {
        INFO("element " << i);
        const std::vector<Tensor> alone = run(i, 1);
        for (size_t k = 0; k < whole.size(); ++k) {
          INFO("output " << k);
          CHECK(Bits(alone[k])[0] == Bits(whole[k])[static_cast<size_t>(i)]);
        }
      }
    }
}

TEST_CASE("fused update ops cost what the unfused op costs on the same elements") {
  const TensorType p{Shape{kR, 4}, DType::kF32}, v{Shape{kR}, DType::kF32}, s{Shape{}, DType::kF32};
  const TensorType flat{Shape{kR * 4}, DType::kF32};
  const OpDef* sgd = OpRegistry::Global().FindOp("SgdUpdate");
  REQUIRE(sgd != nullptr);
  const OpCost fused = sgd->Cost({{"replicas", kR}, {"momentum", Floats{0, 0.9, 0}}}, {p, p, p, v, s, v}, {p, p});
  const OpCost unfused = sgd->Cost({{"momentum", 0.9}}, {flat, flat, flat, s, s}, {flat, flat});
  CHECK(fused.flops == 7 * 12);
  CHECK(fused.flops == unfused.flops);
  const OpDef* rms = OpRegistry::Global().FindOp("RmspropUpdate");
  CHECK(rms->Cost({{"replicas", kR}, {"momentum", Floats{0, 0, 0.5}}, {"centered", true}}, {p, p, p, p, p, v, s, v},
                  {p, p, p, p})
            .flops == (4 + 3 * 3) * 12);
}

TEST_CASE("fused SquaredNorm sums each replica's chunks as the unfused op does") {
  for (DType dt : {DType::kF32, DType::kF64}) {
    INFO(DTypeName(dt));
    // Inputs of several shapes, one with chunks of more than one block of the
    // deterministic reduction (1 << 14 elements).
    std::vector<Tensor> in;
    for (const Shape& shape : {Shape{kR, 5}, Shape{kR, 2, 2}, Shape{kR}, Shape{kR, 40000}}) {
      std::vector<double> v(static_cast<size_t>(shape.numel()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * static_cast<double>(i) + 0.1);
      in.push_back(MakeTensor(dt, shape, v));
    }
    auto fused = RunOp("SquaredNorm", in, {{"replicas", kR}});
    REQUIRE(fused.ok());
    REQUIRE(fused->shape() == Shape{kR});
    for (int64_t r = 0; r < kR; ++r) {
      INFO("replica " << r);
      std::vector<Tensor> chunks;
      double naive = 0;
      for (const Tensor& t : in) {
        chunks.push_back(ChunkOf(t, r));
        for (double x : chunks.back().ToDoubleVector()) naive += x * x;
      }
      auto unfused = RunOp("SquaredNorm", chunks, {});
      REQUIRE(unfused.ok());
      CHECK(fused->ScalarAt(r) == unfused->ScalarAt(0));  // bit for bit
      CHECK(fused->ScalarAt(r) == Approx(naive).epsilon(dt == DType::kF64 ? 1e-12 : 1e-6));
    }
    // Exact by hand: replica r's chunk is all (r + 1) / 2.
    const int64_t n = 3 * (1 << 14) + 5;
    std::vector<double> v;
    for (int64_t r = 0; r < kR; ++r) v.insert(v.end(), n, 0.5 * static_cast<double>(r + 1));
    auto big = RunOp("SquaredNorm", {MakeTensor(dt, {kR, n}, v)}, {{"replicas", kR}});
    REQUIRE(big.ok());
    for (int64_t r = 0; r < kR; ++r) CHECK(big->ScalarAt(r) == 0.25 * static_cast<double>((r + 1) * (r + 1) * n));
  }
}

TEST_CASE("ClipScale takes per-replica norms and per-replica max_norm") {
  for (DType dt : {DType::kF32, DType::kF64}) {
    INFO(DTypeName(dt));
    const Floats norms = {13, 4, 5}, max_norm = {6.5, 1, 20};
    const double tol = dt == DType::kF64 ? 1e-15 : 1e-7;
    auto fused = RunOp("ClipScale", {MakeTensor(dt, {kR}, norms)}, {{"replicas", kR}, {"max_norm", max_norm}});
    REQUIRE(fused.ok());
    REQUIRE(fused->shape() == Shape{kR});
    CHECK(fused->ScalarAt(0) == Approx(6.5 / (13 + 1e-6)).epsilon(tol));
    CHECK(fused->ScalarAt(1) == Approx(1 / (4 + 1e-6)).epsilon(tol));
    CHECK(fused->ScalarAt(2) == 1.0);
    for (int64_t r = 0; r < kR; ++r) {
      INFO("replica " << r);
      auto one = RunOp("ClipScale", {MakeTensor(dt, {}, {norms[r]})}, {{"max_norm", max_norm[r]}});
      REQUIRE(one.ok());
      CHECK(Bits(*one) == std::vector<uint64_t>{Bits(*fused)[r]});
    }
    // One max_norm for every replica; a NaN norm stays NaN.
    auto shared = RunOp("ClipScale", {MakeTensor(dt, {kR}, {13, kNaN, 0.5})}, {{"replicas", kR}, {"max_norm", 2.0}});
    REQUIRE(shared.ok());
    CHECK(shared->ScalarAt(0) == Approx(2.0 / (13 + 1e-6)).epsilon(tol));
    CHECK(std::isnan(shared->ScalarAt(1)));
    CHECK(shared->ScalarAt(2) == 1.0);
  }
}

TEST_CASE("IsFinite is 1 for finite values and 0 for NaN and infinities") {
  const double big = std::numeric_limits<double>::max(), tiny = std::numeric_limits<double>::denorm_min();
  auto f64 = RunOp("IsFinite", {MakeTensor(DType::kF64, {2, 4}, {0, -1.5, kNaN, kInf, -kInf, big, tiny, -0.0})}, {});
  REQUIRE(f64.ok());
  CHECK(f64->shape() == Shape{2, 4});
  CHECK(f64->dtype() == DType::kF64);
  CHECK(f64->ToDoubleVector() == std::vector<double>{1, 1, 0, 0, 0, 1, 1, 1});
  const float fbig = std::numeric_limits<float>::max(), ftiny = std::numeric_limits<float>::denorm_min();
  auto f32 = RunOp("IsFinite",
                   {Tensor::FromVector<float>({7}, {3.f, std::nanf(""), std::numeric_limits<float>::infinity(),
                                                    -std::numeric_limits<float>::infinity(), fbig, -fbig, ftiny})},
                   {});
  REQUIRE(f32.ok());
  CHECK(f32->dtype() == DType::kF32);
  CHECK(f32->ToDoubleVector() == std::vector<double>{1, 0, 0, 0, 1, 1, 1});
  // Large enough for several threads; one bad element in the middle.
  std::vector<double> many(100000, 2.0);
  many[70001] = kNaN;
  auto par = RunOp("IsFinite", {MakeTensor(DType::kF32, {100000}, many)}, {});
  REQUIRE(par.ok());
  const std::vector<double> flags = par->ToDoubleVector();
  CHECK(std::count(flags.begin(), flags.end(), 0.0) == 1);
  CHECK(flags[70001] == 0);
}

TEST_CASE("divergence detection freezes a replica whose gradient or loss is not finite") {
  // active = IsFinite(squared grad norm) * IsFinite(loss) * mask, then one
  // fused SGD step: replica 0 has an infinite gradient, replica 1 a NaN
  // loss, replica 3 is masked off; only replica 2 moves.
  Graph g;
  GraphBuilder b(&g);
  const TensorType pt{Shape{4, 2}, DType::kF64}, rt{Shape{4}, DType::kF64}, st{Shape{}, DType::kF64};
  ValueId p = b.Input("p", pt), grad = b.Input("g", pt), loss = b.Input("loss", rt), mask = b.Input("mask", rt),
          lr = b.Input("lr", rt), step = b.Input("step", st);
  auto sq = b.Add1("SquaredNorm", {grad}, {{"replicas", int64_t{4}}}, "sq");
  REQUIRE(sq.ok());
  auto fin_g = b.Add1("IsFinite", {*sq}, {}, "finite_grad");
  auto fin_l = b.Add1("IsFinite", {loss}, {}, "finite_loss");
  REQUIRE((fin_g.ok() && fin_l.ok()));
  auto both = b.Add1("Mul", {*fin_g, *fin_l}, {}, "both");
  REQUIRE(both.ok());
  auto active = b.Add1("Mul", {*both, mask}, {}, "active");
  REQUIRE(active.ok());
  auto upd = b.Add1("SgdUpdate", {p, grad, lr, step, *active}, {{"replicas", int64_t{4}}}, "update");
  REQUIRE(upd.ok());
  g.outputs()["p"] = *upd;
  g.outputs()["active"] = *active;
  auto exec = Executor::Create(g);
  REQUIRE(exec.ok());
  auto out = (*exec)->Run({{"p", MakeTensor(DType::kF64, {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8})},
                           {"g", MakeTensor(DType::kF64, {4, 2}, {kInf, 1, 1, 1, 1, 1, 1, 1})},
                           {"loss", MakeTensor(DType::kF64, {4}, {0.5, kNaN, 0.5, 0.5})},
                           {"mask", MakeTensor(DType::kF64, {4}, {1, 1, 1, 0})},
                           {"lr", MakeTensor(DType::kF64, {4}, {0.5, 0.5, 0.5, 0.5})},
                           {"step", MakeTensor(DType::kF64, {}, {1})}});
  REQUIRE(out.ok());
  CHECK(out->at("active").ToDoubleVector() == std::vector<double>{0, 0, 1, 0});
  CHECK(out->at("p").ToDoubleVector() == std::vector<double>{1, 2, 3, 4, 4.5, 5.5, 7, 8});
}

TEST_CASE("the fused ops check replicas, shapes and per-replica attributes") {
  using Catch::Matchers::Contains;
  const TensorType p{Shape{kR, 4}, DType::kF64}, v{Shape{kR}, DType::kF64}, s{Shape{}, DType::kF64};
  auto error = [](const std::string& op, const AttrMap& attrs, const std::vector<TensorType>& in) {
    auto r = OpRegistry::Global().GetOp(op).value()->InferTypes(attrs, in);
    REQUIRE_FALSE(r.ok());
    return r.status().message();
  };
  auto infer = [](const std::string& op, const AttrMap& attrs, const std::vector<TensorType>& in) {
    return OpRegistry::Global().GetOp(op).value()->InferTypes(attrs, in);
  };
  const AttrMap fused = {{"replicas", kR}};
  auto ok = infer("SgdUpdate", fused, {p, p, v, s, v});
  REQUIRE(ok.ok());
  CHECK(*ok == std::vector<TensorType>{p});
  auto adam = infer("AdamUpdate", {{"replicas", kR}, {"amsgrad", true}}, {p, p, p, p, p, v, s, v});
  REQUIRE(adam.ok());
  CHECK(adam->size() == 4);

  // List lengths.
  CHECK_THAT(error("SgdUpdate", {{"replicas", kR}, {"momentum", Floats{0.9, 0.9}}}, {p, p, p, v, s, v}),
             Contains("SgdUpdate: attribute momentum must be one float or a list of replicas = 3 floats, got a list "
                      "of 2"));
  CHECK_THAT(error("AdamUpdate", {{"replicas", kR}, {"eps", Floats{1, 2, 3, 4}}}, {p, p, p, p, v, s, v}),
             Contains("attribute eps must be one float or a list of replicas = 3 floats, got a list of 4"));
  CHECK_THAT(error("SgdUpdate", {{"momentum", Floats{0.9, 0.9, 0.9}}}, {p, p, p, s, s}),
             Contains("SgdUpdate: attribute momentum is a list of 3 value(s); per-replica values need the attribute "
                      "replicas"));
  CHECK_THAT(error("SgdUpdate", {{"replicas", int64_t{-2}}}, {p, p, v, s, v}),
             Contains("SgdUpdate: replicas must be >= 1 (absent or 0 = unfused), got -2"));
  // Range checks per value, naming the replica.
  CHECK_THAT(error("SgdUpdate", {{"replicas", kR}, {"momentum", Floats{0.9, -0.1, 0}}}, {p, p, p, v, s, v}),
             Contains("SgdUpdate: momentum[1] must be >= 0, got -0.1"));
  CHECK_THAT(error("AdamUpdate", {{"replicas", kR}, {"beta2", Floats{0.9, 0.99, 1.0}}}, {p, p, p, p, v, s, v}),
             Contains("AdamUpdate: beta2[2] must be in [0, 1), got 1"));
  CHECK_THAT(error("AdadeltaUpdate", {{"replicas", kR}, {"rho", Floats{kNaN, 0.9, 0.9}}}, {p, p, p, p, v, s, v}),
             Contains("AdadeltaUpdate: rho[0] must be in [0, 1], got nan"));
  CHECK_THAT(error("RmspropUpdate", {{"replicas", kR}, {"alpha", Floats{0.9, 0.9, -1}}}, {p, p, p, v, s, v}),
             Contains("RmspropUpdate: alpha[2] must be >= 0, got -1"));
  CHECK_THAT(error("SgdUpdate", {{"replicas", kR}, {"nesterov", true}, {"momentum", Floats{0.9, 0, 0.9}}},
                   {p, p, p, v, s, v}),
             Contains("nesterov needs momentum > 0 and dampening = 0 in every replica; replica 1 has momentum 0"));
  // Inputs: lr per replica, the active flags, dim 0 == R everywhere.
  CHECK_THAT(error("SgdUpdate", fused, {p, p, s, s, v}),
             Contains("SgdUpdate lr (one per replica) must have shape [3], got []"));
  CHECK_THAT(error("SgdUpdate", fused, {p, p, v, s}),
             Contains("SgdUpdate (param, grad, 0 state tensor(s), lr[R], step, active[R]) with replicas = 3 takes 5 "
                      "input(s), got 4"));
  CHECK_THAT(error("SgdUpdate", fused, {p, p, v, s, s}),
             Contains("SgdUpdate active (one flag per replica) must have shape [3], got []"));
  CHECK_THAT(error("SgdUpdate", fused, {p, p, v, v, v}), Contains("SgdUpdate step must be a scalar"));
  const TensorType p2{Shape{2, 4}, DType::kF64};
  CHECK_THAT(error("SgdUpdate", fused, {p2, p2, v, s, v}),
             Contains("SgdUpdate param must have dim 0 == replicas = 3, got shape [2, 4]"));
  CHECK_THAT(error("SgdUpdate", fused, {s, s, v, s, v}),
             Contains("SgdUpdate param must have dim 0 == replicas = 3, got shape []"));
  CHECK_THAT(error("SgdUpdate", fused, {p, p2, v, s, v}),
             Contains("SgdUpdate grad must have dim 0 == replicas = 3, got shape [2, 4]"));
  CHECK_THAT(error("AdamUpdate", fused, {p, p, p, p2, v, s, v}),
             Contains("AdamUpdate state input 3 must have dim 0 == replicas = 3, got shape [2, 4]"));
  CHECK_THAT(error("AdamUpdate", fused, {p, p, p, {Shape{kR, 5}, DType::kF64}, v, s, v}),
             Contains("AdamUpdate state input 3 must match the param"));
  CHECK_THAT(error("SgdUpdate", fused, {p, p, v, s, {Shape{kR}, DType::kF32}}),
             Contains("SgdUpdate: lr, step and active must have the param's dtype f64, got f32"));

  // SquaredNorm, ClipScale, IsFinite.
  auto sq = infer("SquaredNorm", fused, {p, v});
  REQUIRE(sq.ok());
  CHECK((*sq)[0].shape == Shape{kR});
  CHECK_THAT(error("SquaredNorm", fused, {p, p2}),
             Contains("SquaredNorm input 1 must have dim 0 == replicas = 3, got shape [2, 4]"));
  CHECK_THAT(error("SquaredNorm", fused, {p, s}), Contains("SquaredNorm input 1 must have dim 0 == replicas = 3"));
  CHECK_THAT(error("ClipScale", {{"replicas", kR}, {"max_norm", 1.0}}, {s}),
             Contains("ClipScale total_norm (one norm per replica) must have shape [3], got []"));
  CHECK_THAT(error("ClipScale", {{"replicas", kR}, {"max_norm", Floats{1, 2}}}, {v}),
             Contains("ClipScale: attribute max_norm must be one float or a list of replicas = 3 floats, got a list of "
                      "2"));
  CHECK_THAT(error("ClipScale", {{"replicas", kR}, {"max_norm", Floats{1, 0, 2}}}, {v}),
             Contains("ClipScale: max_norm[1] must be > 0, got 0"));
  CHECK_THAT(error("ClipScale", {{"max_norm", 1.0}}, {v}),
             Contains("ClipScale total_norm must be a scalar, got [3] (per-replica norms [R] need the attribute "
                      "replicas = R)"));
  CHECK_THAT(error("IsFinite", {}, {{Shape{2}, DType::kI64}}), Contains("IsFinite x must be f32 or f64, got i64"));
  CHECK_THAT(error("IsFinite", {}, {v, v}), Contains("IsFinite (x) takes 1 input(s), got 2"));
  const OpDef* is_finite = OpRegistry::Global().FindOp("IsFinite");
  REQUIRE(is_finite != nullptr);
  CHECK(OpRegistry::Global().SupportsOp("IsFinite", DeviceType::kCpu));
}

// ---- CUDA kernels against the CPU kernels (skipped without a GPU) ----

bool HaveCuda() { return testing::GpuAvailable(); }

// Every output on CUDA against the CPU: f64 to 1e-12 and f32 to 1e-6 of
// max(1, |cpu|); NaN where the CPU has NaN.
void CompareCudaToCpu(const std::string& label, const std::string& op, const std::vector<Tensor>& inputs,
                      const AttrMap& attrs) {
  INFO(label);
  auto cpu = RunOpOn(Device::Cpu(), op, inputs, attrs);
  REQUIRE(cpu.status().ToString() == "OK");
  auto gpu = RunOpOn(Device::Cuda(0), op, inputs, attrs);
  REQUIRE(gpu.status().ToString() == "OK");
  REQUIRE(cpu->size() == gpu->size());
  const double tol = inputs[0].dtype() == DType::kF64 ? 1e-12 : 1e-6;
  for (size_t k = 0; k < cpu->size(); ++k) {
    REQUIRE((*gpu)[k].shape() == (*cpu)[k].shape());
    const std::vector<double> want = (*cpu)[k].ToDoubleVector(), got = (*gpu)[k].ToDoubleVector();
    int64_t bad = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const bool ok = std::isnan(want[i]) ? std::isnan(got[i])
                                          : std::abs(got[i] - want[i]) <= tol * std::max(1.0, std::abs(want[i]));
      if (!ok && bad++ == 0) {
        INFO("output " << k << " element " << i << ": cpu " << want[i] << " cuda " << got[i]);
        CHECK(ok);
      }
    }
    CHECK(bad == 0);
  }
}

// Reproducible values in [lo, hi).
Tensor Uniform(DType dt, const Shape& shape, double lo, double hi, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (double& e : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    e = lo + (hi - lo) * static_cast<double>(x >> 11) / 9007199254740992.0;
  }
  return MakeTensor(dt, shape, v);
}

// (param, grad, slots, lr, step[, active]); slots in [0, 1) so that the
// squared averages are valid.
std::vector<Tensor> UpdateInputs(DType dt, const Shape& shape, int slots, const Floats& lr, double step,
                                 const Floats& active) {
  std::vector<Tensor> in = {Uniform(dt, shape, -1, 1, 1), Uniform(dt, shape, -1, 1, 2)};
  for (int k = 0; k < slots; ++k) in.push_back(Uniform(dt, shape, 0, 1, 3 + static_cast<uint64_t>(k)));
  in.push_back(MakeTensor(dt, active.empty() ? Shape{} : Shape{static_cast<int64_t>(lr.size())}, lr));
  in.push_back(MakeTensor(dt, {}, {step}));
  if (!active.empty()) in.push_back(MakeTensor(dt, {static_cast<int64_t>(active.size())}, active));
  return in;
}

// A loss-scaled unfused step passes a scalar `active` (0 after an fp16
// overflow): 0 leaves the param and every slot as they were, bit for bit; 1
// updates exactly as the op without the input.
TEST_CASE("an unfused update op with a scalar active input skips or applies the step") {
  const std::vector<std::pair<std::string, AttrMap>> ops = {
      {"SgdUpdate", {{"momentum", 0.9}}}, {"AdamUpdate", {{"amsgrad", true}}}, {"RmspropUpdate", {{"centered", true}}}};
  const int slots[] = {1, 3, 2};
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& [op, attrs] = ops[i];
    INFO(op);
    const std::vector<Tensor> in = UpdateInputs(DType::kF64, {37}, slots[i], {0.01}, 2, {});
    auto plain = RunOpOutputs(op, in, attrs);
    REQUIRE(plain.ok());
    std::vector<Tensor> with = in;
    with.push_back(MakeTensor(DType::kF64, {}, {1}));
    auto applied = RunOpOutputs(op, with, attrs);
    REQUIRE(applied.ok());
    with.back() = MakeTensor(DType::kF64, {}, {0});
    auto skipped = RunOpOutputs(op, with, attrs);
    REQUIRE(skipped.ok());
    REQUIRE(applied->size() == plain->size());
    for (size_t k = 0; k < plain->size(); ++k) {
      CHECK((*applied)[k].ToDoubleVector() == (*plain)[k].ToDoubleVector());
      // Output 0 is the param (input 0), output k the slot (input k + 1).
      CHECK((*skipped)[k].ToDoubleVector() == in[k == 0 ? 0 : k + 1].ToDoubleVector());
    }
    with.back() = MakeTensor(DType::kF64, {2}, {1, 1});
    auto bad = RunOpOutputs(op, with, attrs);
    REQUIRE(!bad.ok());
    CHECK_THAT(bad.status().message(), Catch::Contains(op + " active must be a scalar, got [2]"));
  }
}

struct UpdateCudaCase {
  std::string op;
  AttrMap attrs;
  int slots;
};

TEST_CASE("the CUDA update kernels match the CPU kernels, unfused and fused") {
  if (!HaveCuda()) return;  // no GPU here
  const std::vector<UpdateCudaCase> unfused = {
      {"SgdUpdate", {}, 0},
      {"SgdUpdate", {{"momentum", 0.9}, {"dampening", 0.1}, {"weight_decay", 0.01}}, 1},
      {"SgdUpdate", {{"momentum", 0.9}, {"nesterov", true}, {"weight_decay", 0.01}}, 1},
      {"AdamUpdate", {{"weight_decay", 0.1}}, 2},
      {"AdamUpdate", {{"weight_decay", 0.1}, {"decoupled", true}}, 2},
      {"AdamUpdate", {{"amsgrad", true}}, 3},
      {"AdadeltaUpdate", {{"weight_decay", 0.1}}, 2},
      {"RmspropUpdate", {{"weight_decay", 0.1}}, 1},
      {"RmspropUpdate", {{"momentum", 0.9}}, 2},
      {"RmspropUpdate", {{"centered", true}}, 2},
      {"RmspropUpdate", {{"centered", true}, {"momentum", 0.9}}, 3},
  };
  // Replica 1 has no momentum (its buffer chunk stays) and replica 2 is frozen.
  const std::vector<UpdateCudaCase> fused = {
      {"SgdUpdate", {{"replicas", kR}, {"momentum", Floats{0.9, 0, 0.5}}, {"weight_decay", Floats{0, 0.1, 0.2}}}, 1},
      {"AdamUpdate", {{"replicas", kR}, {"beta1", Floats{0.9, 0.8, 0.5}}, {"amsgrad", true}}, 3},
      {"AdamUpdate", {{"replicas", kR}, {"weight_decay", Floats{0.1, 0, 0.3}}, {"decoupled", true}}, 2},
      {"AdadeltaUpdate", {{"replicas", kR}, {"rho", Floats{0.9, 0.5, 0.95}}}, 2},
      {"RmspropUpdate", {{"replicas", kR}, {"momentum", Floats{0.9, 0, 0.5}}, {"centered", true}}, 3},
  };
  for (DType dt : {DType::kF32, DType::kF64}) {
    // Odd sizes: a vector body and a scalar tail; fused chunks of 1365
    // elements leave replicas 1 and 2 unaligned for 16-byte loads.
    for (const UpdateCudaCase& c : unfused)
      for (double step : {1.0, 3.0})
        CompareCudaToCpu(c.op + " " + DTypeName(dt) + " step " + std::to_string(step), c.op,
                         UpdateInputs(dt, {4099}, c.slots, {0.01}, step, {}), c.attrs);
    // Unfused with a scalar active (a loss-scaled step): 0 skips, 1 updates.
    for (double active : {0.0, 1.0}) {
      std::vector<Tensor> in = UpdateInputs(dt, {4099}, 1, {0.01}, 2, {});
      in.push_back(MakeTensor(dt, {}, {active}));
      CompareCudaToCpu("SgdUpdate active " + std::to_string(active) + " " + DTypeName(dt), "SgdUpdate", in,
                       {{"momentum", 0.9}});
    }
    for (const UpdateCudaCase& c : fused)
      CompareCudaToCpu("fused " + c.op + " " + DTypeName(dt), c.op,
                       UpdateInputs(dt, {kR, 1365}, c.slots, {0.01, 0.02, 0.03}, 2, {1, 1, 0}), c.attrs);
  }
}

// Five update nodes of one op and attributes, with sizes that give vector
// bodies, scalar tails and splits across threads, every output in place over
// the state (so the executor may run them as one group); grads, lr, step and
// active are fed.
struct UpdateGroupGraph {
  Graph graph;
  std::vector<std::pair<std::string, Tensor>> feeds;
};

UpdateGroupGraph MakeUpdateGroup(const UpdateCudaCase& c, DType dt, bool fused) {
  UpdateGroupGraph u;
  GraphBuilder b(&u.graph);
  const TensorType scalar{Shape{}, dt};
  const ValueId lr = b.Input("lr", fused ? TensorType{Shape{kR}, dt} : scalar);
  const ValueId step = b.Input("step", scalar);
  const ValueId active = fused ? b.Input("active", {Shape{kR}, dt}) : ValueId{-1};
  u.feeds.push_back({"lr", fused ? MakeTensor(dt, {kR}, {0.01, 0.02, 0.03}) : MakeTensor(dt, {}, {0.01})});
  u.feeds.push_back({"step", MakeTensor(dt, {}, {1})});
  if (fused) u.feeds.push_back({"active", MakeTensor(dt, {kR}, {1, 1, 0})});
  const int64_t sizes[] = {4099, 7, 70001, 33, 1};
  for (int k = 0; k < 5; ++k) {
    const std::string name = "w" + std::to_string(k);
    const Shape shape = fused ? Shape{kR, sizes[k]} : Shape{sizes[k]};
    const ValueId p = b.Parameter(name, {shape, dt}, {{"init", "uniform"}});
    const ValueId g = b.Input(name + "/grad", {shape, dt});
    u.feeds.push_back({name + "/grad", Uniform(dt, shape, -1, 1, 10 + static_cast<uint64_t>(k))});
    std::vector<ValueId> in = {p, g};
    for (int j = 0; j < c.slots; ++j)
      in.push_back(b.Buffer(name + "/slot" + std::to_string(j), {shape, dt},
                            {{"init", "uniform"}, {"low", 0.0}, {"high", 1.0}}));
    in.push_back(lr);
    in.push_back(step);
    if (fused) in.push_back(active);
    auto outs = b.Add(c.op, in, c.attrs, name + "/update");
    REQUIRE(outs.status().ToString() == "OK");
    for (size_t j = 0; j < outs->size(); ++j) u.graph.state_updates().push_back({in[j == 0 ? 0 : j + 1], (*outs)[j]});
  }
  return u;
}

// Two steps (step 1, then 2) of the group on `device`; the state after them.
std::map<std::string, Tensor> RunUpdateGroup(const UpdateGroupGraph& u, Device device, bool group_kernels,
                                             ThreadPool* pool, int* calls) {
  ExecutorOptions opts;
  opts.device = device;
  opts.pool = pool;
  opts.group_kernels = group_kernels;
  auto exec = Executor::Create(u.graph, opts);
  REQUIRE(exec.status().ToString() == "OK");
  *calls = (*exec)->kernel_calls_per_step();
  REQUIRE((*exec)->InitializeState(7).ToString() == "OK");
  std::map<std::string, Tensor> feeds(u.feeds.begin(), u.feeds.end());
  for (double step : {1.0, 2.0}) {
    feeds["step"] = MakeTensor(feeds["step"].dtype(), {}, {step});
    REQUIRE((*exec)->Run(feeds).status().ToString() == "OK");
  }
  std::map<std::string, Tensor> state;
  for (const std::string& name : (*exec)->StateNames())
    state[name] = (*exec)->GetState(name).value().To(Device::Cpu()).value();
  return state;
}

// The CPU's group kernels lay every node's pieces end to end and split them
// across the pool in one pass; each element is updated as the node's own
// kernel updates it, bit for bit. On a GPU the group is one multi-tensor
// launch, held to the CPU's results.
TEST_CASE("a group of update nodes run as one matches each node run alone, on every device") {
  const std::vector<std::pair<UpdateCudaCase, bool>> cases = {
      {{"SgdUpdate", {{"momentum", 0.9}, {"dampening", 0.1}, {"weight_decay", 0.01}}, 1}, false},
      {{"SgdUpdate", {}, 0}, false},
      {{"AdamUpdate", {{"amsgrad", true}, {"weight_decay", 0.1}}, 3}, false},
      {{"AdadeltaUpdate", {{"weight_decay", 0.1}}, 2}, false},
      {{"RmspropUpdate", {{"centered", true}, {"momentum", 0.9}}, 3}, false},
      {{"SgdUpdate", {{"replicas", kR}, {"momentum", Floats{0.9, 0, 0.5}}, {"weight_decay", Floats{0, 0.1, 0.2}}}, 1},
       true},
      {{"AdamUpdate", {{"replicas", kR}, {"beta1", Floats{0.9, 0.8, 0.5}}, {"decoupled", true}}, 2}, true},
      {{"RmspropUpdate", {{"replicas", kR}, {"momentum", Floats{0.9, 0, 0.5}}, {"centered", true}}, 3}, true},
  };
  // Two threads wherever the test runs, so that the pieces are split.
  auto pool = ThreadPool::Create(2);
  REQUIRE(pool.status().ToString() == "OK");
  for (const auto& [c, fused] : cases) {
    for (DType dt : {DType::kF32, DType::kF64}) {
      INFO(c.op << (fused ? " fused " : " ") << DTypeName(dt));
      const UpdateGroupGraph u = MakeUpdateGroup(c, dt, fused);
      int alone_calls = 0, group_calls = 0;
      const auto alone = RunUpdateGroup(u, Device::Cpu(), false, pool->get(), &alone_calls);
      const auto grouped = RunUpdateGroup(u, Device::Cpu(), true, pool->get(), &group_calls);
      CHECK(alone_calls == 5);
      CHECK(group_calls == 1);
      REQUIRE(alone.size() == grouped.size());
      for (const auto& [name, t] : alone) {
        INFO(name);
        CHECK(grouped.at(name).ToDoubleVector() == t.ToDoubleVector());
      }
      if (!HaveCuda()) continue;
      int gpu_calls = 0;
      const auto gpu = RunUpdateGroup(u, Device::Cuda(0), true, nullptr, &gpu_calls);
      CHECK(gpu_calls == 1);
      const double tol = dt == DType::kF64 ? 1e-12 : 1e-6;
      for (const auto& [name, t] : alone) {
        INFO(name << " on CUDA");
        const std::vector<double> want = t.ToDoubleVector(), got = gpu.at(name).ToDoubleVector();
        REQUIRE(got.size() == want.size());
        int64_t bad = 0;
        for (size_t i = 0; i < want.size(); ++i)
          if (!(std::abs(got[i] - want[i]) <= tol * std::max(1.0, std::abs(want[i])))) ++bad;
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("the CUDA clipping and divergence kernels match the CPU kernels") {
  if (!HaveCuda()) return;  // no GPU here
  for (DType dt : {DType::kF32, DType::kF64}) {
    const std::string d = DTypeName(dt);
    // Several tiles of the two-pass reduction, several small inputs, an empty one.
    CompareCudaToCpu("SquaredNorm " + d, "SquaredNorm",
                     {Uniform(dt, {40003}, -1, 1, 1), Uniform(dt, {3, 5}, -2, 2, 2), MakeTensor(dt, {0}, {}),
                      Uniform(dt, {}, -1, 1, 3)},
                     {});
    CompareCudaToCpu("SquaredNorm of nothing " + d, "SquaredNorm", {MakeTensor(dt, {0}, {})}, {});
    CompareCudaToCpu("fused SquaredNorm " + d, "SquaredNorm",
                     {Uniform(dt, {kR, 20001}, -1, 1, 4), Uniform(dt, {kR, 7}, -1, 1, 5)}, {{"replicas", kR}});
    CompareCudaToCpu("ClipScale " + d, "ClipScale", {MakeTensor(dt, {}, {13})}, {{"max_norm", 6.5}});
    CompareCudaToCpu("fused ClipScale " + d, "ClipScale", {MakeTensor(dt, {kR}, {13, kNaN, 0.5})},
                     {{"replicas", kR}, {"max_norm", Floats{6.5, 1, kInf}}});
    CompareCudaToCpu("IsFinite " + d, "IsFinite", {MakeTensor(dt, {6}, {0, -1.5, kNaN, kInf, -kInf, 1e30})}, {});
  }
}

}  // namespace
}  // namespace loom
