#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "core/allocator.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "runtime/executor.h"
#include "tests/op_harness.h"

namespace loom::testing {
namespace {

// Naive attention over (q, k, v[, mask]) with the op's conventions: causal
// query i sees keys j <= i + query_offset (default Tk - Tq: bottom-right
// aligned), a nonzero
// mask entry excludes the key, and a query with no visible key gets zero
// weights and a zero output. Returns {out, probs}.
std::vector<Tensor> AttentionRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  const Shape &sq = in[0].shape(), &sv = in[2].shape();
  const int64_t B = sq[0], H = sq[1], Tq = sq[2], D = sq[3], Tk = in[1].shape()[2], Dv = sv[3];
  const double scale = attrs.Has("scale") ? attrs.Float("scale") : 1.0 / std::sqrt(static_cast<double>(D));
  const bool causal = attrs.Bool("causal");
  const int64_t query_offset = attrs.Has("query_offset") ? attrs.Int("query_offset") : Tk - Tq;
  Tensor out = ZerosF64({B, H, Tq, Dv}), probs = ZerosF64({B, H, Tq, Tk});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t row = (b * H + h) * Tq + i;
        std::vector<double> score(Tk);
        std::vector<bool> seen(Tk, false);
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < Tk; ++j) {
          bool padded = in.size() == 4 && in[3].ScalarAt(b * Tk + j) != 0;
          bool future = causal && j > i + query_offset;
          if (padded || future) continue;
          seen[j] = true;
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += At(in[0], row * D + d) * At(in[1], ((b * H + h) * Tk + j) * D + d);
          score[j] = scale * s;
          max = std::max(max, score[j]);
        }
        double total = 0;
        for (int64_t j = 0; j < Tk; ++j) total += seen[j] ? std::exp(score[j] - max) : 0.0;
        for (int64_t j = 0; j < Tk; ++j) {
          if (!seen[j]) continue;
          double w = std::exp(score[j] - max) / total;
          At(probs, row * Tk + j) = w;
          for (int64_t e = 0; e < Dv; ++e) At(out, row * Dv + e) += w * At(in[2], ((b * H + h) * Tk + j) * Dv + e);
        }
      }
  return {out, probs};
}

OpCase Attention(std::string name, AttrMap attrs, Shape q, Shape k, Shape v) {
  return {std::move(name), "ScaledDotProductAttention", std::move(attrs),
          {InputSpec::Uniform(std::move(q), -2, 2), InputSpec::Uniform(std::move(k), -2, 2),
           InputSpec::Uniform(std::move(v))},
          AttentionRef};
}

OpCase Masked(OpCase c, DType mask_dtype) {
  const Shape& q = c.inputs[0].shape;
  c.inputs.push_back(InputSpec::Index({q[0], c.inputs[1].shape[2]}, 2, mask_dtype));
  return c;
}

TEST_CASE("attention ops pass the op harness") {
  std::vector<OpCase> cases = {
      Attention("self attention", {}, {2, 2, 3, 4}, {2, 2, 3, 4}, {2, 2, 3, 4}),
      Attention("cross attention Tq != Tk, Dv != D", {}, {1, 2, 2, 3}, {1, 2, 4, 3}, {1, 2, 4, 5}),
      Attention("explicit scale", {{"scale", 0.8}}, {1, 2, 3, 2}, {1, 2, 4, 2}, {1, 2, 4, 3}),
      Attention("causal", {{"causal", true}}, {2, 1, 4, 3}, {2, 1, 4, 3}, {2, 1, 4, 2}),
      Attention("causal Tq < Tk (bottom-right)", {{"causal", true}}, {1, 2, 2, 3}, {1, 2, 5, 3}, {1, 2, 5, 2}),
      // Queries 0 and 1 see no key: zero weights and outputs, zero gradient.
      Attention("causal Tq > Tk (rows with no key)", {{"causal", true}}, {1, 2, 4, 3}, {1, 2, 2, 3}, {1, 2, 2, 3}),
      Masked(Attention("key padding mask i64", {}, {2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 3}), DType::kI64),
      Masked(Attention("key padding mask i32 causal scaled", {{"causal", true}, {"scale", 0.5}}, {3, 1, 4, 2},
                       {3, 1, 4, 2}, {3, 1, 4, 3}),
             DType::kI32),
      // The rows of a sequence split keep their key positions.
      Attention("causal query_offset (rows 2..4 of 6)", {{"causal", true}, {"query_offset", 2}}, {1, 2, 3, 3},
                {1, 2, 6, 3}, {1, 2, 6, 2}),
      Attention("causal query_offset < 0 (first rows see no key)", {{"causal", true}, {"query_offset", -1}},
                {2, 1, 3, 2}, {2, 1, 3, 2}, {2, 1, 3, 2}),
      Attention("query_offset without causal changes nothing", {{"query_offset", -5}}, {1, 1, 2, 2}, {1, 1, 3, 2},
                {1, 1, 3, 2}),
      Attention("larger (threaded rows and GEMMs)", {{"causal", true}}, {2, 4, 48, 16}, {2, 4, 48, 16}, {2, 4, 48, 8}),
      // Long rows: CUDA holds up to 1024 keys in one warp's registers and
      // gives longer rows a block each.
      Masked(Attention("300 keys, causal Tq < Tk, padded", {{"causal", true}}, {1, 2, 5, 4}, {1, 2, 300, 4},
                       {1, 2, 300, 3}),
             DType::kI64),
      Masked(Attention("1100 keys, causal Tq < Tk, padded", {{"causal", true}}, {1, 1, 3, 4}, {1, 1, 1100, 4},
                       {1, 1, 1100, 2}),
             DType::kI32),
  };
  OpCase out_only = Attention("loss on the output only", {}, {1, 2, 3, 2}, {1, 2, 4, 2}, {1, 2, 4, 3});
  out_only.loss_outputs = {0};
  cases.push_back(out_only);
  OpCase probs_only = Masked(Attention("loss on the weights only", {}, {2, 1, 3, 2}, {2, 1, 4, 2}, {2, 1, 4, 3}),
                             DType::kI64);
  probs_only.loss_outputs = {1};
  cases.push_back(probs_only);
  for (const OpCase& c : cases) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

Tensor RandomF64(const Shape& shape, Rng& rng) {
  Tensor t = ZerosF64(shape);
  for (int64_t i = 0; i < t.numel(); ++i) At(t, i) = rng.Uniform(-1.5, 1.5);
  return t;
}

// Mask [2, 4] of the given dtype: batch 0 pads keys 1 and 3, batch 1 pads
// every key (so all of its queries see nothing).
Tensor MaskOf(DType dtype) {
  const std::vector<int> padded = {0, 1, 0, 1, 1, 1, 1, 1};
  Tensor m = Tensor::Zeros({2, 4}, dtype);
  // Floats other than 1 are still "padded": any nonzero value counts.
  for (int64_t i = 0; i < m.numel(); ++i) {
    if (!padded[i]) continue;
    switch (dtype) {
      case DType::kBool: m.data<bool>()[i] = true; break;
      case DType::kF32: m.data<float>()[i] = -0.25f; break;
      case DType::kF64: m.data<double>()[i] = 3.0; break;
      default: m.data<int64_t>()[i] = 7; break;
    }
  }
  return m;
}

// Forward against the reference, exact zeros for the all-padded batch,
// exact zero gradients for padded keys, and every gradient against central
// finite differences: for masks the harness cannot draw (bool, float, and
// a fully padded batch row).
TEST_CASE("attention key padding mask of any dtype, fully padded rows") {
  for (Device device : TestDevices())
    for (DType mask_dtype : {DType::kBool, DType::kF32, DType::kF64, DType::kI64}) {
      DYNAMIC_SECTION("mask " << DTypeName(mask_dtype) << " on " << device.ToString()) {
        const Shape qs{2, 2, 3, 3}, ks{2, 2, 4, 3}, vs{2, 2, 4, 2};
        Graph graph;
        GraphBuilder b(&graph);
        ValueId q = b.Input("q", {qs, DType::kF64}), k = b.Input("k", {ks, DType::kF64});
        ValueId v = b.Input("v", {vs, DType::kF64}), mask = b.Input("mask", {{2, 4}, mask_dtype});
        auto outs = b.Add("ScaledDotProductAttention", {q, k, v, mask}, {}, "attn");
        REQUIRE(outs.status().ToString() == "OK");
        ValueId w0 = b.Input("w0", {{2, 2, 3, 2}, DType::kF64}), w1 = b.Input("w1", {{2, 2, 3, 4}, DType::kF64});
        auto weighted_sum = [&](ValueId x, ValueId w) {
          ValueId product = b.Add1("Mul", {x, w}, {}, "").value();
          return b.Add1("SumToShape", {product}, AttrMap{{"shape", std::vector<int64_t>{}}}, "").value();
        };
        ValueId loss = b.Add1("Add", {weighted_sum((*outs)[0], w0), weighted_sum((*outs)[1], w1)}, {}, "loss").value();
        auto grads = BuildGradients(&graph, loss, {q, k, v});
        REQUIRE(grads.status().ToString() == "OK");
        graph.outputs() = {{"out", (*outs)[0]}, {"probs", (*outs)[1]}, {"loss", loss},
                           {"dq", grads->at(q)}, {"dk", grads->at(k)}, {"dv", grads->at(v)}};
        ExecutorOptions opts;
        opts.device = device;
        auto exec = Executor::Create(graph, opts);
        REQUIRE(exec.status().ToString() == "OK");

        Rng rng(7);
        std::map<std::string, Tensor> feeds = {{"q", RandomF64(qs, rng)},
                                               {"k", RandomF64(ks, rng)},
                                               {"v", RandomF64(vs, rng)},
                                               {"mask", MaskOf(mask_dtype)},
                                               {"w0", RandomF64({2, 2, 3, 2}, rng)},
                                               {"w1", RandomF64({2, 2, 3, 4}, rng)}};
        auto run = [&]() {
          auto r = (*exec)->Run(feeds);
          REQUIRE(r.status().ToString() == "OK");
          return *r;
        };
        std::map<std::string, Tensor> got = run();

        std::vector<Tensor> expected = AttentionRef({feeds["q"], feeds["k"], feeds["v"], feeds["mask"]}, {}, {});
        const char* names[] = {"out", "probs"};
        for (int o = 0; o < 2; ++o)
          for (int64_t i = 0; i < expected[o].numel(); ++i) {
            INFO(names[o] << "[" << i << "]");
            REQUIRE(std::isfinite(got[names[o]].ScalarAt(i)));
            CHECK(got[names[o]].ScalarAt(i) == Approx(At(expected[o], i)).margin(1e-12));
          }
        // Batch 1 is fully padded: exact zeros, not NaN, not a uniform average.
        for (int64_t i = 12; i < 24; ++i) CHECK(got["out"].ScalarAt(i) == 0.0);
        for (int64_t i = 0; i < 18; ++i) CHECK(got["dq"].ScalarAt(18 + i) == 0.0);
        // Padded keys get no gradient: keys 1 and 3 of batch 0, all of batch 1.
        for (int64_t bh = 0; bh < 4; ++bh)
          for (int64_t j = 0; j < 4; ++j) {
            bool padded = bh >= 2 || j % 2 == 1;
            if (!padded) continue;
            for (int64_t d = 0; d < 3; ++d) CHECK(got["dk"].ScalarAt((bh * 4 + j) * 3 + d) == 0.0);
            for (int64_t d = 0; d < 2; ++d) CHECK(got["dv"].ScalarAt((bh * 4 + j) * 2 + d) == 0.0);
          }

        const double eps = 1e-6;
        for (const char* in : {"q", "k", "v"}) {
          Tensor& x = feeds[in];
          const Tensor grad = got[std::string("d") + in];
          for (int64_t e = 0; e < x.numel(); ++e) {
            double orig = At(x, e);
            At(x, e) = orig + eps;
            double up = run()["loss"].ScalarAt(0);
            At(x, e) = orig - eps;
            double down = run()["loss"].ScalarAt(0);
            At(x, e) = orig;
            INFO("d loss / d " << in << "[" << e << "]");
            CHECK(grad.ScalarAt(e) == Approx((up - down) / (2 * eps)).margin(1e-6).epsilon(1e-5));
          }
        }
      }
    }
}

// Type inference rejects bad inputs with messages that name them.
TEST_CASE("attention type inference errors") {
  const OpDef* op = OpRegistry::Global().FindOp("ScaledDotProductAttention");
  REQUIRE(op != nullptr);
  const TensorType q{{2, 3, 4, 8}, DType::kF32}, k{{2, 3, 5, 8}, DType::kF32}, v{{2, 3, 5, 6}, DType::kF32};
  auto error = [&](const AttrMap& attrs, const std::vector<TensorType>& in) {
    auto r = op->InferTypes(attrs, in);
    return r.ok() ? std::string("OK") : r.status().message();
  };
  auto ok = op->InferTypes({}, {q, k, v, {{2, 5}, DType::kBool}});
  REQUIRE(ok.ok());
  CHECK(ok->at(0) == TensorType{{2, 3, 4, 6}, DType::kF32});
  CHECK(ok->at(1) == TensorType{{2, 3, 4, 5}, DType::kF32});

  CHECK_THAT(error({}, {q, k}), Catch::Contains("takes (q, k, v[, key_padding_mask]), got 2"));
  CHECK_THAT(error({}, {{{2, 4, 8}, DType::kF32}, k, v}), Catch::Contains("q [B, H, Tq, D] must have rank 4"));
  CHECK_THAT(error({}, {q, {{2, 3, 5, 7}, DType::kF32}, v}), Catch::Contains("k [2, 3, 5, 7] must be [B, H, Tk, D]"));
  CHECK_THAT(error({}, {q, k, {{2, 3, 4, 6}, DType::kF32}}), Catch::Contains("Tk of k [2, 3, 5, 8]"));
  CHECK_THAT(error({}, {q, k, {{2, 3, 5, 6}, DType::kF64}}), Catch::Contains("dtypes differ"));
  CHECK_THAT(error({}, {{{2, 3, 4, 8}, DType::kI32}, k, v}), Catch::Contains("q must be f32 or f64"));
  CHECK_THAT(error({}, {q, k, v, {{2, 4}, DType::kI64}}),
             Catch::Contains("key_padding_mask must be [B, Tk] = [2, 5], got [2, 4]"));
  CHECK_THAT(error({}, {q, k, v, {{2, 5}, DType::kF16}}), Catch::Contains("key_padding_mask must be bool, i32, i64"));
  CHECK_THAT(error({{"scale", -1.0}}, {q, k, v}), Catch::Contains("'scale' must be a positive finite number"));

  const OpDef* bwd = OpRegistry::Global().FindOp("ScaledDotProductAttentionBackward");
  REQUIRE(bwd != nullptr);
  const TensorType probs{{2, 3, 4, 5}, DType::kF32}, d_out{{2, 3, 4, 6}, DType::kF32};
  CHECK(bwd->InferTypes({{"scale", 0.5}}, {q, k, v, probs, d_out}).ok());
  CHECK_FALSE(InferOpTypes(*bwd, {}, {q, k, v, probs, d_out}).ok());  // scale is required
  auto bad = bwd->InferTypes({{"scale", 0.5}}, {q, k, v, probs, {{2, 3, 4, 5}, DType::kF32}});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("d_out vs expected"));
}

// The FLOP count is the two GEMMs plus the softmax.
TEST_CASE("attention cost") {
  const OpDef* op = OpRegistry::Global().FindOp("ScaledDotProductAttention");
  REQUIRE(op != nullptr);
  std::vector<TensorType> in = {{{2, 3, 4, 8}, DType::kF32}, {{2, 3, 5, 8}, DType::kF32}, {{2, 3, 5, 6}, DType::kF32}};
  auto out = op->InferTypes({}, in);
  REQUIRE(out.ok());
  const double scores = 2 * 3 * 4 * 5;
  CHECK(op->Cost({}, in, *out).flops == Approx(scores * (2 * 8 + 2 * 6 + 5)));
}

}  // namespace
}  // namespace loom::testing
