#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "graph/builder.h"
#include "runtime/executor.h"
#include "tests/op_harness.h"

namespace loom::testing {
namespace {

using Catch::Contains;

// torch._amp_update_scale_ element by element (found_inf = !(finite > 0)).
ReferenceFn LossScaleReference() {
  return [](const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
    const double growth = attrs.Float("growth_factor"), backoff = attrs.Float("backoff_factor");
    const double interval = static_cast<double>(attrs.Int("growth_interval"));
    Tensor scale = ZerosF64(in[0].shape()), good = ZerosF64(in[0].shape());
    for (int64_t i = 0; i < scale.numel(); ++i) {
      const double s = At(in[0], i), count = At(in[1], i) + 1;
      if (!(At(in[2], i) > 0)) {
        At(scale, i) = s * backoff;
        At(good, i) = 0;
      } else if (count >= interval) {
        At(scale, i) = std::isfinite(s * growth) ? s * growth : s;
        At(good, i) = 0;
      } else {
        At(scale, i) = s;
        At(good, i) = count;
      }
    }
    return std::vector<Tensor>{scale, good};
  };
}

OpCase Case(const std::string& name, Shape shape, AttrMap attrs, double good_high) {
  OpCase c{name,
           "LossScaleUpdate",
           std::move(attrs),
           {InputSpec::Constant(shape, 1, 65536), InputSpec::Constant(shape, 0, good_high),
            InputSpec::Constant(shape, -1, 1)},  // finite <= 0 for about half: those overflowed
           LossScaleReference()};
  c.check_gradient = false;
  return c;
}

TEST_CASE("loss scale ops pass the op harness") {
  std::vector<OpCase> cases = {
      Case("loss scale update, 8 replicas", {8}, {{"growth_interval", int64_t{3}}}, 3),
      Case("loss scale update, one scaler", {}, {{"growth_interval", int64_t{2}}}, 2),
      Case("loss scale update, other factors", {16}, {{"growth_interval", int64_t{2}}, {"growth_factor", 4.0},
                                                      {"backoff_factor", 0.25}}, 2),
      Case("loss scale update, many replicas (threads, blocks)", {70000}, {{"growth_interval", int64_t{5}}}, 5),
      Case("loss scale update, no replicas", {0}, {}, 1),
  };
  for (const OpCase& c : cases) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

// Four replicas' scalers over several steps, the state updated in place as
// a training step would: replica 2 overflows at step 1 and backs off alone;
// the others grow after growth_interval good steps in a row, replica 2
// three steps later.
TEST_CASE("one replica overflowing backs off alone; the others keep their scale and grow") {
  const int64_t R = 4;
  Graph graph;
  GraphBuilder b(&graph);
  const TensorType type{{R}, DType::kF32};
  ValueId scale = b.Buffer("scale", type, AttrMap{{"init", std::string("zeros")}});
  ValueId good = b.Buffer("good_steps", type, AttrMap{{"init", std::string("zeros")}});
  ValueId finite = b.Input("finite", type);
  auto outs = b.Add("LossScaleUpdate", {scale, good, finite}, {{"growth_interval", int64_t{3}}}, "update");
  REQUIRE(outs.status().ToString() == "OK");
  graph.state_updates() = {{scale, (*outs)[0]}, {good, (*outs)[1]}};
  graph.outputs() = {{"scale", (*outs)[0]}, {"good_steps", (*outs)[1]}};
  for (Device device : TestDevices()) {
    INFO("on " << device.ToString());
    ExecutorOptions opts;
    opts.device = device;
    auto exec = Executor::Create(graph, opts);
    REQUIRE(exec.status().ToString() == "OK");
    REQUIRE((*exec)->InitializeState(1).ok());
    REQUIRE((*exec)->SetState("scale", Tensor::FromVector<float>({R}, {65536, 65536, 65536, 1024})).ok());
    const std::vector<std::vector<float>> finite_per_step = {
        {1, 1, 1, 1}, {1, 1, 0, 1}, {1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1}};
    const std::vector<std::vector<float>> want_scale = {{65536, 65536, 65536, 1024},
                                                        {65536, 65536, 32768, 1024},
                                                        {131072, 131072, 32768, 2048},
                                                        {131072, 131072, 32768, 2048},
                                                        {131072, 131072, 65536, 2048}};
    const std::vector<std::vector<float>> want_good = {
        {1, 1, 1, 1}, {2, 2, 0, 2}, {0, 0, 1, 0}, {1, 1, 2, 1}, {2, 2, 0, 2}};
    for (size_t step = 0; step < finite_per_step.size(); ++step) {
      INFO("step " << step);
      auto got = (*exec)->Run({{"finite", Tensor::FromVector<float>({R}, finite_per_step[step])}});
      REQUIRE(got.status().ToString() == "OK");
      for (int64_t r = 0; r < R; ++r) {
        INFO("replica " << r);
        CHECK((*got)["scale"].data<float>()[r] == want_scale[step][static_cast<size_t>(r)]);
        CHECK((*got)["good_steps"].data<float>()[r] == want_good[step][static_cast<size_t>(r)]);
      }
    }
  }
}

TEST_CASE("loss scale update: NaN counts as an overflow; a scale that would overflow stays") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Graph graph;
  GraphBuilder b(&graph);
  const TensorType type{{3}, DType::kF32};
  ValueId scale = b.Input("scale", type), good = b.Input("good", type), finite = b.Input("finite", type);
  auto outs = b.Add("LossScaleUpdate", {scale, good, finite}, {{"growth_interval", int64_t{1}}}, "update");
  REQUIRE(outs.status().ToString() == "OK");
  graph.outputs() = {{"scale", (*outs)[0]}, {"good", (*outs)[1]}};
  for (Device device : TestDevices()) {
    INFO("on " << device.ToString());
    ExecutorOptions opts;
    opts.device = device;
    auto exec = Executor::Create(graph, opts);
    REQUIRE(exec.status().ToString() == "OK");
    auto got = (*exec)->Run({{"scale", Tensor::FromVector<float>({3}, {8, 3e38f, 8})},
                             {"good", Tensor::FromVector<float>({3}, {5, 0, 0})},
                             {"finite", Tensor::FromVector<float>({3}, {nan, 1, 1})}});
    REQUIRE(got.status().ToString() == "OK");
    const float* s = (*got)["scale"].data<float>();
    const float* g = (*got)["good"].data<float>();
    CHECK(s[0] == 4);
    CHECK(g[0] == 0);
    CHECK(s[1] == 3e38f);  // 6e38 is inf in f32: kept as it was
    CHECK(s[1] != inf);
    CHECK(g[1] == 0);
    CHECK(s[2] == 16);
    CHECK(g[2] == 0);
  }
}

TEST_CASE("loss scale update: type inference, attributes, in place, cost") {
  const TensorType r4{{4}, DType::kF32};
  CHECK_THAT(InferError("LossScaleUpdate", {}, {r4, r4}), Contains("(scale, good_steps, finite)"));
  CHECK_THAT(InferError("LossScaleUpdate", {}, {r4, {{4}, DType::kI64}, r4}), Contains("good_steps must have scale's type"));
  CHECK_THAT(InferError("LossScaleUpdate", {}, {r4, r4, {{3}, DType::kF32}}), Contains("finite must have scale's type"));
  CHECK_THAT(InferError("LossScaleUpdate", {}, {{{4}, DType::kI64}, r4, r4}), Contains("scale must be f32 or f64"));
  CHECK_THAT(InferError("LossScaleUpdate", {{"growth_factor", 1.0}}, {r4, r4, r4}), Contains("growth_factor"));
  CHECK_THAT(InferError("LossScaleUpdate", {{"backoff_factor", 1.0}}, {r4, r4, r4}), Contains("backoff_factor"));
  CHECK_THAT(InferError("LossScaleUpdate", {{"backoff_factor", 0.0}}, {r4, r4, r4}), Contains("backoff_factor"));
  CHECK_THAT(InferError("LossScaleUpdate", {{"growth_interval", int64_t{0}}}, {r4, r4, r4}),
             Contains("growth_interval must be in [1, 16777216], got 0"));
  const OpDef& op = *OpRegistry::Global().GetOp("LossScaleUpdate").value();
  AttrMap attrs;
  REQUIRE(CanonicalizeAttrs(op, &attrs).ok());
  CHECK(attrs.Float("growth_factor") == 2.0);
  CHECK(attrs.Float("backoff_factor") == 0.5);
  CHECK(attrs.Int("growth_interval") == 2000);
  CHECK(op.InPlaceInput(attrs, 0) == 0);
  CHECK(op.InPlaceInput(attrs, 1) == 1);
  OpCost cost = op.Cost(attrs, {r4, r4, r4}, {r4, r4});
  CHECK(cost.flops == 12);
}

}  // namespace
}  // namespace loom::testing
