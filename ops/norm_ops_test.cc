#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "core/rng.h"
#include "graph/builder.h"
#include "runtime/executor.h"
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
        if (attrs.Str("activation", "none") == "relu") At(y, k) = std::max(At(y, k), 0.0);
        if (attrs.Str("activation", "none") == "relu6") At(y, k) = std::min(std::max(At(y, k), 0.0), 6.0);
        if (attrs.Str("activation", "none") == "hardswish") {
          const double v = At(y, k);
          At(y, k) = v * std::min(std::max(v + 3, 0.0), 6.0) / 6;
        }
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
      // Planes of fewer than 8 elements go along rows, channels split over
      // threads (docs/benchmarks.md: MobileNetV3's 2x2 and 1x1 maps); a
      // batch that leaves a tail past the sums' 8 lanes.
      BatchNormCase("batchnorm2d train 2x2 planes, threaded channels", {64, 300, 2, 2}, true),
      BatchNormCase("batchnorm1d train [N, C], threaded channels, tail", {250, 300}, true),
      BatchNormCase("batchnorm2d eval 1x1 planes, threaded channels", {250, 300, 1, 1}, false),
      // Planes of 8 to 16 elements: sums per position over the batch, in
      // blocks of 32 channels of 4x4 planes (the last block of 6), and of
      // 3x3 planes (a run-time plane length).
      BatchNormCase("batchnorm2d train 4x4 planes, blocks of channels", {5, 70, 4, 4}, true),
      BatchNormCase("batchnorm2d train relu 3x3 planes", {6, 9, 3, 3}, true, {{"activation", "relu"}}),
      // The ReLU epilogue (the CPU executor folds a following ReLU into it):
      // planes along channels and along rows, training and eval.
      BatchNormCase("batchnorm2d train relu", {2, 3, 4, 5}, true, {{"activation", "relu"}}),
      BatchNormCase("batchnorm2d eval relu", {2, 3, 3, 4}, false, {{"activation", "relu"}}),
      BatchNormCase("batchnorm2d train relu 2x2 planes", {16, 40, 2, 2}, true, {{"activation", "relu"}}),
      BatchNormCase("batchnorm2d eval relu6", {2, 3, 3, 4}, false, {{"activation", "relu6"}}),
  };
  // ReLU6 with gammas of 4-8, so that both clamps act.
  OpCase relu6 = BatchNormCase("batchnorm2d train relu6, values past 6", {2, 3, 4, 5}, true, {{"activation", "relu6"}});
  relu6.inputs[1] = InputSpec::Uniform({3}, 4, 8);
  cases.push_back(relu6);
  // Hardswish, whose gradient BatchNormBackward takes itself (autodiff emits
  // it folded): gammas of 2-5, so that values fall past -3 and 3, away from
  // them by the gradient check's steps.
  for (bool training : {true, false}) {
    OpCase hardswish = BatchNormCase(std::string("batchnorm2d ") + (training ? "train" : "eval") + " hardswish",
                                     {2, 3, 4, 5}, training, {{"activation", "hardswish"}});
    hardswish.inputs[1] = InputSpec::Uniform({3}, 2, 5);
    cases.push_back(hardswish);
  }
  for (const OpCase& c : cases) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

// A training BatchNorm split along the batch into parts, as the TaskGraph
// lowers it (BatchNorm::Expand): per part a pivot (the first part's is the
// whole's, the others' zeros) and sums around the added pivots; the sums
// added (the all-reduce); each part normalized with them. Its backward
// likewise through BatchNormBackwardStats and BatchNormBackwardApply. The
// pieces run on `device` in `dtype`; returns, for each part, its outputs
// y, new running mean and variance, saved mean and invstd, dx, dgamma and
// dbeta, on the host in f64.
std::vector<std::vector<Tensor>> RunSplitBatchNorm(const std::vector<Tensor>& x_parts,
                                                   const std::vector<Tensor>& dy_parts,
                                                   const std::vector<Tensor>& channel_inputs, DType dtype,
                                                   Device device, double momentum, double eps) {
  Graph graph;
  GraphBuilder b(&graph);
  std::map<std::string, Tensor> feeds;
  auto input = [&](const std::string& name, const Tensor& value) {
    feeds[name] = value.Cast(dtype).value();
    return b.Input(name, {value.shape(), dtype});
  };
  auto add = [&](const std::string& op, const std::vector<ValueId>& in, const AttrMap& attrs) {
    auto outs = b.Add(op, in, attrs, op + std::to_string(graph.num_nodes()));
    INFO(op);
    REQUIRE(outs.status().ToString() == "OK");
    return *outs;
  };
  const char* channel_names[] = {"gamma", "beta", "running_mean", "running_var"};
  std::vector<ValueId> channel;
  for (int i = 0; i < 4; ++i) channel.push_back(input(channel_names[i], channel_inputs[i]));
  std::vector<ValueId> x, dy;
  int64_t count = 0;
  for (size_t k = 0; k < x_parts.size(); ++k) {
    x.push_back(input("x" + std::to_string(k), x_parts[k]));
    dy.push_back(input("dy" + std::to_string(k), dy_parts[k]));
    count += x_parts[k].numel() / x_parts[k].shape()[1];
  }
  // The all-reduce of per-part values.
  auto total = [&](const std::vector<ValueId>& parts) {
    ValueId sum = parts[0];
    for (size_t k = 1; k < parts.size(); ++k) sum = add("Add", {sum, parts[k]}, {})[0];
    return sum;
  };
  std::vector<ValueId> pivots, sums;
  for (size_t k = 0; k < x.size(); ++k) pivots.push_back(add("BatchNormPivot", {x[k]}, {{"first", k == 0}})[0]);
  const ValueId pivot = total(pivots);
  for (size_t k = 0; k < x.size(); ++k) sums.push_back(add("BatchNormStats", {x[k], pivot}, {})[0]);
  const ValueId forward_sums = total(sums);
  const AttrMap apply_attrs{{"momentum", momentum}, {"eps", eps}, {"count", count}};
  std::vector<std::vector<ValueId>> forward, backward_sums;
  std::vector<ValueId> grad_sums;
  for (size_t k = 0; k < x.size(); ++k) {
    forward.push_back(add("BatchNormApply",
                          {x[k], channel[0], channel[1], channel[2], channel[3], forward_sums, pivot}, apply_attrs));
    grad_sums.push_back(
        add("BatchNormBackwardStats", {dy[k], x[k], channel[0], forward[k][3], forward[k][4]}, {})[0]);
  }
  const ValueId backward_total = total(grad_sums);
  for (size_t k = 0; k < x.size(); ++k) {
    const std::vector<ValueId> grads =
        add("BatchNormBackwardApply", {dy[k], x[k], channel[0], forward[k][3], forward[k][4], backward_total},
            {{"count", count}});
    for (size_t j = 0; j < forward[k].size(); ++j)
      graph.outputs()["part" + std::to_string(k) + "_" + std::to_string(j)] = forward[k][j];
    for (size_t j = 0; j < grads.size(); ++j)
      graph.outputs()["part" + std::to_string(k) + "_" + std::to_string(5 + j)] = grads[j];
  }
  ExecutorOptions opts;
  opts.device = device;
  auto exec = Executor::Create(graph, opts);
  REQUIRE(exec.status().ToString() == "OK");
  auto result = (*exec)->Run(feeds);
  REQUIRE(result.status().ToString() == "OK");
  std::vector<std::vector<Tensor>> parts(x.size());
  for (size_t k = 0; k < x.size(); ++k)
    for (int j = 0; j < 8; ++j)
      parts[k].push_back((*result)["part" + std::to_string(k) + "_" + std::to_string(j)].Cast(DType::kF64).value());
  return parts;
}

// Rows [lo, hi) of a tensor's leading (batch) dimension.
Tensor BatchRows(const Tensor& t, int64_t lo, int64_t hi) {
  std::vector<int64_t> dims = t.shape().dims();
  const int64_t row = t.numel() / dims[0];
  dims[0] = hi - lo;
  Tensor part = ZerosF64(Shape(dims));
  for (int64_t i = 0; i < part.numel(); ++i) At(part, i) = At(t, lo * row + i);
  return part;
}

Tensor UniformF64(const Shape& shape, Rng& rng, double lo, double hi) {
  Tensor t = ZerosF64(shape);
  for (int64_t i = 0; i < t.numel(); ++i) At(t, i) = rng.Uniform(lo, hi);
  return t;
}

// The whole batch through BatchNorm and BatchNormBackward on the CPU in f64:
// y, new running mean and variance, saved mean and invstd, dx, dgamma, dbeta.
std::vector<Tensor> WholeBatchNorm(const Tensor& x, const Tensor& dy, const std::vector<Tensor>& channel_inputs,
                                   double momentum, double eps) {
  Graph graph;
  GraphBuilder b(&graph);
  std::map<std::string, Tensor> feeds{{"x", x}, {"dy", dy}};
  std::vector<ValueId> in = {b.Input("x", {x.shape(), DType::kF64})};
  const char* channel_names[] = {"gamma", "beta", "running_mean", "running_var"};
  for (int i = 0; i < 4; ++i) {
    in.push_back(b.Input(channel_names[i], {channel_inputs[i].shape(), DType::kF64}));
    feeds[channel_names[i]] = channel_inputs[i];
  }
  auto forward = b.Add("BatchNorm", in, {{"training", true}, {"momentum", momentum}, {"eps", eps}}, "bn");
  REQUIRE(forward.ok());
  const ValueId dy_in = b.Input("dy", {dy.shape(), DType::kF64});
  auto backward = b.Add("BatchNormBackward", {dy_in, in[0], in[1], (*forward)[3], (*forward)[4]},
                        {{"training", true}}, "bn_backward");
  REQUIRE(backward.status().ToString() == "OK");
  std::vector<ValueId> outs = *forward;
  outs.insert(outs.end(), backward->begin(), backward->end());
  for (size_t j = 0; j < outs.size(); ++j) graph.outputs()["out" + std::to_string(j)] = outs[j];
  auto exec = Executor::Create(graph, ExecutorOptions{});
  REQUIRE(exec.status().ToString() == "OK");
  auto result = (*exec)->Run(feeds);
  REQUIRE(result.status().ToString() == "OK");
  std::vector<Tensor> whole;
  for (size_t j = 0; j < outs.size(); ++j) whole.push_back((*result)["out" + std::to_string(j)]);
  return whole;
}

TEST_CASE("a BatchNorm split along the batch matches the whole, forward and backward, on every device") {
  struct Case {
    Shape x;
    std::vector<int64_t> cuts;  // the parts' first rows after the first part's
  };
  const std::vector<Case> cases = {
      {{6, 3}, {2}},
      {{5, 4, 7}, {1, 3}},        // a one-sample part
      {{4, 3, 5, 6}, {3}},
      {{3000, 4}, {1000, 2500}},  // CUDA: [N, C] sums split over blocks
      {{6, 40, 3}, {4}},          // CUDA: short planes of many channels
  };
  const double momentum = 0.2, eps = 1e-4;
  Rng rng(5);
  for (const Case& c : cases) {
    const int64_t channels = c.x[1];
    const Tensor x = UniformF64(c.x, rng, -1, 3), dy = UniformF64(c.x, rng, -1, 1);
    const std::vector<Tensor> channel_inputs = {UniformF64({channels}, rng, 0.5, 1.5),
                                                UniformF64({channels}, rng, -1, 1),
                                                UniformF64({channels}, rng, -1, 1),
                                                UniformF64({channels}, rng, 0.5, 2)};
    const std::vector<Tensor> whole = WholeBatchNorm(x, dy, channel_inputs, momentum, eps);
    std::vector<int64_t> bounds = {0};
    bounds.insert(bounds.end(), c.cuts.begin(), c.cuts.end());
    bounds.push_back(c.x[0]);
    std::vector<Tensor> x_parts, dy_parts;
    for (size_t k = 0; k + 1 < bounds.size(); ++k) {
      x_parts.push_back(BatchRows(x, bounds[k], bounds[k + 1]));
      dy_parts.push_back(BatchRows(dy, bounds[k], bounds[k + 1]));
    }
    for (const Device& device : TestDevices()) {
      for (DType dtype : {DType::kF64, DType::kF32}) {
        const double tolerance = dtype == DType::kF64 ? 1e-10 : 2e-4;
        const auto parts = RunSplitBatchNorm(x_parts, dy_parts, channel_inputs, dtype, device, momentum, eps);
        for (size_t k = 0; k < parts.size(); ++k) {
          for (int j = 0; j < 8; ++j) {
            // y and dx are the part's rows; the per-channel outputs are the whole's.
            const bool batched = j == 0 || j == 5;
            const Tensor expected = batched ? BatchRows(whole[j], bounds[k], bounds[k + 1]) : whole[j];
            INFO(c.x.ToString() << " part " << k << " output " << j << " in " << DTypeName(dtype) << " on "
                                << device.ToString());
            REQUIRE(parts[k][j].shape() == expected.shape());
            double worst = 0;
            for (int64_t i = 0; i < expected.numel(); ++i)
              worst = std::max(worst, std::abs(At(parts[k][j], i) - At(expected, i)) /
                                          std::max(1.0, std::abs(At(expected, i))));
            CHECK(worst <= tolerance);
          }
        }
      }
    }
  }
}

// Naive LayerNorm over the last k dims; outputs y, saved mean and rstd. With
// attr replica_dim, row r's gamma and beta are row q of [R, d], q its index
// along replica_dim divided by per_replica.
std::vector<Tensor> LayerNormRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  const Shape& xs = in[0].shape();
  const std::vector<int64_t> norm = attrs.Ints("normalized_shape");
  const double eps = attrs.Float("eps");
  const int lead = xs.rank() - static_cast<int>(norm.size());
  std::vector<int64_t> stat_dims(xs.dims().begin(), xs.dims().begin() + lead);
  int64_t d = 1;
  for (int64_t v : norm) d *= v;
  const int64_t rows = xs.numel() / d;
  const int replica_dim = static_cast<int>(attrs.Int("replica_dim", -1));
  auto replica_of = [&](int64_t r) -> int64_t {
    if (replica_dim < 0) return 0;
    int64_t index = r;  // r's index along replica_dim: strip the dims after it
    for (int i = lead - 1; i > replica_dim; --i) index /= xs[i];
    return index % xs[replica_dim] / attrs.Int("per_replica", 1);
  };
  Tensor y = ZerosF64(xs), mean_t = ZerosF64(Shape(stat_dims)), rstd_t = ZerosF64(Shape(stat_dims));
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < d; ++j) mean += At(in[0], r * d + j) / static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j) var += std::pow(At(in[0], r * d + j) - mean, 2) / static_cast<double>(d);
    At(mean_t, r) = mean;
    At(rstd_t, r) = 1 / std::sqrt(var + eps);
    const int64_t affine = replica_of(r) * d;
    for (int64_t j = 0; j < d; ++j) {
      double v = (At(in[0], r * d + j) - mean) / std::sqrt(var + eps);
      if (in.size() > 1) v *= At(in[1], affine + j);
      if (in.size() > 2) v += At(in[2], affine + j);
      At(y, r * d + j) = v;
    }
  }
  return {y, mean_t, rstd_t};
}

OpCase LayerNormCase(const std::string& name, Shape x, std::vector<int64_t> norm, int affine_inputs,
                     AttrMap extra = {}) {
  extra.Set("normalized_shape", norm);
  std::vector<int64_t> affine = norm;
  if (extra.Has("replica_dim")) {
    const int dim = static_cast<int>(extra.Int("replica_dim"));
    affine.insert(affine.begin(), x[dim] / (extra.Has("per_replica") ? extra.Int("per_replica") : 1));
  }
  std::vector<InputSpec> ins = {InputSpec::Uniform(x, -1, 2)};
  if (affine_inputs >= 1) ins.push_back(InputSpec::Uniform(Shape(affine), 0.5, 1.5));
  if (affine_inputs >= 2) ins.push_back(InputSpec::Uniform(Shape(affine)));
  OpCase oc{name, "LayerNorm", extra, ins, LayerNormRef};
  oc.loss_outputs = {0};
  return oc;
}

// BatchNormBackward with an activation (input 5, beta: what the executors
// fold a ReLUBackward, ReLU6Backward or HardswishBackward into) against the
// two ops apart
// after the same forward pass: the same bits, on every device, f32 and f64,
// training and eval, over planes the kernels walk each way. The mask is
// rebuilt from x, so in eval part of x sits where the pre-activation
// value's side of 0 (or 6) depends on how it was rounded (SensitiveXs): the
// rebuild must repeat the forward's arithmetic (the compiler contracts x *
// scale + shift into an FMA in both, or in neither).

// The value x * scale + shift rounded once (an FMA) and twice.
template <typename T>
std::pair<T, T> RoundedOnceAndTwice(T x, T scale, T shift) {
  volatile T product = x * scale;  // volatile: no contraction into an FMA
  return {std::fma(x, scale, shift), product + shift};
}

// x within 64 ulps of where x * scale + shift crosses `level` whose side
// of it differs between one rounding and two, or with scale or shift an ulp
// off: where a rebuilt mask that computed z otherwise than the forward pass
// would differ from it.
template <typename T>
std::vector<T> SensitiveXs(T scale, T shift, double level) {
  auto side = [&](T z) { return (z > T(level)) - (z < T(level)); };
  std::vector<T> found;
  T x = static_cast<T>((level - shift) / scale);
  for (int i = 0; i < 64; ++i) x = std::nextafter(x, T(-1e30));
  for (int i = 0; i < 128; ++i, x = std::nextafter(x, T(1e30))) {
    const auto [once, twice] = RoundedOnceAndTwice(x, scale, shift);
    const T up = std::nextafter(scale, T(1e30)), right = std::nextafter(shift, T(1e30));
    if (side(once) != side(twice) || side(once) != side(std::fma(x, up, shift)) ||
        side(once) != side(std::fma(x, scale, right)))
      found.push_back(x);
  }
  return found;
}

template <typename T>
void CheckRebuiltMask(const Device& device, bool training, const std::string& activation, int64_t side) {
  INFO(device.ToString() << " " << DTypeName(DTypeOf<T>::value) << (training ? " training " : " eval ") << activation
                         << " planes " << side << "x" << side);
  const int64_t n = 4, c = 6, s = side * side, per_plane = (s + 2) / 3;
  const Shape x_shape{n, c, side, side}, c_shape{c};
  const double eps = 1e-5;
  Rng rng(5);
  auto uniform = [&](const Shape& shape, double lo, double hi) {
    Tensor t = Tensor::Zeros(shape, DTypeOf<T>::value);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = static_cast<T>(rng.Uniform(lo, hi));
    return t;
  };
  const Tensor gamma = uniform(c_shape, 0.5, 1.5), beta = uniform(c_shape, -1, 1), mean = uniform(c_shape, -1, 1),
               var = uniform(c_shape, 0.5, 2), dy = uniform(x_shape, -1, 1);
  Tensor x = uniform(x_shape, -3, 5);
  int64_t sensitive = 0;
  if (!training) {  // every third element of a plane
    for (int64_t ch = 0; ch < c; ++ch) {
      // The forward's coefficients in eval, from the stored statistics.
      const double is = static_cast<T>(1.0 / std::sqrt(static_cast<double>(var.data<T>()[ch]) + eps));
      const double g = gamma.data<T>()[ch];
      const T scale = static_cast<T>(g * is), shift = static_cast<T>(beta.data<T>()[ch] - mean.data<T>()[ch] * g * is);
      std::vector<T> xs = SensitiveXs(scale, shift, 0);
      // ReLU6's and Hardswish's other breakpoints.
      const std::vector<double> levels = activation == "relu6"       ? std::vector<double>{6}
                                         : activation == "hardswish" ? std::vector<double>{-3, 3}
                                                                     : std::vector<double>{};
      for (double level : levels) {
        const std::vector<T> more = SensitiveXs(scale, shift, level);
        xs.insert(xs.end(), more.begin(), more.end());
      }
      sensitive += static_cast<int64_t>(xs.size());
      for (int64_t j = 0; j < static_cast<int64_t>(xs.size()) && j < n * per_plane; ++j)
        x.data<T>()[(j / per_plane * c + ch) * s + j % per_plane * 3] = xs[static_cast<size_t>(j)];
    }
    CHECK(sensitive > 0);
  }
  Graph graph;
  GraphBuilder b(&graph);
  std::map<std::string, Tensor> feeds;
  auto input = [&](const std::string& name, const Tensor& t) {
    feeds[name] = t;
    return b.Input(name, {t.shape(), t.dtype()});
  };
  const ValueId xv = input("x", x), gv = input("gamma", gamma), bv = input("beta", beta), mv = input("mean", mean),
                vv = input("var", var), dyv = input("dy", dy);
  auto forward = b.Add("BatchNorm", {xv, gv, bv, mv, vv}, AttrMap{{"training", training}, {"eps", eps}}, "bn");
  REQUIRE(forward.ok());
  const ValueId z = (*forward)[0], saved_mean = (*forward)[3], saved_invstd = (*forward)[4];
  const std::string op = activation == "relu" ? "ReLU" : activation == "relu6" ? "ReLU6" : "Hardswish";
  auto y = b.Add1(op, {z}, {}, "act");
  REQUIRE(y.ok());
  // As autodiff makes them: ReLU's backward reads its output, ReLU6's and
  // Hardswish's their input.
  auto act_grad = b.Add1(op + "Backward", {dyv, activation == "relu" ? *y : z}, {}, "act_grad");
  REQUIRE(act_grad.ok());
  const AttrMap plain{{"training", training}};
  AttrMap masked = plain;
  masked.Set("activation", activation.c_str());
  auto apart = b.Add("BatchNormBackward", {*act_grad, xv, gv, saved_mean, saved_invstd}, plain, "apart");
  auto folded = b.Add("BatchNormBackward", {dyv, xv, gv, saved_mean, saved_invstd, bv}, masked, "folded");
  // And the forward with the activation folded in: act(z), bit for bit.
  AttrMap forward_masked{{"training", training}, {"eps", eps}};
  forward_masked.Set("activation", activation.c_str());
  auto folded_forward = b.Add("BatchNorm", {xv, gv, bv, mv, vv}, forward_masked, "bn_act");
  REQUIRE(apart.ok());
  REQUIRE(folded.ok());
  REQUIRE(folded_forward.ok());
  for (int i = 0; i < 3; ++i) {
    graph.outputs()["apart" + std::to_string(i)] = (*apart)[i];
    graph.outputs()["folded" + std::to_string(i)] = (*folded)[i];
  }
  // Outputs, so that the executor folds neither the activation nor its backward.
  graph.outputs()["y"] = *y;
  graph.outputs()["act_grad"] = *act_grad;
  graph.outputs()["y_folded"] = (*folded_forward)[0];
  ExecutorOptions o;
  o.device = device;
  auto exec = Executor::Create(graph, o);
  REQUIRE(exec.ok());
  auto out = (*exec)->Run(feeds);
  REQUIRE(out.ok());
  for (int i = 0; i < 3; ++i)
    CheckBitwiseEqual("output " + std::to_string(i), out->at("apart" + std::to_string(i)),
                      out->at("folded" + std::to_string(i)));
  CheckBitwiseEqual("y", out->at("y"), out->at("y_folded"));
}

TEST_CASE("batch norm backward with an activation rebuilds z: its backward then BatchNormBackward, bit for bit") {
  for (const Device& device : TestDevices())
    for (bool training : {true, false})
      for (const std::string activation : {"relu", "relu6", "hardswish"})
        for (int64_t side : {5, 4, 2, 1}) {  // planes: long, along rows (RowSums), short, one element
          CheckRebuiltMask<float>(device, training, activation, side);
          CheckRebuiltMask<double>(device, training, activation, side);
        }
}

// Tensors larger than the kernels' cache blocks (8 MiB) go through both
// passes a block of channels at a time: each channel's results must be
// what it gives alone, bit for bit (forward and backward, ReLU folded in).
TEST_CASE("batch norm over blocks of channels gives each channel's results alone, bit for bit") {
  const int64_t n = 2, channels = 40, s = 32768;  // 10 MiB: four blocks in the backward, two in the forward
  auto step_graph = [](int64_t c) {
    Graph graph;
    GraphBuilder b(&graph);
    const Shape x_shape{n, c, s}, c_shape{c};
    const ValueId x = b.Input("x", {x_shape, DType::kF32}), dy = b.Input("dy", {x_shape, DType::kF32});
    std::vector<ValueId> params;
    for (const char* name : {"gamma", "beta", "running_mean", "running_var"})
      params.push_back(b.Input(name, {c_shape, DType::kF32}));
    const AttrMap attrs{{"training", true}, {"activation", "relu"}};
    auto forward = b.Add("BatchNorm", {x, params[0], params[1], params[2], params[3]}, attrs, "bn");
    REQUIRE(forward.ok());
    auto backward =
        b.Add("BatchNormBackward", {dy, x, params[0], (*forward)[3], (*forward)[4], params[1]}, attrs, "bwd");
    REQUIRE(backward.ok());
    for (int i = 0; i < 5; ++i) graph.outputs()["forward" + std::to_string(i)] = (*forward)[i];
    for (int i = 0; i < 3; ++i) graph.outputs()["backward" + std::to_string(i)] = (*backward)[i];
    auto exec = Executor::Create(graph, ExecutorOptions{});
    REQUIRE(exec.ok());
    return std::move(*exec);
  };
  Rng rng(11);
  auto uniform = [&](int64_t count, double lo, double hi) {
    std::vector<float> v(static_cast<size_t>(count));
    for (float& e : v) e = static_cast<float>(rng.Uniform(lo, hi));
    return v;
  };
  const std::vector<float> x = uniform(n * channels * s, -1, 3), dy = uniform(n * channels * s, -1, 1);
  const std::vector<float> gamma = uniform(channels, 0.5, 1.5), beta = uniform(channels, -1, 1),
                           mean = uniform(channels, -1, 1), var = uniform(channels, 0.5, 2);
  auto feeds_of = [&](int64_t c0, int64_t c) {  // channels [c0, c0 + c)
    auto planes = [&](const std::vector<float>& t) {
      std::vector<float> part;
      for (int64_t i = 0; i < n; ++i)
        part.insert(part.end(), t.begin() + (i * channels + c0) * s, t.begin() + (i * channels + c0 + c) * s);
      return Tensor::FromVector<float>({n, c, s}, part);
    };
    auto slice = [&](const std::vector<float>& t) {
      return Tensor::FromVector<float>({c}, std::vector<float>(t.begin() + c0, t.begin() + c0 + c));
    };
    return std::map<std::string, Tensor>{{"x", planes(x)},         {"dy", planes(dy)},
                                         {"gamma", slice(gamma)},  {"beta", slice(beta)},
                                         {"running_mean", slice(mean)}, {"running_var", slice(var)}};
  };
  auto whole = step_graph(channels)->Run(feeds_of(0, channels));
  REQUIRE(whole.ok());
  auto alone_exec = step_graph(1);
  for (int64_t c = 0; c < channels; ++c) {
    INFO("channel " << c);
    auto alone = alone_exec->Run(feeds_of(c, 1));
    REQUIRE(alone.ok());
    for (const auto& [name, t] : *alone) {
      const Tensor& w = whole->at(name);
      const bool per_element = t.shape().rank() == 3;  // y, dx; the rest are per channel
      for (int64_t i = 0; i < (per_element ? n : 1); ++i) {
        const int64_t count = per_element ? s : 1;
        const float* mine = t.data<float>() + i * count;
        const float* theirs = w.data<float>() + (per_element ? (i * channels + c) * s : c);
        REQUIRE(std::memcmp(mine, theirs, static_cast<size_t>(count) * sizeof(float)) == 0);
      }
    }
  }
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
      // A fused array's: each replica's gamma and beta a row of [R, d].
      LayerNormCase("layernorm replicas leading", {3, 4, 5}, {5}, 2, {{"replica_dim", 0}}),
      LayerNormCase("layernorm replicas between rows", {2, 3, 4, 6}, {6}, 2, {{"replica_dim", 1}}),
      LayerNormCase("layernorm replicas merged into a dim, gamma only", {2, 6, 5}, {5}, 1,
                    {{"replica_dim", 1}, {"per_replica", 2}}),
      LayerNormCase("layernorm replicas, two normalized dims", {3, 2, 3, 4}, {3, 4}, 2, {{"replica_dim", 1}}),
      LayerNormCase("layernorm replicas last before the row (time-major)", {50, 4, 3, 32}, {32}, 2,
                    {{"replica_dim", 2}}),  // CUDA: dgamma / dbeta split over blocks
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

// Zero channels: no planes to walk (the plane walk divides by the channel
// count), empty outputs.
TEST_CASE("batch norm and its batch-split statistics over zero channels give empty outputs") {
  const Shape x_shape{2, 0, 16}, c_shape{0};
  Graph graph;
  GraphBuilder b(&graph);
  const ValueId x = b.Input("x", {x_shape, DType::kF32}), pivot = b.Input("pivot", {c_shape, DType::kF32});
  std::vector<ValueId> params;
  for (const char* name : {"gamma", "beta", "running_mean", "running_var"})
    params.push_back(b.Input(name, {c_shape, DType::kF32}));
  auto forward = b.Add("BatchNorm", {x, params[0], params[1], params[2], params[3]}, {{"training", true}}, "bn");
  auto stats = b.Add("BatchNormStats", {x, pivot}, {}, "stats");
  REQUIRE(forward.status().ToString() == "OK");
  REQUIRE(stats.status().ToString() == "OK");
  graph.outputs()["y"] = (*forward)[0];
  graph.outputs()["sums"] = (*stats)[0];
  auto exec = Executor::Create(graph, ExecutorOptions{});
  REQUIRE(exec.status().ToString() == "OK");
  std::map<std::string, Tensor> feeds{{"x", Tensor::Zeros(x_shape)}, {"pivot", Tensor::Zeros(c_shape)}};
  for (const char* name : {"gamma", "beta", "running_mean", "running_var"}) feeds[name] = Tensor::Zeros(c_shape);
  auto out = (*exec)->Run(feeds);
  REQUIRE(out.status().ToString() == "OK");
  CHECK(out->at("y").numel() == 0);
  CHECK(out->at("sums").numel() == 0);
}

// A part with no first value (an empty batch, or empty planes) gives zero
// pivots: it read x[0, c, 0], past the end of an empty x, on the CPU.
TEST_CASE("BatchNormPivot of an empty batch or empty planes is zeros, on every device") {
  for (const Shape& shape : {Shape({0, 3, 4}), Shape({2, 3, 0})}) {
    for (const Device& device : TestDevices()) {
      INFO(shape.ToString() << " on " << device.ToString());
      Graph graph;
      GraphBuilder b(&graph);
      const ValueId x = b.Input("x", {shape, DType::kF32});
      auto pivot = b.Add("BatchNormPivot", {x}, {{"first", true}}, "pivot");
      REQUIRE(pivot.status().ToString() == "OK");
      graph.outputs()["pivot"] = (*pivot)[0];
      ExecutorOptions options;
      options.device = device;
      auto exec = Executor::Create(graph, options);
      REQUIRE(exec.status().ToString() == "OK");
      auto out = (*exec)->Run({{"x", Tensor::Zeros(shape, DType::kF32)}});
      REQUIRE(out.status().ToString() == "OK");
      const Tensor got = out->at("pivot").To(Device::Cpu()).value();
      REQUIRE(got.shape() == Shape({3}));
      for (int64_t c = 0; c < 3; ++c) CHECK(got.data<float>()[c] == 0.0f);
    }
  }
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
  s = AddOp("BatchNorm", types({2, 3}, {3}), {{"activation", "gelu"}});
  CHECK_THAT(s.message(), Catch::Contains("activation") && Catch::Contains("gelu"));

  std::vector<TensorType> mixed = types({2, 3}, {3});
  mixed[4].dtype = DType::kF64;
  s = AddOp("BatchNorm", mixed, {});
  CHECK_THAT(s.message(), Catch::Contains("running_var"));
}

TEST_CASE("batch norm backward with the ReLU mask needs beta") {
  const TensorType x{Shape{2, 3}, DType::kF32}, c{Shape{3}, DType::kF32};
  const AttrMap masked{{"training", true}, {"activation", "relu"}};
  Status s = AddOp("BatchNormBackward", {x, x, c, c, c}, masked);
  CHECK_THAT(s.message(), Catch::Contains("beta"));
  s = AddOp("BatchNormBackward", {x, x, c, c, c, x}, masked);
  CHECK_THAT(s.message(), Catch::Contains("gamma and beta differ"));
  CHECK(AddOp("BatchNormBackward", {x, x, c, c, c, c}, masked).ok());
  const AttrMap stats_masked{{"activation", "relu"}};
  s = AddOp("BatchNormBackwardStats", {x, x, c, c}, stats_masked);
  CHECK_THAT(s.message(), Catch::Contains("saved_invstd"));
  CHECK(AddOp("BatchNormBackwardStats", {x, x, c, c, c, c}, stats_masked).ok());
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

  // A fused array's: gamma and beta led by the replicas of a leading dim.
  const AttrMap replicas = {{"normalized_shape", std::vector<int64_t>{4}}, {"replica_dim", 1}};
  CHECK(AddOp("LayerNorm", {x, {{3, 4}, DType::kF32}, {{3, 4}, DType::kF32}}, replicas).ok());
  s = AddOp("LayerNorm", {x, {{4}, DType::kF32}}, replicas);
  CHECK_THAT(s.message(), Catch::Contains("gamma") && Catch::Contains("[3, 4]") && Catch::Contains("replicas"));
  s = AddOp("LayerNorm", {x}, {{"normalized_shape", std::vector<int64_t>{4}}, {"replica_dim", 2}});
  CHECK_THAT(s.message(), Catch::Contains("replica_dim 2") && Catch::Contains("leading dims"));
  s = AddOp("LayerNorm", {x}, {{"normalized_shape", std::vector<int64_t>{4}}, {"replica_dim", 1}, {"per_replica", 2}});
  CHECK_THAT(s.message(), Catch::Contains("per_replica 2") && Catch::Contains("[2, 3, 4]"));
  s = AddOp("LayerNorm", {x}, {{"normalized_shape", std::vector<int64_t>{4}}, {"replica_dim", -3}});
  CHECK_THAT(s.message(), Catch::Contains("replica_dim -3"));
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
