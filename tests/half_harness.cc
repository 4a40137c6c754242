#include "tests/half_harness.h"

#include <catch2/catch.hpp>

#include <cmath>

#include "core/half.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "runtime/executor.h"

namespace loom::testing {

std::vector<double> RandomHalfValues(int64_t n, DType low, Rng& rng) {
  std::vector<double> v(n);
  for (double& x : v) {
    const float f = static_cast<float>(rng.Uniform(-1, 1));
    x = low == DType::kBF16 ? ToFloat(ToBFloat16(f)) : ToFloat(ToFloat16(f));
  }
  return v;
}

Tensor HalfTensor(const Shape& shape, const std::vector<double>& values, DType low) {
  return Tensor::FromVector<double>(shape, values).Cast(low).value();
}

void CheckHalf(const Tensor& got, const Exact& want, DType low, int64_t k, const std::string& what) {
  INFO(what);
  REQUIRE(got.dtype() == low);
  REQUIRE(got.numel() == static_cast<int64_t>(want.value.size()));
  const Tensor g = got.Cast(DType::kF64).value();
  const double ulp = low == DType::kBF16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
  int bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double accumulation = 4.0 * static_cast<double>(k) * std::ldexp(1.0, -24) * want.magnitude[i];
    const double tol = ulp * std::abs(want.value[i]) + accumulation;
    if (std::abs(g.data<double>()[i] - want.value[i]) > tol && bad++ < 5) {
      INFO("element " << i << ": got " << g.data<double>()[i] << ", want " << want.value[i] << " +- " << tol);
      CHECK(false);
    }
  }
  CHECK(bad == 0);
}

HalfOpRun RunHalfOp(const std::string& op, const AttrMap& attrs, const std::vector<Shape>& shapes,
                    const std::vector<std::vector<double>>& values, const Shape& y_shape,
                    const std::vector<double>& g_values, DType low, Device device) {
  Graph graph;
  GraphBuilder b(&graph);
  std::vector<ValueId> ins;
  for (size_t i = 0; i < shapes.size(); ++i) ins.push_back(b.Input("in" + std::to_string(i), {shapes[i], low}));
  ValueId y = b.Add1(op, ins, attrs, "op").value();
  ValueId g = b.Input("g", {y_shape, DType::kF32});
  ValueId y32 = b.Add1("Cast", {y}, AttrMap{{"to", std::string("f32")}}, "y32").value();
  ValueId loss = b.Add1("SumToShape", {b.Add1("Mul", {y32, g}, {}, "weighted").value()},
                        AttrMap{{"shape", std::vector<int64_t>{}}}, "loss")
                     .value();
  auto grads = BuildGradients(&graph, loss, ins);
  REQUIRE(grads.status().ToString() == "OK");
  graph.outputs() = {{"y", y}};
  for (size_t i = 0; i < ins.size(); ++i) {
    REQUIRE(graph.type(grads->at(ins[i])).dtype == low);
    graph.outputs()["d" + std::to_string(i)] = grads->at(ins[i]);
  }
  ExecutorOptions opts;
  opts.device = device;
  auto exec = Executor::Create(graph, opts);
  REQUIRE(exec.status().ToString() == "OK");
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < shapes.size(); ++i) feeds["in" + std::to_string(i)] = HalfTensor(shapes[i], values[i], low);
  feeds["g"] = Tensor::FromVector<double>(y_shape, g_values).Cast(DType::kF32).value();
  auto got = (*exec)->Run(feeds);
  REQUIRE(got.status().ToString() == "OK");
  return HalfOpRun{*got};
}

}  // namespace loom::testing
