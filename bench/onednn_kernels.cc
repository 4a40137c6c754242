// oneDNN (Debian's libdnnl-dev 2.6, the library PyTorch uses on the CPU) on
// the GEMM and depthwise / 1x1 convolution rows of `loom bench kernels`, with
// the same shapes, so the two can be set side by side
// (bench/onednn_vs_loom.sh builds and runs this next to loom). Not part of the
// Bazel build: loom does not depend on oneDNN; this measures whether it should.
//
// Each row: the best of --reps timed runs after one warm-up, in ms and
// GFLOP/s (the same FLOP counts as loom's cost formulas: 2 per multiply-add,
// forward + input gradient + weight gradient for fwd+bwd). Convolutions let
// oneDNN pick its own memory layouts (format_tag::any); each is timed twice:
// the primitives alone (oneDNN's best case, its layouts kept between
// layers), and "+reorders", with every operand reordered from and to
// loom's NCHW / OIHW (what a drop-in kernel inside loom would pay).
// Threads: OMP_NUM_THREADS (oneDNN runs on OpenMP here).
//
//   g++ -O2 -std=c++17 bench/onednn_kernels.cc -ldnnl -o /tmp/onednn_kernels
//   OMP_NUM_THREADS=2 /tmp/onednn_kernels [reps]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using DType = memory::data_type;

double BestSeconds(int reps, const std::function<void()>& fn) {
  fn();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

void Row(const std::string& name, double seconds, double flops) {
  std::printf("%-40s %12.3f %12.1f\n", name.c_str(), seconds * 1e3, flops / seconds / 1e9);
}

void Sgemm(int reps, int64_t n) {
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
  const double secs = BestSeconds(reps, [&] {
    dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
  Row("matmul " + std::to_string(n) + "x" + std::to_string(n) + "x" + std::to_string(n), secs, 2.0 * n * n * n);
}

// A memory of `md`'s layout filled with a small constant.
memory Filled(const memory::desc& md, const dnnl::engine& eng) {
  memory m(md, eng);
  float* p = static_cast<float*>(m.get_data_handle());
  std::fill(p, p + md.get_size() / sizeof(float), 0.01f);
  return m;
}

// A reorder from `from` to `to`'s layout, or nothing when they match.
std::function<void(dnnl::stream&)> Reorder(const memory& from, const memory& to) {
  if (from.get_desc() == to.get_desc()) return [](dnnl::stream&) {};
  auto r = std::make_shared<dnnl::reorder>(from, to);
  return [r, from, to](dnnl::stream& s) { r->execute(s, const_cast<memory&>(from), const_cast<memory&>(to)); };
}

// Conv2d of [n, c, hw, hw] to o channels, kernel k, padding k / 2, stride 1,
// `groups` groups (c for depthwise); forward alone or with both gradients.
void Conv(int reps, const std::string& name, int64_t n, int64_t c, int64_t o, int64_t hw, int64_t k, int64_t groups,
          bool with_backward) {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  const memory::dims src{n, c, hw, hw}, dst{n, o, hw, hw}, strides{1, 1}, pad{k / 2, k / 2};
  const memory::dims wei = groups > 1 ? memory::dims{groups, o / groups, c / groups, k, k} : memory::dims{o, c, k, k};
  const memory::desc src_md(src, DType::f32, Tag::any), dst_md(dst, DType::f32, Tag::any),
      wei_md(wei, DType::f32, Tag::any);
  const dnnl::convolution_forward::primitive_desc fwd_pd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src_md,
                                      wei_md, dst_md, strides, pad, pad),
      eng);
  memory x = Filled(fwd_pd.src_desc(), eng), w = Filled(fwd_pd.weights_desc(), eng),
         y = Filled(fwd_pd.dst_desc(), eng);
  dnnl::convolution_forward fwd(fwd_pd);
  std::function<void()> step = [&] {
    fwd.execute(s, {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, y}});
    s.wait();
  };
  double flops = 2.0 * n * o * hw * hw * (c / groups) * k * k;
  // loom's layouts.
  const memory::desc x_nchw(src, DType::f32, Tag::nchw), y_nchw(dst, DType::f32, Tag::nchw),
      w_oihw(wei, DType::f32, groups > 1 ? Tag::goihw : Tag::oihw);
  memory x_user = Filled(x_nchw, eng), y_user = Filled(y_nchw, eng), w_user = Filled(w_oihw, eng);
  auto x_in = Reorder(x_user, x), w_in = Reorder(w_user, w), y_out = Reorder(y, y_user);
  std::function<void()> forward_with_reorders = [&] {
    x_in(s);
    w_in(s);
    fwd.execute(s, {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, y}});
    y_out(s);
    s.wait();
  };
  if (!with_backward) {
    Row(name, BestSeconds(reps, step), flops);
    Row(name + " +reorders", BestSeconds(reps, forward_with_reorders), flops);
    return;
  }
  const dnnl::convolution_backward_data::primitive_desc bwd_data_pd(
      dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, src_md, wei_md, dst_md, strides, pad,
                                            pad),
      eng, fwd_pd);
  const dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd(
      dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src_md, wei_md, dst_md, strides,
                                               pad, pad),
      eng, fwd_pd);
  memory dy = Filled(bwd_data_pd.diff_dst_desc(), eng), dx = Filled(bwd_data_pd.diff_src_desc(), eng),
         w_bwd = Filled(bwd_data_pd.weights_desc(), eng), x_bwd = Filled(bwd_weights_pd.src_desc(), eng),
         dy_w = Filled(bwd_weights_pd.diff_dst_desc(), eng), dw = Filled(bwd_weights_pd.diff_weights_desc(), eng);
  dnnl::convolution_backward_data bwd_data(bwd_data_pd);
  dnnl::convolution_backward_weights bwd_weights(bwd_weights_pd);
  step = [&] {
    fwd.execute(s, {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, y}});
    bwd_data.execute(s, {{DNNL_ARG_DIFF_DST, dy}, {DNNL_ARG_WEIGHTS, w_bwd}, {DNNL_ARG_DIFF_SRC, dx}});
    bwd_weights.execute(s, {{DNNL_ARG_SRC, x_bwd}, {DNNL_ARG_DIFF_DST, dy_w}, {DNNL_ARG_DIFF_WEIGHTS, dw}});
    s.wait();
  };
  Row(name, BestSeconds(reps, step), 3 * flops);
  memory dy_user = Filled(y_nchw, eng), dx_user = Filled(x_nchw, eng), dw_user = Filled(w_oihw, eng);
  auto dy_in = Reorder(dy_user, dy), dy_w_in = Reorder(dy_user, dy_w), w_bwd_in = Reorder(w_user, w_bwd),
       x_bwd_in = Reorder(x_user, x_bwd), dx_out = Reorder(dx, dx_user), dw_out = Reorder(dw, dw_user);
  step = [&] {
    forward_with_reorders();
    dy_in(s);
    dy_w_in(s);
    w_bwd_in(s);
    x_bwd_in(s);
    bwd_data.execute(s, {{DNNL_ARG_DIFF_DST, dy}, {DNNL_ARG_WEIGHTS, w_bwd}, {DNNL_ARG_DIFF_SRC, dx}});
    bwd_weights.execute(s, {{DNNL_ARG_SRC, x_bwd}, {DNNL_ARG_DIFF_DST, dy_w}, {DNNL_ARG_DIFF_WEIGHTS, dw}});
    dx_out(s);
    dw_out(s);
    s.wait();
  };
  Row(name + " +reorders", BestSeconds(reps, step), 3 * flops);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 9;
  const dnnl_version_t* v = dnnl_version();
  const char* threads = std::getenv("OMP_NUM_THREADS");
  std::printf("oneDNN %d.%d.%d (%s), OMP_NUM_THREADS=%s, best of %d\n", v->major, v->minor, v->patch, v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other runtime",
              threads ? threads : "(unset)", reps);
  std::printf("%-40s %12s %12s\n", "kernel", "time (ms)", "GFLOP/s");
  Sgemm(reps, 1024);
  Sgemm(reps, 256);
  Conv(reps, "conv2d fwd 32x64x28x28 k3", 32, 64, 64, 28, 3, 1, false);
  Conv(reps, "conv2d fwd+bwd 32x64x28x28 k3", 32, 64, 64, 28, 3, 1, true);
  Conv(reps, "conv2d fwd 32x128x14x14 k3", 32, 128, 128, 14, 3, 1, false);
  Conv(reps, "conv2d fwd+bwd 32x128x14x14 k3", 32, 128, 128, 14, 3, 1, true);
  Conv(reps, "depthwise fwd 32x72x16x16 k3", 32, 72, 72, 16, 3, 72, false);
  Conv(reps, "depthwise fwd+bwd 32x72x16x16 k3", 32, 72, 72, 16, 3, 72, true);
  Conv(reps, "depthwise fwd+bwd 32x120x8x8 k5", 32, 120, 120, 8, 5, 120, true);
  Conv(reps, "depthwise fwd+bwd 32x480x4x4 k3", 32, 480, 480, 4, 3, 480, true);
  Conv(reps, "pointwise fwd+bwd 32x40x8x8 -> 120", 32, 40, 120, 8, 1, 1, true);
  Conv(reps, "pointwise fwd+bwd 32x112x4x4 -> 672", 32, 112, 672, 4, 1, 1, true);
  return 0;
}
