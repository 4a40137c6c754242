#include <catch2/catch.hpp>

#include "graph/builder.h"
#include "runtime/executor.h"
#include "tests/op_harness.h"

namespace loom::testing {
namespace {

// Row-major multi-index <-> flat offset, written out longhand.
std::vector<int64_t> Unravel(int64_t flat, const Shape& s) {
  std::vector<int64_t> idx(s.rank());
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[d] = flat % s[d];
    flat /= s[d];
  }
  return idx;
}

int64_t Ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t flat = 0;
  for (int d = 0; d < s.rank(); ++d) flat = flat * s[d] + idx[d];
  return flat;
}

// y[i] = x[i with y-axis k taken from x-axis perm[k]].
ReferenceFn TransposeRef(std::vector<int> perm) {
  return [perm](const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
    const Shape& xs = in[0].shape();
    std::vector<int64_t> dims;
    for (int p : perm) dims.push_back(xs[p]);
    Tensor y = ZerosF64(Shape(dims));
    for (int64_t i = 0; i < y.numel(); ++i) {
      std::vector<int64_t> yi = Unravel(i, y.shape()), xi(xs.rank());
      for (size_t k = 0; k < perm.size(); ++k) xi[perm[k]] = yi[k];
      At(y, i) = At(in[0], Ravel(xi, xs));
    }
    return std::vector<Tensor>{y};
  };
}

// Flatten keeps the element order; only the shape changes.
ReferenceFn FlattenRef(Shape expected) {
  return [expected](const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
    Tensor y = ZerosF64(expected);
    for (int64_t i = 0; i < y.numel(); ++i) At(y, i) = At(in[0], i);
    return std::vector<Tensor>{y};
  };
}

std::vector<Tensor> ConcatRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  int rank = in[0].shape().rank();
  int axis = static_cast<int>(attrs.Int("axis"));
  if (axis < 0) axis += rank;
  std::vector<int64_t> dims = in[0].shape().dims();
  dims[axis] = 0;
  for (const Tensor& t : in) dims[axis] += t.shape()[axis];
  Tensor y = ZerosF64(Shape(dims));
  for (int64_t i = 0; i < y.numel(); ++i) {
    std::vector<int64_t> idx = Unravel(i, y.shape());
    size_t k = 0;
    while (idx[axis] >= in[k].shape()[axis]) idx[axis] -= in[k++].shape()[axis];
    At(y, i) = At(in[k], Ravel(idx, in[k].shape()));
  }
  return {y};
}

std::vector<Tensor> SplitRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  const Shape& xs = in[0].shape();
  int axis = static_cast<int>(attrs.Int("axis"));
  if (axis < 0) axis += xs.rank();
  std::vector<Tensor> outs;
  int64_t offset = 0;
  for (int64_t size : attrs.Ints("sizes")) {
    std::vector<int64_t> dims = xs.dims();
    dims[axis] = size;
    Tensor y = ZerosF64(Shape(dims));
    for (int64_t i = 0; i < y.numel(); ++i) {
      std::vector<int64_t> idx = Unravel(i, y.shape());
      idx[axis] += offset;
      At(y, i) = At(in[0], Ravel(idx, xs));
    }
    outs.push_back(y);
    offset += size;
  }
  return outs;
}

// `picked`: the indices along `axis` that Python's x[start:end:step] keeps,
// worked out by hand for each case.
ReferenceFn SliceRef(int axis, std::vector<int64_t> picked) {
  return [axis, picked](const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
    const Shape& xs = in[0].shape();
    std::vector<int64_t> dims = xs.dims();
    dims[axis] = static_cast<int64_t>(picked.size());
    Tensor y = ZerosF64(Shape(dims));
    for (int64_t i = 0; i < y.numel(); ++i) {
      std::vector<int64_t> idx = Unravel(i, y.shape());
      idx[axis] = picked[idx[axis]];
      At(y, i) = At(in[0], Ravel(idx, xs));
    }
    return std::vector<Tensor>{y};
  };
}

using Ints = std::vector<int64_t>;

std::vector<OpCase> Cases() {
  auto U = [](Shape s) { return InputSpec::Uniform(std::move(s)); };
  std::vector<OpCase> c;
  c.push_back({"transpose 2d", "Transpose", {{"perm", Ints{1, 0}}}, {U({3, 4})}, TransposeRef({1, 0})});
  c.push_back({"transpose 3d rotate", "Transpose", {{"perm", Ints{2, 0, 1}}}, {U({2, 3, 4})}, TransposeRef({2, 0, 1})});
  c.push_back({"transpose keeps last dim (attention heads)", "Transpose", {{"perm", Ints{0, 2, 1, 3}}}, {U({2, 3, 2, 4})},
               TransposeRef({0, 2, 1, 3})});
  c.push_back({"transpose negative perm entries", "Transpose", {{"perm", Ints{-1, 0, 1}}}, {U({2, 3, 4})},
               TransposeRef({2, 0, 1})});
  c.push_back({"transpose default reverses", "Transpose", {}, {U({2, 3, 4})}, TransposeRef({2, 1, 0})});
  c.push_back({"transpose with unit dims", "Transpose", {{"perm", Ints{2, 1, 0, 3}}}, {U({3, 1, 4, 1})},
               TransposeRef({2, 1, 0, 3})});
  c.push_back({"transpose identity perm", "Transpose", {{"perm", Ints{0, 1}}}, {U({3, 2})}, TransposeRef({0, 1})});
  c.push_back({"transpose large (threaded)", "Transpose", {{"perm", Ints{2, 0, 1}}}, {U({40, 36, 50})},
               TransposeRef({2, 0, 1})});
  // CUDA paths: tiled transposes with partial tiles, batched; and a gather
  // of contiguous runs too short to copy in wide units.
  c.push_back({"transpose 2d tiled, partial tiles", "Transpose", {{"perm", Ints{1, 0}}}, {U({70, 45})},
               TransposeRef({1, 0})});
  c.push_back({"transpose batched tiled (key layout)", "Transpose", {{"perm", Ints{0, 1, 3, 2}}}, {U({2, 3, 20, 33})},
               TransposeRef({0, 1, 3, 2})});
  c.push_back({"transpose odd runs", "Transpose", {{"perm", Ints{1, 0, 2}}}, {U({5, 7, 3})}, TransposeRef({1, 0, 2})});
  c.push_back({"permute alias", "Permute", {{"perm", Ints{1, 2, 0}}}, {U({2, 3, 4})}, TransposeRef({1, 2, 0})});

  c.push_back({"flatten default", "Flatten", {}, {U({2, 3, 4, 5})}, FlattenRef({2, 60})});
  c.push_back({"flatten all", "Flatten", {{"start_dim", 0}}, {U({2, 3, 4})}, FlattenRef({24})});
  c.push_back({"flatten middle", "Flatten", {{"start_dim", 1}, {"end_dim", 2}}, {U({2, 3, 4, 5})}, FlattenRef({2, 12, 5})});
  c.push_back({"flatten negative dims", "Flatten", {{"start_dim", -3}, {"end_dim", -2}}, {U({2, 3, 4, 5})},
               FlattenRef({2, 12, 5})});
  c.push_back({"flatten single dim is a no-op", "Flatten", {{"start_dim", 1}, {"end_dim", 1}}, {U({2, 3, 4})},
               FlattenRef({2, 3, 4})});
  c.push_back({"flatten scalar", "Flatten", {{"start_dim", 0}}, {U({})}, FlattenRef({1})});

  c.push_back({"concat axis 0", "Concat", {{"axis", 0}}, {U({2, 3}), U({4, 3})}, ConcatRef});
  c.push_back({"concat axis 1 three inputs", "Concat", {{"axis", 1}}, {U({2, 1, 4}), U({2, 3, 4}), U({2, 2, 4})}, ConcatRef});
  c.push_back({"concat last axis negative", "Concat", {{"axis", -1}}, {U({3, 2}), U({3, 5})}, ConcatRef});
  c.push_back({"concat single input", "Concat", {{"axis", 1}}, {U({2, 3})}, ConcatRef});
  c.push_back({"concat with empty input", "Concat", {{"axis", 0}}, {U({2, 3}), U({0, 3}), U({1, 3})}, ConcatRef});
  c.push_back({"concat large (threaded)", "Concat", {{"axis", 1}}, {U({64, 300, 3}), U({64, 100, 3})}, ConcatRef});

  c.push_back({"split axis 1", "Split", {{"axis", 1}, {"sizes", Ints{1, 3, 2}}}, {U({2, 6, 3})}, SplitRef});
  c.push_back({"split axis 0 with an empty part", "Split", {{"axis", 0}, {"sizes", Ints{2, 0, 3}}}, {U({5, 2})}, SplitRef});
  OpCase unused{"split with an output that gets no gradient", "Split", {{"axis", -1}, {"sizes", Ints{2, 2, 1}}},
                {U({3, 5})}, SplitRef};
  unused.loss_outputs = {0, 2};  // output 1 gets no gradient: Split's rule fills zeros
  c.push_back(unused);

  c.push_back({"slice unit step", "Slice", {{"axis", 1}, {"start", 1}, {"end", 5}}, {U({3, 6})}, SliceRef(1, {1, 2, 3, 4})});
  c.push_back({"slice step 2", "Slice", {{"axis", 1}, {"start", 0}, {"end", 6}, {"step", 2}}, {U({3, 6})},
               SliceRef(1, {0, 2, 4})});
  c.push_back({"slice step 3 on axis 0 of 3d", "Slice", {{"axis", 0}, {"start", 1}, {"end", 7}, {"step", 3}},
               {U({7, 2, 3})}, SliceRef(0, {1, 4})});
  c.push_back({"slice negative start and end", "Slice", {{"axis", -1}, {"start", -4}, {"end", -1}}, {U({2, 6})},
               SliceRef(1, {2, 3, 4})});
  c.push_back({"slice end past the extent clamps", "Slice", {{"axis", 0}, {"start", 3}, {"end", 100}}, {U({5, 2})},
               SliceRef(0, {3, 4})});
  c.push_back({"slice start before the beginning clamps", "Slice", {{"axis", 0}, {"start", -100}, {"end", 2}, {"step", 2}},
               {U({5, 2})}, SliceRef(0, {0})});
  c.push_back({"slice default end", "Slice", {{"axis", 1}, {"start", 2}}, {U({2, 4})}, SliceRef(1, {2, 3})});
  c.push_back({"slice empty (start after end)", "Slice", {{"axis", 1}, {"start", 4}, {"end", 2}}, {U({2, 5})},
               SliceRef(1, {})});
  c.push_back({"slice last axis step 3 (strided elements)", "Slice", {{"axis", -1}, {"start", 1}, {"step", 3}},
               {U({4, 3, 10})}, SliceRef(2, {1, 4, 7})});
  c.push_back({"slice large (threaded)", "Slice", {{"axis", 1}, {"start", 5}, {"end", 290}, {"step", 2}},
               {U({200, 300})}, [](const std::vector<Tensor>& in, const AttrMap& a, const std::vector<Tensor>& o) {
                 std::vector<int64_t> picked;
                 for (int64_t i = 5; i < 290; i += 2) picked.push_back(i);
                 return SliceRef(1, picked)(in, a, o);
               }});
  return c;
}

TEST_CASE("shape ops pass the op harness") {
  for (const OpCase& c : Cases()) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

TEST_CASE("shape ops reject bad attributes and shapes with clear messages") {
  using Catch::Matchers::Contains;
  TensorType x{{2, 3, 4}, DType::kF32};
  CHECK_THAT(InferError("Transpose", {{"perm", Ints{0, 0, 1}}}, {x}),
             Contains("'perm' [0, 0, 1] is not a permutation") && Contains("[2, 3, 4]"));
  CHECK_THAT(InferError("Transpose", {{"perm", Ints{1, 0}}}, {x}), Contains("not a permutation of the 3 axes"));
  CHECK_THAT(InferError("Flatten", {{"start_dim", 2}, {"end_dim", 1}}, {x}), Contains("start_dim 2 comes after end_dim 1"));
  CHECK_THAT(InferError("Flatten", {{"start_dim", 3}}, {x}), Contains("'start_dim' = 3 is out of range") && Contains("[2, 3, 4]"));
  CHECK_THAT(InferError("Concat", {{"axis", 1}}, {x, TensorType{{2, 3, 5}, DType::kF32}}),
             Contains("input 1 has shape [2, 3, 5] but input 0 has [2, 3, 4]") && Contains("except axis 1"));
  CHECK_THAT(InferError("Concat", {{"axis", 0}}, {x, TensorType{{2, 3, 4}, DType::kF64}}), Contains("input 1 is f64"));
  CHECK_THAT(InferError("Concat", {}, {}), Contains("at least one input"));
  CHECK_THAT(InferError("Split", {{"axis", 1}, {"sizes", Ints{1, 1}}}, {x}),
             Contains("sizes [1, 1] sum to 2 but axis 1 of input [2, 3, 4] has extent 3"));
  CHECK_THAT(InferError("Split", {{"axis", 1}}, {x}), Contains("missing required attribute 'sizes'"));
  CHECK_THAT(InferError("Slice", {{"axis", 0}, {"step", 0}}, {x}), Contains("'step' must be positive, got 0"));
  CHECK_THAT(InferError("Slice", {{"axis", 3}}, {x}), Contains("'axis' = 3 is out of range"));
  CHECK_THAT(InferError("SliceBackward", {{"axis", 1}, {"start", 1}, {"shape", Ints{2, 3, 4}}}, {x}),
             Contains("gradient of shape [2, 3, 4] does not match the slice [2, 2, 4]"));
}

// Runs one node on the CPU executor.
std::vector<Tensor> RunNode(const std::string& op, const AttrMap& attrs, const std::vector<Tensor>& ins) {
  Graph graph;
  GraphBuilder b(&graph);
  std::vector<ValueId> vs;
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < ins.size(); ++i) {
    std::string name = "in" + std::to_string(i);
    vs.push_back(b.Input(name, {ins[i].shape(), ins[i].dtype()}));
    feeds[name] = ins[i];
  }
  auto outs = b.Add(op, vs, attrs, "op");
  REQUIRE(outs.ok());
  for (size_t i = 0; i < outs->size(); ++i) graph.outputs()["out" + std::to_string(i)] = (*outs)[i];
  auto exec = Executor::Create(graph);
  REQUIRE(exec.ok());
  auto result = (*exec)->Run(feeds);
  REQUIRE(result.ok());
  std::vector<Tensor> res;
  for (size_t i = 0; i < outs->size(); ++i) res.push_back((*result)["out" + std::to_string(i)]);
  return res;
}

TEST_CASE("shape ops move integer tensors too") {
  Tensor x = Tensor::FromVector<int64_t>({2, 3}, {0, 1, 2, 3, 4, 5});
  Tensor t = RunNode("Transpose", {{"perm", Ints{1, 0}}}, {x})[0];
  CHECK(t.shape() == Shape({3, 2}));
  CHECK(t.ToDoubleVector() == std::vector<double>{0, 3, 1, 4, 2, 5});
  Tensor s = RunNode("Slice", {{"axis", 1}, {"start", -2}}, {x})[0];
  CHECK(s.ToDoubleVector() == std::vector<double>{1, 2, 4, 5});
  Tensor i32 = Tensor::FromVector<int32_t>({1, 2}, {7, 8});
  Tensor c = RunNode("Concat", {{"axis", 0}}, {Tensor::FromVector<int32_t>({1, 2}, {5, 6}), i32})[0];
  CHECK(c.dtype() == DType::kI32);
  CHECK(c.ToDoubleVector() == std::vector<double>{5, 6, 7, 8});
  std::vector<Tensor> parts = RunNode("Split", {{"axis", 1}, {"sizes", Ints{1, 2}}}, {x});
  CHECK(parts[0].ToDoubleVector() == std::vector<double>{0, 3});
  CHECK(parts[1].ToDoubleVector() == std::vector<double>{1, 2, 4, 5});
}

}  // namespace
}  // namespace loom::testing
