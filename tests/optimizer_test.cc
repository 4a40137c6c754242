// Optimizer updates built by BuildTrainingGraph against hand-computed
// updates (torch.optim semantics) for a few steps, in f64.
#include <catch2/catch.hpp>

#include <cmath>

#include "graph/model.h"
#include "graph/training.h"
#include "runtime/executor.h"

namespace loom {
namespace {

// loss = sum(p * p * w) / 2 with fixed w: grad = p * w, so the gradient
// changes every step and momentum / moments are exercised.
struct Problem {
  std::vector<double> p0 = {0.5, -1.0, 2.0};
  std::vector<double> w = {1.0, 0.5, -0.25};
};

std::vector<double> RunLoom(const OptimizerConfig& opt, const Problem& pr, int steps, double lr) {
  Model m(DType::kF64);
  Sym p = m.parameter("p", {3}, InitZeros());
  Sym w = m.input("w", {3});
  Sym loss = m.op("SumToShape", {m.scale(m.mul(m.mul(p, p), w), 0.5)}, AttrMap{{"shape", std::vector<int64_t>{}}})[0];
  m.set_output("loss", loss);
  REQUIRE(m.status().ok());
  auto train = BuildTrainingGraph(m.graph(), "loss", opt);
  REQUIRE(train.status().ToString() == "OK");
  auto exec = Executor::Create(*train);
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(0).ok());
  REQUIRE((*exec)->SetState("p", Tensor::FromVector<double>({3}, pr.p0)).ok());
  for (int s = 1; s <= steps; ++s) {
    std::map<std::string, Tensor> feeds = {{"w", Tensor::FromVector<double>({3}, pr.w)},
                                           {"lr", Tensor::FromVector<double>({}, {lr})}};
    feeds["step"] = Tensor::FromVector<double>({}, {static_cast<double>(s)});
    REQUIRE((*exec)->Run(feeds).ok());
  }
  return (*exec)->GetState("p")->ToDoubleVector();
}

std::vector<double> RunReference(const OptimizerConfig& o, const Problem& pr, int steps, double lr) {
  std::vector<double> p = pr.p0, buf(3, 0), m(3, 0), v(3, 0);
  for (int t = 1; t <= steps; ++t) {
    for (int i = 0; i < 3; ++i) {
      double g = p[i] * pr.w[i];
      if (o.type == "sgd") {
        g += o.weight_decay * p[i];
        buf[i] = t == 1 ? g : o.momentum * buf[i] + (1 - o.dampening) * g;  // torch: first buf = grad
        double d = o.momentum == 0 ? g : (o.nesterov ? g + o.momentum * buf[i] : buf[i]);
        p[i] -= lr * d;
      } else {
        if (o.type == "adamw") p[i] *= 1 - lr * o.weight_decay;
        else g += o.weight_decay * p[i];
        m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
        v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
        double mhat = m[i] / (1 - std::pow(o.beta1, t)), vhat = v[i] / (1 - std::pow(o.beta2, t));
        p[i] -= lr * mhat / (std::sqrt(vhat) + o.eps);
      }
    }
  }
  return p;
}

void Compare(const OptimizerConfig& o, double lr) {
  Problem pr;
  std::vector<double> got = RunLoom(o, pr, 4, lr), want = RunReference(o, pr, 4, lr);
  for (int i = 0; i < 3; ++i) {
    INFO(o.type << " element " << i);
    CHECK(got[i] == Approx(want[i]).epsilon(1e-12));
    CHECK(got[i] != Approx(pr.p0[i]));  // it moved
  }
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
}

TEST_CASE("BuildTrainingGraph rejects bad requests clearly") {
  Model m(DType::kF64);
  Sym p = m.parameter("p", {3}, InitZeros());
  m.set_output("loss", m.op("SumToShape", {p}, AttrMap{{"shape", std::vector<int64_t>{}}})[0]);
  OptimizerConfig o;
  auto missing = BuildTrainingGraph(m.graph(), "los", o);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("no output named 'los'") != std::string::npos);
  o.type = "lion";
  auto unknown = BuildTrainingGraph(m.graph(), "loss", o);
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.status().message().find("unknown optimizer 'lion'") != std::string::npos);
}

}  // namespace
}  // namespace loom
