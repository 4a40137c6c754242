#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "graph/builder.h"
#include "tests/op_harness.h"

namespace loom::testing {
namespace {

// Naive BatchNorm over x [N, C, S...]: per channel, statistics over the
// batch and spatial positions. Outputs y, new running mean and variance,
// saved mean and inverse std.
std::vector<Tensor> BatchNormRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  const Shape& xs = in[0].shape();
  const int64_t n = xs[0], channels = xs[1];
  int64_t spatial = 1;
  for (int d = 2; d < xs.rank(); ++d) spatial *= xs[d];
  const bool training = attrs.Bool("training");
  const double momentum = attrs.Float("momentum"), eps = attrs.Float("eps");
  Tensor y = ZerosF64(xs), rm = ZerosF64({channels}), rv = ZerosF64({channels});
  Tensor sm = ZerosF64({channels}), sis = ZerosF64({channels});
  auto index = [&](int64_t i, int64_t c, int64_t s) { return (i * channels + c) * spatial + s; };
  for (int64_t c = 0; c < channels; ++c) {
    double count = static_cast<double>(n * spatial), sum = 0, sq = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t s = 0; s < spatial; ++s) sum += At(in[0], index(i, c, s));
    double batch_mean = sum / count;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t s = 0; s < spatial; ++s) sq += std::pow(At(in[0], index(i, c, s)) - batch_mean, 2);
    double mean, var;
    if (training) {
      mean = batch_mean;
      var = sq / count;
      At(rm, c) = (1 - momentum) * At(in[3], c) + momentum * batch_mean;
      At(rv, c) = (1 - momentum) * At(in[4], c) + momentum * sq / (count - 1);
    } else {
      mean = At(in[3], c);
      var = At(in[4], c);
      At(rm, c) = At(in[3], c);
      At(rv, c) = At(in[4], c);
    }
    At(sm, c) = mean;
    At(sis, c) = 1 / std::sqrt(var + eps);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t s = 0; s < spatial; ++s) {
        int64_t k = index(i, c, s);
        At(y, k) = (At(in[0], k) - mean) / std::sqrt(var + eps) * At(in[1], c) + At(in[2], c);
      }
  }
  return {y, rm, rv, sm, sis};
}

OpCase BatchNormCase(const std::string& name, Shape x, bool training, AttrMap extra = {}) {
  const int64_t c = x[1];
  extra.Set("training", AttrValue(training));  // Set(name, int) would take a bare bool
  OpCase oc{name,
            "BatchNorm",
            extra,
            {InputSpec::Uniform(x, -1, 2), InputSpec::Uniform({c}, 0.5, 1.5), InputSpec::Uniform({c}),
             InputSpec::Constant({c}, -1, 1), InputSpec::Constant({c}, 0.5, 2)},
            BatchNormRef};
  oc.loss_outputs = {0};
  return oc;
}

TEST_CASE("batch norm passes the op harness") {
  std::vector<OpCase> cases = {
      BatchNormCase("batchnorm1d train [N, C]", {6, 3}, true),
      BatchNormCase("batchnorm1d train [N, C, L]", {3, 4, 5}, true),
      BatchNormCase("batchnorm2d train", {2, 3, 4, 5}, true),
      BatchNormCase("batchnorm1d eval [N, C]", {5, 3}, false),
      BatchNormCase("batchnorm1d eval [N, C, L]", {2, 3, 4}, false),
      BatchNormCase("batchnorm2d eval", {2, 3, 3, 4}, false),
      BatchNormCase("batchnorm2d train momentum 0.3 eps 1e-3", {2, 2, 3, 3}, true,
                    {{"momentum", 0.3}, {"eps", 1e-3}}),
      BatchNormCase("batchnorm2d train large (threaded channels)", {8, 4, 64, 64}, true),
      // CUDA paths: [N, C] sums split over blocks, short planes of many channels.
      BatchNormCase("batchnorm1d train [N, C] long batch", {3000, 4}, true),
      BatchNormCase("batchnorm1d train [N, C, L] short L, many channels", {4, 40, 3}, true),
      BatchNormCase("batchnorm2d eval many channels", {2, 70, 2, 3}, false),
  };
  for (const OpCase& c : cases) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

// Naive LayerNorm over the last k dims; outputs y, saved mean and rstd.
std::vector<Tensor> LayerNormRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  const Shape& xs = in[0].shape();
  const std::vector<int64_t> norm = attrs.Ints("normalized_shape");
  const double eps = attrs.Float("eps");
  const int lead = xs.rank() - static_cast<int>(norm.size());
  std::vector<int64_t> stat_dims(xs.dims().begin(), xs.dims().begin() + lead);
  int64_t d = 1;
  for (int64_t v : norm) d *= v;
  const int64_t rows = xs.numel() / d;
  Tensor y = ZerosF64(xs), mean_t = ZerosF64(Shape(stat_dims)), rstd_t = ZerosF64(Shape(stat_dims));
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < d; ++j) mean += At(in[0], r * d + j) / static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j) var += std::pow(At(in[0], r * d + j) - mean, 2) / static_cast<double>(d);
    At(mean_t, r) = mean;
    At(rstd_t, r) = 1 / std::sqrt(var + eps);
    for (int64_t j = 0; j < d; ++j) {
      double v = (At(in[0], r * d + j) - mean) / std::sqrt(var + eps);
      if (in.size() > 1) v *= At(in[1], j);
      if (in.size() > 2) v += At(in[2], j);
      At(y, r * d + j) = v;
    }
  }
  return {y, mean_t, rstd_t};
}

OpCase LayerNormCase(const std::string& name, Shape x, std::vector<int64_t> norm, int affine_inputs,
                     AttrMap extra = {}) {
  extra.Set("normalized_shape", norm);
  std::vector<InputSpec> ins = {InputSpec::Uniform(x, -1, 2)};
  if (affine_inputs >= 1) ins.push_back(InputSpec::Uniform(Shape(norm), 0.5, 1.5));
  if (affine_inputs >= 2) ins.push_back(InputSpec::Uniform(Shape(norm)));
  OpCase oc{name, "LayerNorm", extra, ins, LayerNormRef};
  oc.loss_outputs = {0};
  return oc;
}

TEST_CASE("layer norm passes the op harness") {
  std::vector<OpCase> cases = {
      LayerNormCase("layernorm last dim, gamma and beta", {4, 6}, {6}, 2),
      LayerNormCase("layernorm last two dims, gamma and beta", {2, 3, 4}, {3, 4}, 2),
      LayerNormCase("layernorm no affine", {3, 5}, {5}, 0),
      LayerNormCase("layernorm gamma only", {2, 3, 4}, {4}, 1),
      LayerNormCase("layernorm over all dims, eps 1e-3", {2, 3}, {2, 3}, 2, {{"eps", 1e-3}}),
      LayerNormCase("layernorm large (threaded rows and columns)", {512, 128}, {128}, 2),
      // CUDA paths: rows longer than a block, and dgamma / dbeta split over blocks.
      LayerNormCase("layernorm long rows", {5, 1000}, {1000}, 2),
      LayerNormCase("layernorm many short rows, gamma only", {3000, 8}, {8}, 1),
  };
  for (const OpCase& c : cases) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

// Builds `op` on inputs of the given types; returns the builder's status.
Status AddOp(const std::string& op, const std::vector<TensorType>& types, const AttrMap& attrs) {
  Graph graph;
  GraphBuilder b(&graph);
  std::vector<ValueId> ins;
  for (size_t i = 0; i < types.size(); ++i) ins.push_back(b.Input("in" + std::to_string(i), types[i]));
  return b.Add(op, ins, attrs, "op").status();
}

TEST_CASE("batch norm validates its inputs and attributes") {
  auto types = [](Shape x, Shape gamma) {
    TensorType c{{x[1]}, DType::kF32};
    return std::vector<TensorType>{{x, DType::kF32}, {gamma, DType::kF32}, c, c, c};
  };
  Status s = AddOp("BatchNorm", types({2, 3, 4}, {4}), {});
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("gamma") && Catch::Contains("[3]") && Catch::Contains("[4]"));

  s = AddOp("BatchNorm", types({2, 3, 4, 5, 6}, {3}), {});
  CHECK_THAT(s.message(), Catch::Contains("[N, C, H, W]") && Catch::Contains("[2, 3, 4, 5, 6]"));

  s = AddOp("BatchNorm", types({1, 3}, {3}), {{"training", true}});
  CHECK_THAT(s.message(), Catch::Contains("more than one value per channel"));
  CHECK(AddOp("BatchNorm", types({1, 3}, {3}), {{"training", false}}).ok());

  s = AddOp("BatchNorm", types({2, 3}, {3}), {{"momentum", 1.5}});
  CHECK_THAT(s.message(), Catch::Contains("momentum"));
  s = AddOp("BatchNorm", types({2, 3}, {3}), {{"eps", 0.0}});
  CHECK_THAT(s.message(), Catch::Contains("eps"));

  std::vector<TensorType> mixed = types({2, 3}, {3});
  mixed[4].dtype = DType::kF64;
  s = AddOp("BatchNorm", mixed, {});
  CHECK_THAT(s.message(), Catch::Contains("running_var"));
}

TEST_CASE("layer norm validates its inputs and attributes") {
  const TensorType x{{2, 3, 4}, DType::kF32};
  Status s = AddOp("LayerNorm", {x}, {});
  CHECK_THAT(s.message(), Catch::Contains("normalized_shape"));
  s = AddOp("LayerNorm", {x}, {{"normalized_shape", std::vector<int64_t>{3}}});
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("[3]") && Catch::Contains("[2, 3, 4]"));
  s = AddOp("LayerNorm", {x, {{4}, DType::kF32}, {{3}, DType::kF32}}, {{"normalized_shape", std::vector<int64_t>{4}}});
  CHECK_THAT(s.message(), Catch::Contains("beta") && Catch::Contains("[3]"));
  s = AddOp("LayerNorm", {x}, {{"normalized_shape", std::vector<int64_t>{3, 4}}, {"eps", -1.0}});
  CHECK_THAT(s.message(), Catch::Contains("eps"));
  CHECK(AddOp("LayerNorm", {x, {{3, 4}, DType::kF32}}, {{"normalized_shape", std::vector<int64_t>{3, 4}}}).ok());
}

TEST_CASE("norm costs scale with the input") {
  const OpDef* bn = OpRegistry::Global().FindOp("BatchNorm");
  REQUIRE(bn != nullptr);
  TensorType x{{2, 3, 4, 4}, DType::kF32}, c{{3}, DType::kF32};
  std::vector<TensorType> in = {x, c, c, c, c}, out = {x, c, c, c, c};
  OpCost train = bn->Cost({{"training", true}}, in, out);
  OpCost eval = bn->Cost({{"training", false}}, in, out);
  CHECK(train.flops == 6 * 96 + 14 * 3);
  CHECK(eval.flops == 2 * 96 + 6 * 3);
  CHECK(train.bytes_read > eval.bytes_read);
}

}  // namespace
}  // namespace loom::testing
