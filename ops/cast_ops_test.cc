#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/half.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "runtime/executor.h"
#include "tests/op_harness.h"

namespace loom::testing {
namespace {

using Catch::Contains;

AttrMap To(const char* dtype) { return AttrMap{{"to", std::string(dtype)}}; }

// y = x rounded to f32 (the harness's f64 run narrows; its f32 run is the identity).
ReferenceFn RoundedToF32() {
  return [](const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
    Tensor y = ZerosF64(in[0].shape());
    for (int64_t i = 0; i < y.numel(); ++i) At(y, i) = static_cast<double>(static_cast<float>(At(in[0], i)));
    return std::vector<Tensor>{y};
  };
}

ReferenceFn Same() {
  return [](const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
    Tensor y = ZerosF64(in[0].shape());
    for (int64_t i = 0; i < y.numel(); ++i) At(y, i) = At(in[0], i);
    return std::vector<Tensor>{y};
  };
}

// The harness runs every case in f32 and f64, so the cases cast between
// those two: "to f64" widens in the f32 run (the one CUDA runs too) and "to
// f32" narrows in the f64 run. Gradients are left to the test below: the
// harness's loss graph feeds its weights in the run's dtype, not in the
// output's, and finite differences through an f32 rounding mean nothing.
TEST_CASE("cast ops pass the op harness") {
  std::vector<OpCase> cases = {
      {"cast to f64", "Cast", To("f64"), {InputSpec::Uniform({3, 5})}, Same()},
      {"cast to f64 rank 0", "Cast", To("f64"), {InputSpec::Uniform({})}, Same()},
      {"cast to f64 large (threaded, many blocks)", "Cast", To("f64"), {InputSpec::Uniform({300, 257}, -100, 100)},
       Same()},
      {"cast to f32", "Cast", To("f32"), {InputSpec::Uniform({7, 143}, -3, 3)}, RoundedToF32()},
      {"cast to f32 empty", "Cast", To("f32"), {InputSpec::Uniform({0, 4})}, RoundedToF32()},
  };
  for (OpCase& c : cases) {
    c.check_gradient = false;
    c.f64_tolerance = 0;  // the f64 run is exact: the identity, or one rounding the reference makes too
  }
  for (const OpCase& c : cases) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

// Values that exercise every rounding path: ties to even in both formats,
// the f16 overflow threshold, subnormals, signed zeros, inf and NaN.
std::vector<float> SpecialValues() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -2.5f, 0.1f, 65504.0f, 65519.0f, 65520.0f, -65520.0f, 1e10f, inf, -inf,
                          std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::max(),
                          std::ldexp(1.0f, -14), std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(3.0f, -25),
                          std::ldexp(2047.0f, -25), std::ldexp(1.0f, -133), FloatFromBits(0x00000001u),
                          FloatFromBits(0x3F808000u), FloatFromBits(0x3F818000u), FloatFromBits(0x3F808001u),
                          1.0f + std::ldexp(1.0f, -11), 1.0f + 3 * std::ldexp(1.0f, -11), 4095.0f / 2048.0f};
  Rng rng(5);
  // Random values over many binades, enough for several threads and blocks.
  while (v.size() < 70000) v.push_back(static_cast<float>(rng.Uniform(-1, 1) * std::pow(2.0, rng.Uniform(-30, 20))));
  return v;
}

TEST_CASE("Cast rounds f32 to bf16 and f16 as core/half.h does, and back exactly") {
  const std::vector<float> values = SpecialValues();
  const int64_t n = static_cast<int64_t>(values.size());
  Graph graph;
  GraphBuilder b(&graph);
  ValueId x = b.Input("x", {{n}, DType::kF32});
  ValueId bf = b.Add1("Cast", {x}, To("bf16"), "to_bf16").value();
  ValueId h = b.Add1("Cast", {x}, To("f16"), "to_f16").value();
  graph.outputs() = {{"bf16", bf},
                     {"f16", h},
                     {"bf16_f32", b.Add1("Cast", {bf}, To("f32"), "bf16_f32").value()},
                     {"f16_f64", b.Add1("Cast", {h}, To("f64"), "f16_f64").value()},
                     {"bf16_f16", b.Add1("Cast", {bf}, To("f16"), "bf16_f16").value()},
                     {"same", b.Add1("Cast", {x}, To("f32"), "same").value()}};
  for (Device device : TestDevices()) {
    INFO("on " << device.ToString());
    ExecutorOptions opts;
    opts.device = device;
    auto exec = Executor::Create(graph, opts);
    REQUIRE(exec.status().ToString() == "OK");
    auto got = (*exec)->Run({{"x", Tensor::FromVector<float>({n}, values)}});
    REQUIRE(got.status().ToString() == "OK");
    const BFloat16* gb = (*got)["bf16"].data<BFloat16>();
    const Float16* gh = (*got)["f16"].data<Float16>();
    const float* gbf = (*got)["bf16_f32"].data<float>();
    const double* ghd = (*got)["f16_f64"].data<double>();
    const Float16* gbh = (*got)["bf16_f16"].data<Float16>();
    const float* same = (*got)["same"].data<float>();
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float f = values[i];
      const BFloat16 eb = ToBFloat16(f);
      const Float16 eh = ToFloat16(f);
      bool ok = gb[i].bits == eb.bits && gh[i].bits == eh.bits && FloatBits(gbf[i]) == FloatBits(ToFloat(eb)) &&
                gbh[i].bits == ToFloat16(ToFloat(eb)).bits && FloatBits(same[i]) == FloatBits(f);
      const double hd = static_cast<double>(ToFloat(eh));
      ok = ok && (std::isnan(hd) ? std::isnan(ghd[i]) : ghd[i] == hd);
      if (!ok && bad++ < 5) {
        INFO("element " << i << " = " << f << ": bf16 " << gb[i].bits << " (want " << eb.bits << "), f16 "
                        << gh[i].bits << " (want " << eh.bits << ")");
        CHECK(ok);
      }
    }
    CHECK(bad == 0);
    // The values core/half_test.cc pins down, through the kernels.
    CHECK(gh[3].bits == 0xC100);
    CHECK(gh[7].bits == 0x7C00);   // 65520 -> inf
    CHECK(gh[15].bits == 0x0001);  // 2^-24
    CHECK(gh[16].bits == 0x0000);  // 2^-25: tie to even 0
    CHECK(gh[12].bits == 0x7E00);  // NaN
    CHECK(gb[21].bits == 0x3F80);  // bf16 ties to even
    CHECK(gb[22].bits == 0x3F82);
    CHECK(gb[12].bits == 0x7FC0);
  }
}

TEST_CASE("Cast narrows f64 with one rounding") {
  const std::vector<double> values = {65519.99999, 65520.0, 1.0 + std::ldexp(1.0, -8),
                                      1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40), 1e300, -1e-300};
  const int64_t n = static_cast<int64_t>(values.size());
  Graph graph;
  GraphBuilder b(&graph);
  ValueId x = b.Input("x", {{n}, DType::kF64});
  graph.outputs() = {{"f16", b.Add1("Cast", {x}, To("f16"), "to_f16").value()},
                     {"bf16", b.Add1("Cast", {x}, To("bf16"), "to_bf16").value()}};
  for (Device device : TestDevices()) {
    INFO("on " << device.ToString());
    ExecutorOptions opts;
    opts.device = device;
    auto exec = Executor::Create(graph, opts);
    REQUIRE(exec.status().ToString() == "OK");
    auto got = (*exec)->Run({{"x", Tensor::FromVector<double>({n}, values)}});
    REQUIRE(got.status().ToString() == "OK");
    const Float16* h = (*got)["f16"].data<Float16>();
    const BFloat16* bf = (*got)["bf16"].data<BFloat16>();
    CHECK(h[0].bits == 0x7BFF);
    CHECK(h[1].bits == 0x7C00);
    CHECK(bf[2].bits == 0x3F80);
    CHECK(bf[3].bits == 0x3F81);
    CHECK(h[4].bits == 0x7C00);
    CHECK(bf[4].bits == 0x7F80);
    CHECK(h[5].bits == 0x8000);
  }
}

// y = Cast(Cast(x, bf16), f32); the backward casts dy = w to bf16 and back,
// so the gradient is w rounded to bf16.
TEST_CASE("Cast's gradient casts back to the input dtype") {
  const int64_t n = 40;
  Graph graph;
  GraphBuilder b(&graph);
  ValueId x = b.Input("x", {{n}, DType::kF32});
  ValueId w = b.Input("w", {{n}, DType::kF32});
  ValueId low = b.Add1("Cast", {x}, To("bf16"), "low").value();
  ValueId y = b.Add1("Cast", {low}, To("f32"), "y").value();
  ValueId loss =
      b.Add1("SumToShape", {b.Add1("Mul", {y, w}, {}, "").value()}, AttrMap{{"shape", std::vector<int64_t>{}}}, "loss")
          .value();
  const int nodes_before = graph.num_nodes();
  auto grads = BuildGradients(&graph, loss, {x});
  REQUIRE(grads.status().ToString() == "OK");
  // The backward of each forward Cast is one Cast to its input's dtype.
  int backward_casts = 0;
  for (const Node& node : graph.nodes()) {
    if (node.id < nodes_before || node.op != "Cast") continue;
    ++backward_casts;
    const DType in = graph.type(node.inputs[0]).dtype, out = graph.type(node.outputs[0]).dtype;
    CHECK(((in == DType::kF32 && out == DType::kBF16) || (in == DType::kBF16 && out == DType::kF32)));
  }
  CHECK(backward_casts == 2);
  CHECK(graph.type(grads->at(x)).dtype == DType::kF32);
  graph.outputs() = {{"dx", grads->at(x)}};
  Rng rng(9);
  std::vector<float> xs(n), ws(n);
  for (int64_t i = 0; i < n; ++i) {
    xs[i] = static_cast<float>(rng.Uniform(-1, 1));
    ws[i] = static_cast<float>(rng.Uniform(-1, 1));
  }
  for (Device device : TestDevices()) {
    INFO("on " << device.ToString());
    ExecutorOptions opts;
    opts.device = device;
    auto exec = Executor::Create(graph, opts);
    REQUIRE(exec.status().ToString() == "OK");
    auto got = (*exec)->Run({{"x", Tensor::FromVector<float>({n}, xs)}, {"w", Tensor::FromVector<float>({n}, ws)}});
    REQUIRE(got.status().ToString() == "OK");
    for (int64_t i = 0; i < n; ++i) CHECK((*got)["dx"].data<float>()[i] == ToFloat(ToBFloat16(ws[i])));
  }
}

TEST_CASE("Cast type inference, attributes and cost") {
  CHECK_THAT(InferError("Cast", To("i32"), {{{2}, DType::kF32}}), Contains("to must be f32, f64, bf16 or f16, got 'i32'"));
  CHECK_THAT(InferError("Cast", To("f8"), {{{2}, DType::kF32}}), Contains("got 'f8'"));
  CHECK_THAT(InferError("Cast", To("f32"), {{{2}, DType::kI64}}), Contains("Cast input must be f32, f64, bf16 or f16, got i64"));
  CHECK_THAT(InferError("Cast", To("f32"), {}), Contains("Cast (x)"));
  CHECK_THAT(InferError("Cast", {}, {{{2}, DType::kF32}}), Contains("to"));
  const OpDef& op = *OpRegistry::Global().GetOp("Cast").value();
  auto types = InferOpTypes(op, To("bf16"), {{{2, 3}, DType::kF32}});
  REQUIRE(types.ok());
  CHECK((*types)[0] == TensorType{{2, 3}, DType::kBF16});
  OpCost cost = op.Cost(To("bf16"), {{{2, 3}, DType::kF32}}, *types);
  CHECK(cost.flops == 6);
  CHECK(cost.bytes_read == 24);
  CHECK(cost.bytes_written == 12);
  CHECK(op.fusion_kind() == FusionKind::kFused);
}

}  // namespace
}  // namespace loom::testing
