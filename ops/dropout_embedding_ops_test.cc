#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/counter_rng.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "ops/dropout_embedding_util.h"
#include "runtime/executor.h"
#include "tests/op_harness.h"

namespace loom::testing {
namespace {

// Dropout's mask is random, so the reference reads it from the op's own
// output, snaps each element to the nearest legal value (0 or the keep
// scale; all ones when inactive) and checks y = x * mask against that.
std::vector<Tensor> DropoutRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>& actual) {
  const double p = attrs.Float("p");
  const bool active = attrs.Bool("training") && p > 0;
  const double scale = p < 1 ? 1 / (1 - p) : 0;
  Tensor y = ZerosF64(in[0].shape()), mask = ZerosF64(in[0].shape());
  for (int64_t i = 0; i < y.numel(); ++i) {
    At(mask, i) = !active ? 1.0 : (At(actual[1], i) > scale / 2 ? scale : 0.0);
    At(y, i) = At(in[0], i) * At(mask, i);
  }
  return {y, mask};
}

OpCase DropoutCase(const std::string& name, Shape shape, double p, bool training) {
  return OpCase{name, "Dropout", {{"p", p}, {"training", training}}, {InputSpec::Uniform(shape)}, DropoutRef};
}

TEST_CASE("dropout passes the op harness") {
  std::vector<OpCase> cases = {
      DropoutCase("dropout p 0.5", {4, 8}, 0.5, true),
      DropoutCase("dropout p 0.2 rank 3", {3, 5, 7}, 0.2, true),
      DropoutCase("dropout eval is the identity", {4, 5}, 0.5, false),
      DropoutCase("dropout p 0 is the identity", {4, 5}, 0.0, true),
      DropoutCase("dropout p 1 gives zeros", {4, 5}, 1.0, true),
      DropoutCase("dropout large (threaded blocks)", {300, 200}, 0.3, true),
  };
  for (const OpCase& c : cases) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

// A one-node Dropout graph on x [n] of `dtype`, run by its own executor.
struct DropoutRun {
  Graph graph;
  std::unique_ptr<Executor> exec;

  DropoutRun(int64_t n, double p, uint64_t seed, DType dtype = DType::kF32, ThreadPool* pool = nullptr,
             Device device = Device::Cpu(), int64_t offset = 0, const AttrMap& extra = {}) {
    GraphBuilder b(&graph);
    ValueId x = b.Input("x", {{n}, dtype});
    AttrMap attrs = extra;
    attrs.Set("p", p);
    attrs.Set("training", true);
    attrs.Set("offset", offset);
    auto outs = b.Add("Dropout", {x}, attrs, "dropout");
    REQUIRE(outs.ok());
    graph.outputs()["y"] = (*outs)[0];
    graph.outputs()["mask"] = (*outs)[1];
    ExecutorOptions opts;
    opts.seed = seed;
    opts.pool = pool;
    opts.device = device;
    auto e = Executor::Create(graph, opts);
    REQUIRE(e.ok());
    exec = std::move(*e);
  }
  // Runs one step on x = 1 and returns the mask as doubles.
  std::vector<double> Mask(int64_t n, DType dtype = DType::kF32) {
    Tensor x = Tensor::Zeros({n}, dtype);
    x.Fill(1.0);
    auto r = exec->Run({{"x", x}});
    REQUIRE(r.ok());
    CHECK((*r)["y"].ToDoubleVector() == (*r)["mask"].ToDoubleVector());  // x = 1: y is the mask
    return (*r)["mask"].ToDoubleVector();
  }
};

double Fraction(const std::vector<double>& v, double value) {
  return static_cast<double>(std::count(v.begin(), v.end(), value)) / static_cast<double>(v.size());
}

double FractionDifferent(const std::vector<double>& a, const std::vector<double>& b) {
  int64_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
  return static_cast<double>(diff) / static_cast<double>(a.size());
}

TEST_CASE("dropout drops a fraction p and scales the rest by 1 / (1 - p)") {
  const int64_t n = 100000;  // the drop fraction's std is at most 0.0016
  for (double p : {0.1, 0.5, 0.9}) {
    INFO("p = " << p);
    DropoutRun run(n, p, 7);
    std::vector<double> mask = run.Mask(n);
    CHECK(std::abs(Fraction(mask, 0.0) - p) < 0.01);
    const double scale = static_cast<float>(1 / (1 - p));
    CHECK(Fraction(mask, 0.0) + Fraction(mask, scale) == 1.0);
  }
}

TEST_CASE("dropout masks differ across seeds and steps, and repeat otherwise") {
  const int64_t n = 50000;  // spans several random blocks
  const double p = 0.3;
  DropoutRun run(n, p, 7);
  std::vector<double> step0 = run.Mask(n), step1 = run.Mask(n);
  // Independent masks disagree on 2 p (1 - p) = 42% of elements.
  CHECK(std::abs(FractionDifferent(step0, step1) - 0.42) < 0.02);

  DropoutRun other_seed(n, p, 8);
  CHECK(std::abs(FractionDifferent(step0, other_seed.Mask(n)) - 0.42) < 0.02);

  // Same seed and step: the same mask, whatever the thread count or dtype.
  ThreadPool one(1), four(4);
  DropoutRun serial(n, p, 7, DType::kF32, &one), parallel(n, p, 7, DType::kF32, &four);
  CHECK(serial.Mask(n) == step0);
  CHECK(parallel.Mask(n) == step0);
  DropoutRun f64(n, p, 7, DType::kF64);
  std::vector<double> mask64 = f64.Mask(n, DType::kF64);
  for (size_t i = 0; i < mask64.size(); ++i) {
    if ((mask64[i] == 0) != (step0[i] == 0)) FAIL("f32 and f64 masks keep different elements at " << i);
  }
}

// A part of a batch-split Dropout (attr offset: its first element's index in
// the whole tensor) draws the whole's mask from there on, on every device.
TEST_CASE("a dropout part with an offset draws the whole's mask from that element") {
  const int64_t n = 20000, offset = 7001;  // the part starts inside a draw block
  const double p = 0.4;
  const std::vector<double> whole = DropoutRun(n, p, 11).Mask(n);
  for (const Device& device : TestDevices()) {
    INFO("on " << device.ToString());
    CHECK(DropoutRun(n, p, 11, DType::kF32, nullptr, device).Mask(n) == whole);
    DropoutRun part_run(n - offset, p, 11, DType::kF32, nullptr, device, offset);
    const std::vector<double> part = part_run.Mask(n - offset);
    CHECK(part == std::vector<double>(whole.begin() + offset, whole.end()));
  }
}

// The kernel draws eight elements at a time in vector lanes where the
// draw index is the element's own, and one at a time (CounterU64 itself)
// for a part in runs of the whole. One run over every element draws the
// same indices: the same mask, bit for bit, whatever the tail.
TEST_CASE("dropout's vector lanes draw what one-at-a-time draws do") {
  for (DType dtype : {DType::kF32, DType::kF64}) {
    for (int64_t n : {1, 7, 8, 9, 1003, 20000}) {
      INFO(DTypeName(dtype) << ", n = " << n);
      const std::vector<double> lanes = DropoutRun(n, 0.3, 5, dtype).Mask(n, dtype);
      const AttrMap one_run{{"run", n}, {"run_stride", n}};
      const std::vector<double> one_by_one =
          DropoutRun(n, 0.3, 5, dtype, nullptr, Device::Cpu(), 0, one_run).Mask(n, dtype);
      CHECK(lanes == one_by_one);
    }
  }
}

// The kernels' integer compare is CounterUniform(key, n) < p, bit for bit:
// on draws around every threshold (the top 53 bits just below, at and
// above p * 2^53) and on a stream of draws, for p whose p * 2^53 is an
// integer and for p whose is not.
TEST_CASE("dropout's integer threshold drops exactly where CounterUniform < p") {
  for (double p : {0.1, 0.25, 1.0 / 3, 0.5, 0.9, 1.0, 0x1.0p-53, 1 - 0x1.0p-53}) {
    INFO("p = " << p);
    const uint64_t t = dropout_embedding::DropThreshold(p);
    for (uint64_t top : {t - 1, t, t + 1}) {
      if (top >= (uint64_t{1} << 53)) continue;
      for (uint64_t low : {uint64_t{0}, uint64_t{0x7ff}}) {
        const uint64_t draw = (top << 11) | low;
        const double uniform = static_cast<double>(draw >> 11) * 0x1.0p-53;
        CHECK(dropout_embedding::Dropped(draw, t) == (uniform < p));
      }
    }
    for (uint64_t n = 0; n < 20000; ++n) {
      const uint64_t draw = CounterU64(1234567, n);
      if (dropout_embedding::Dropped(draw, t) != (CounterUniform(1234567, n) < p)) FAIL("draw " << n);
    }
  }
}

TEST_CASE("dropout rejects p outside [0, 1]") {
  Graph graph;
  GraphBuilder b(&graph);
  ValueId x = b.Input("x", {{3}, DType::kF32});
  auto s = b.Add("Dropout", {x}, {{"p", 1.5}}, "dropout").status();
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("p must be in [0, 1]") && Catch::Contains("1.5"));
  CHECK(OpRegistry::Global().FindOp("Dropout")->IsRandom());
}

// Gathers rows of the weight; indices of any integer dtype.
std::vector<Tensor> EmbeddingRef(const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
  const int64_t dim = in[1].shape()[1];
  std::vector<int64_t> out = in[0].shape().dims();
  out.push_back(dim);
  Tensor y = ZerosF64(Shape(out));
  for (int64_t i = 0; i < in[0].numel(); ++i) {
    const int64_t row = static_cast<int64_t>(in[0].ScalarAt(i));
    for (int64_t j = 0; j < dim; ++j) At(y, i * dim + j) = At(in[1], row * dim + j);
  }
  return {y};
}

TEST_CASE("embedding passes the op harness") {
  std::vector<OpCase> cases = {
      {"embedding i64 [2, 3]", "Embedding", {}, {InputSpec::Index({2, 3}, 5), InputSpec::Uniform({5, 4})}, EmbeddingRef},
      {"embedding i32 [7]", "Embedding", {}, {InputSpec::Index({7}, 6, DType::kI32), InputSpec::Uniform({6, 3})},
       EmbeddingRef},
      {"embedding scalar index", "Embedding", {}, {InputSpec::Index({}, 4), InputSpec::Uniform({4, 3})}, EmbeddingRef},
      {"embedding large (threaded)", "Embedding", {},
       {InputSpec::Index({64, 32}, 50), InputSpec::Uniform({50, 64})}, EmbeddingRef},
  };
  // The padding row is used by the forward pass but gets no gradient, which
  // finite differences cannot confirm: its gradient has its own test below.
  OpCase padded{"embedding padding_idx forward", "Embedding", {{"padding_idx", int64_t{1}}},
                {InputSpec::Index({4, 5}, 3), InputSpec::Uniform({3, 4})}, EmbeddingRef};
  padded.check_gradient = false;
  cases.push_back(padded);
  for (const OpCase& c : cases) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

TEST_CASE("embedding gives the padding row no gradient") {
  const std::vector<int64_t> ids = {2, 0, 2, 3, 1, 2};
  const int64_t num = 4, dim = 3, padding = 2;
  Graph graph;
  GraphBuilder b(&graph);
  ValueId indices = b.Input("ids", {{6}, DType::kI64});
  ValueId weight = b.Input("weight", {{num, dim}, DType::kF64});
  ValueId coeff = b.Input("coeff", {{6, dim}, DType::kF64});
  ValueId y = b.Add1("Embedding", {indices, weight}, {{"padding_idx", padding}}, "emb").value();
  ValueId loss =
      b.Add1("SumToShape", {b.Add1("Mul", {y, coeff}, {}, "").value()}, {{"shape", std::vector<int64_t>{}}}, "").value();
  auto grads = BuildGradients(&graph, loss, {weight});
  REQUIRE(grads.ok());
  graph.outputs()["y"] = y;
  graph.outputs()["dweight"] = grads->at(weight);
  auto exec = Executor::Create(graph);
  REQUIRE(exec.ok());

  Tensor w = ZerosF64({num, dim}), c = ZerosF64({6, dim});
  for (int64_t i = 0; i < w.numel(); ++i) At(w, i) = 0.5 + i;
  for (int64_t i = 0; i < c.numel(); ++i) At(c, i) = 1.0 + 0.25 * i;
  auto r = (*exec)->Run({{"ids", Tensor::FromVector<int64_t>({6}, ids)}, {"weight", w}, {"coeff", c}});
  REQUIRE(r.ok());

  Tensor expected = ZerosF64({num, dim});
  for (size_t k = 0; k < ids.size(); ++k)
    for (int64_t j = 0; j < dim; ++j) {
      CHECK((*r)["y"].ScalarAt(k * dim + j) == At(w, ids[k] * dim + j));  // the padding row is still gathered
      if (ids[k] != padding) At(expected, ids[k] * dim + j) += At(c, k * dim + j);
    }
  const Tensor& dw = (*r)["dweight"];
  for (int64_t i = 0; i < expected.numel(); ++i) {
    INFO("dweight element " << i);
    CHECK(dw.ScalarAt(i) == Approx(At(expected, i)).epsilon(1e-12));
  }
  for (int64_t j = 0; j < dim; ++j) CHECK(dw.ScalarAt(padding * dim + j) == 0.0);
}

// dw[r] = the sum of dy rows whose index is r; the padding row stays zero.
std::vector<Tensor> EmbeddingBackwardRef(const std::vector<Tensor>& in, const AttrMap& attrs,
                                         const std::vector<Tensor>&) {
  const int64_t num = attrs.Int("num_embeddings"), padding = attrs.Int("padding_idx");
  const int64_t dim = in[0].shape().dim(-1);
  Tensor dw = ZerosF64({num, dim});
  for (int64_t i = 0; i < in[1].numel(); ++i) {
    const int64_t row = static_cast<int64_t>(in[1].ScalarAt(i));
    if (row == padding) continue;
    for (int64_t j = 0; j < dim; ++j) At(dw, row * dim + j) += At(in[0], i * dim + j);
  }
  return {dw};
}

TEST_CASE("embedding backward passes the op harness") {
  auto make = [](const std::string& name, Shape ids, int64_t num, int64_t dim, int64_t padding, DType dtype) {
    std::vector<int64_t> dy = ids.dims();
    dy.push_back(dim);
    OpCase c{name, "EmbeddingBackward", {{"num_embeddings", num}, {"padding_idx", padding}},
             {InputSpec::Uniform(Shape(dy)), InputSpec::Index(ids, num, dtype)}, EmbeddingBackwardRef};
    c.check_gradient = false;  // no gradient of its own
    return c;
  };
  // Rows hit many times (the CUDA kernel sums them in chunks), a padding
  // row, rows never hit, odd dims.
  std::vector<OpCase> cases = {
      make("embedding backward hot rows i64", {40, 30}, 7, 5, 3, DType::kI64),
      make("embedding backward i32 sparse rows", {9}, 40, 33, -1, DType::kI32),
      make("embedding backward scalar index", {}, 3, 4, 0, DType::kI64),
  };
  for (const OpCase& c : cases) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

// Runs a one-node Embedding graph over `ids` with a [5, 2] weight.
Status RunEmbedding(const Tensor& ids) {
  Graph graph;
  GraphBuilder b(&graph);
  ValueId in = b.Input("ids", {ids.shape(), ids.dtype()});
  ValueId w = b.Input("weight", {{5, 2}, DType::kF32});
  graph.outputs()["y"] = b.Add1("Embedding", {in, w}, {}, "emb").value();
  auto exec = Executor::Create(graph);
  REQUIRE(exec.ok());
  return (*exec)->Run({{"ids", ids}, {"weight", Tensor::Zeros({5, 2})}}).status();
}

TEST_CASE("embedding fails the step on out-of-range indices") {
  Status s = RunEmbedding(Tensor::FromVector<int64_t>({2, 3}, {0, 1, 2, 3, 4, 5}));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("emb") && Catch::Contains("index 5") &&
                              Catch::Contains("position [1, 2]") && Catch::Contains("5 embeddings"));

  s = RunEmbedding(Tensor::FromVector<int32_t>({2, 2}, {0, -3, 1, 1}));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("index -3") && Catch::Contains("position [0, 1]"));

  CHECK(RunEmbedding(Tensor::FromVector<int32_t>({4}, {4, 0, 3, 1})).ok());
}

TEST_CASE("embedding validates its inputs and attributes") {
  auto add = [](const TensorType& ids, const TensorType& w, const AttrMap& attrs) {
    Graph graph;
    GraphBuilder b(&graph);
    return b.Add("Embedding", {b.Input("ids", ids), b.Input("w", w)}, attrs, "emb").status();
  };
  Status s = add({{3}, DType::kF32}, {{5, 2}, DType::kF32}, {});
  CHECK_THAT(s.message(), Catch::Contains("indices") && Catch::Contains("f32"));
  s = add({{3}, DType::kI64}, {{5, 2, 1}, DType::kF32}, {});
  CHECK_THAT(s.message(), Catch::Contains("weight") && Catch::Contains("[5, 2, 1]"));
  s = add({{3}, DType::kI64}, {{5, 2}, DType::kF32}, {{"padding_idx", int64_t{5}}});
  CHECK_THAT(s.message(), Catch::Contains("padding_idx") && Catch::Contains("[0, 5)"));
  CHECK(add({{3}, DType::kI32}, {{5, 2}, DType::kF64}, {{"padding_idx", int64_t{4}}}).ok());
}

}  // namespace
}  // namespace loom::testing
