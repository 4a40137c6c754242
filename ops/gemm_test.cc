// Gemm / BatchedGemm against a naive triple loop in double: the four
// transpose combinations, odd and block-straddling shapes, strided operands,
// alpha / beta (beta = 0 must not read C), k = 0, batches, results that are
// bit-identical for any thread count, and a B that packs its own panels
// (BPanels) bit for bit as the same B in memory. The hidden [.bench] case times the
// MLP's GEMM shapes against Eigen.
#include "ops/gemm.h"
#include "ops/sgemm_kernels.h"

#include <Eigen/Core>
#include <catch2/catch.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace loom {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = 12345.0f;

// A row-major matrix of `rows` x `cols` in a buffer with leading dimension
// ld >= cols; the padding holds NaN (a GEMM must never read it into C).
template <typename T>
struct Mat {
  int64_t rows, cols, ld;
  std::vector<T> data;
  Mat(int64_t r, int64_t c, int64_t pad, std::mt19937* rng, T fill_pad = std::numeric_limits<T>::quiet_NaN())
      : rows(r), cols(c), ld(c + pad), data(static_cast<size_t>(std::max<int64_t>(1, r * (c + pad))), fill_pad) {
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) data[i * ld + j] = static_cast<T>(u(*rng));
  }
  T at(int64_t i, int64_t j) const { return data[i * ld + j]; }
};

struct Case {
  bool ta, tb;
  int64_t m, n, k;
  double alpha, beta;
  int64_t pad_a = 0, pad_b = 0, pad_c = 0;
};

std::string Describe(const Case& c) {
  char s[200];
  std::snprintf(s, sizeof(s), "ta=%d tb=%d m=%lld n=%lld k=%lld alpha=%g beta=%g pads=%lld,%lld,%lld", c.ta, c.tb,
                static_cast<long long>(c.m), static_cast<long long>(c.n), static_cast<long long>(c.k), c.alpha,
                c.beta, static_cast<long long>(c.pad_a), static_cast<long long>(c.pad_b),
                static_cast<long long>(c.pad_c));
  return s;
}

// Runs Gemm<T> on `pool` (nullptr: one thread) and checks every element
// against a double triple loop, and that C's padding is untouched. Returns C.
template <typename T>
std::vector<T> CheckGemm(const Case& c, ThreadPool* pool, uint32_t seed = 1) {
  INFO(Describe(c));
  std::mt19937 rng(seed);
  Mat<T> a(c.ta ? c.k : c.m, c.ta ? c.m : c.k, c.pad_a, &rng);
  Mat<T> b(c.tb ? c.n : c.k, c.tb ? c.k : c.n, c.pad_b, &rng);
  Mat<T> cm(c.m, c.n, c.pad_c, &rng, static_cast<T>(kSentinel));
  const Mat<T> c0 = cm;
  if (c.beta == 0)  // beta = 0: C holds garbage that must not be read
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) cm.data[i * cm.ld + j] = static_cast<T>(kNaN);
  Gemm<T>(c.ta, c.tb, c.m, c.n, c.k, static_cast<T>(c.alpha), a.data.data(), a.ld, b.data.data(), b.ld,
          static_cast<T>(c.beta), cm.data.data(), cm.ld, pool);
  const double eps = std::is_same<T, float>::value ? 1e-5 : 1e-12;
  int64_t bad = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0, mag = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double x = c.ta ? a.at(p, i) : a.at(i, p), y = c.tb ? b.at(j, p) : b.at(p, j);
        sum += x * y;
        mag += std::abs(x * y);
      }
      double ref = c.alpha * sum, scale = std::abs(c.alpha) * mag;
      if (c.beta != 0) {
        ref += c.beta * c0.at(i, j);
        scale += std::abs(c.beta * c0.at(i, j));
      }
      const double got = cm.at(i, j);
      const double tol = eps * std::sqrt(static_cast<double>(c.k) + 1) * (scale + 1e-30);
      if (!(std::abs(got - ref) <= tol) && bad++ < 5) {
        UNSCOPED_INFO("C(" << i << ", " << j << ") = " << got << ", expected " << ref << " (tol " << tol << ")");
      }
    }
    for (int64_t j = c.n; j < cm.ld; ++j)
      if (cm.at(i, j) != static_cast<T>(kSentinel) && bad++ < 5)
        UNSCOPED_INFO("padding C(" << i << ", " << j << ") overwritten: " << cm.at(i, j));
  }
  CHECK(bad == 0);
  return cm.data;
}

bool CpuHasAvx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

const bool kTrans[4][2] = {{false, false}, {true, false}, {false, true}, {true, true}};

// op(B) of a matrix in memory, made panel by panel as BPanels asks: a
// GEMM with it must give the memory GEMM's C bit for bit. Each call's
// block is checked to lie inside op(B) and its panels are filled whole.
template <typename T>
struct MatPanels {
  const Mat<T>* b;
  bool tb;
  int64_t k, n;
  mutable bool out_of_range = false;
  static void Pack(const void* ctx, int64_t p0, int64_t kc, int64_t j0, int64_t nc, int64_t nr, T* dst) {
    const MatPanels& s = *static_cast<const MatPanels*>(ctx);
    if (p0 < 0 || kc < 1 || p0 + kc > s.k || j0 < 0 || nc < 1 || j0 + nc > s.n || nr < 1) s.out_of_range = true;
    for (int64_t p = 0; p < kc; ++p)
      for (int64_t j = 0; j < (nc + nr - 1) / nr * nr; ++j)
        dst[(j / nr) * kc * nr + p * nr + j % nr] =
            j >= nc ? T(0) : s.tb ? s.b->at(j0 + j, p0 + p) : s.b->at(p0 + p, j0 + j);
  }
  BPanels<T> Panels() const { return {&Pack, this}; }
};

TEST_CASE("gemm f32 matches a naive product: odd and block-straddling shapes") {
  // MR = 6, NR = 16 (AVX2) or 32 (AVX-512), KC ~ 320, MC = 144 in the micro-kernels; the shapes
  // straddle each, including partial register tiles on both sides, and
  // cover both ways of reading op(A): packed, and in place (n <= 128 for A,
  // one micro-panel of n for A^T), and products of few rows against wide
  // ones, which run transposed.
  const int64_t shapes[][3] = {
      {1, 1, 1},     {7, 13, 5},    {17, 33, 65},  {100, 3, 257}, {3, 100, 2},   {5, 15, 8},     {6, 16, 8},
      {7, 17, 9},    {12, 32, 31},  {13, 47, 7},   {1, 200, 33},  {200, 1, 33},  {31, 9, 319},   {11, 18, 320},
      {9, 21, 321},  {8, 8, 641},   {143, 20, 40}, {144, 17, 11}, {145, 33, 12}, {150, 48, 350}, {290, 5, 3},
      {64, 112, 576}, {128, 10, 128}, {2, 3100, 9}, {145, 150, 341}, {7, 200, 650}, {37, 129, 20},
  };
  for (const auto& s : shapes)
    for (const auto& t : kTrans) CheckGemm<float>({t[0], t[1], s[0], s[1], s[2], 1.0, 0.0}, nullptr);
}

TEST_CASE("gemm f32 strided operands and alpha / beta") {
  const double ab[][2] = {{1.0, 0.0}, {1.0, 1.0}, {1.0, 0.5}, {-1.5, 0.0}, {2.0, 1.0}, {0.25, -0.75}};
  for (const auto& t : kTrans)
    for (const auto& x : ab) {
      CheckGemm<float>({t[0], t[1], 19, 35, 70, x[0], x[1], 3, 5, 7}, nullptr);
      CheckGemm<float>({t[0], t[1], 40, 17, 333, x[0], x[1], 1, 9, 2}, nullptr);
      // Few rows against wide ones: transposed where RunsTransposed takes it.
      CheckGemm<float>({t[0], t[1], 20, 300, 400, x[0], x[1], 3, 5, 7}, nullptr);
    }
}

// A product of at most one micro-panel's width of rows against a wide B
// runs as C^T = op(B)^T op(A)^T; each of its rows must be the bits of the
// same row of a product with more rows (which runs as given).
TEST_CASE("gemm f32 of few rows: the bits of the same rows of a taller product") {
  if (!CpuHasAvx2()) {
    WARN("no AVX2 + FMA: Eigen runs f32, whose blocking depends on the shape");
    return;
  }
  ThreadPool pool(2);
  const int64_t tall = 40, n = 300, k = 700;
  for (const auto& t : kTrans)
    for (double beta : {0.0, 0.5})
      for (int64_t few : {1, 7, 16, 32}) {
        INFO("ta=" << t[0] << " tb=" << t[1] << " beta=" << beta << " rows=" << few);
        std::mt19937 rng(3);
        const Mat<float> a(t[0] ? k : tall, t[0] ? tall : k, 2, &rng);
        const Mat<float> b(t[1] ? n : k, t[1] ? k : n, 1, &rng);
        const Mat<float> c0(tall, n, 3, &rng);
        Mat<float> c_tall = c0, c_few = c0;
        for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
          Gemm<float>(t[0], t[1], tall, n, k, 1.5f, a.data.data(), a.ld, b.data.data(), b.ld,
                      static_cast<float>(beta), c_tall.data.data(), c_tall.ld, p);
          Gemm<float>(t[0], t[1], few, n, k, 1.5f, a.data.data(), a.ld, b.data.data(), b.ld,
                      static_cast<float>(beta), c_few.data.data(), c_few.ld, p);
          CHECK(std::memcmp(c_tall.data.data(), c_few.data.data(), few * c_few.ld * sizeof(float)) == 0);
          CHECK(std::memcmp(c0.data.data() + few * c0.ld, c_few.data.data() + few * c_few.ld,
                            (tall - few) * c0.ld * sizeof(float)) == 0);  // rows past `few` untouched
          c_tall = c0;
          c_few = c0;
        }
      }
}

TEST_CASE("gemm f32 k = 0 scales C by beta") {
  for (const auto& t : kTrans) {
    CheckGemm<float>({t[0], t[1], 9, 21, 0, 1.0, 0.0}, nullptr);  // NaN C -> zeros
    CheckGemm<float>({t[0], t[1], 9, 21, 0, 1.0, 1.0, 0, 0, 3}, nullptr);
    CheckGemm<float>({t[0], t[1], 9, 21, 0, 1.0, 0.5, 0, 0, 3}, nullptr);
  }
}

TEST_CASE("gemm f64 (Eigen path) matches a naive product") {
  for (const auto& t : kTrans) {
    CheckGemm<double>({t[0], t[1], 7, 13, 5, 1.0, 0.0}, nullptr);
    CheckGemm<double>({t[0], t[1], 33, 70, 45, 0.5, 0.5, 2, 3, 4}, nullptr);
    ThreadPool pool(2);
    CheckGemm<double>({t[0], t[1], 90, 100, 60, 1.0, 1.0}, &pool);
  }
}

// The micro-kernels compute every element of C with the same FMAs in the
// same k order whatever panel or thread it lands in. (Eigen's fallback picks
// its k blocking from the panel's size, so this holds with a micro-kernel
// only: on CPUs with AVX2.)
TEST_CASE("gemm f32 results are bit-identical for 1, 2 and 3 threads") {
  if (!CpuHasAvx2()) {
    WARN("no AVX2 + FMA: Eigen runs f32, whose results may depend on the split");
    return;
  }
  ThreadPool p1(1), p2(2), p3(3);
  // Large enough to split (>= 2 MFLOP per thread): both split directions (m
  // >= n splits rows, else columns), sizes that are not multiples of the
  // register tile, several k blocks, strided operands.
  const Case cases[] = {
      {false, false, 150, 200, 700, 1.0, 0.0},           {false, false, 401, 100, 333, 1.0, 1.0},
      {false, false, 128, 256, 784, 1.0, 0.0},           {false, false, 97, 250, 1000, 0.5, 0.5, 3, 2, 1},
  };
  for (const Case& base : cases)
    for (const auto& t : kTrans) {
      Case c = base;
      c.ta = t[0];
      c.tb = t[1];
      const std::vector<float> r0 = CheckGemm<float>(c, nullptr);
      const std::vector<float> r1 = CheckGemm<float>(c, &p1);
      const std::vector<float> r2 = CheckGemm<float>(c, &p2);
      const std::vector<float> r3 = CheckGemm<float>(c, &p3);
      INFO(Describe(c));
      CHECK(std::memcmp(r0.data(), r1.data(), r0.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(r0.data(), r2.data(), r0.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(r0.data(), r3.data(), r0.size() * sizeof(float)) == 0);
    }
}

// Each micro-kernel, called directly, on the odd shapes above and on
// strided operands with alpha and beta: C (its padding included) is the
// AVX2 kernel's bit for bit, which CheckGemm holds to the naive product
// where AVX2 is the kernel chosen. The 6 x 32 tiling runs on ymm pairs on
// every AVX2 CPU and on zmm registers where AVX-512 is present.
TEST_CASE("the f32 micro-kernels agree bit for bit: AVX2, the 6x32 tiling, AVX-512 where present") {
  if (!CpuHasAvx2()) {
    WARN("no AVX2 + FMA: no micro-kernel runs here");
    return;
  }
  std::vector<sgemm::Kernel> others = {sgemm::Avx2WideKernel()};
  if (__builtin_cpu_supports("avx512f")) others.push_back(sgemm::Avx512Kernel());
  else WARN("no AVX-512 on this CPU: the AVX-512 kernel is checked through its tiling on ymm pairs only");
  const int64_t shapes[][3] = {
      {1, 1, 1},    {7, 13, 5},    {17, 33, 65},   {100, 3, 257}, {5, 31, 8},    {6, 32, 8},    {7, 33, 9},
      {12, 64, 31}, {13, 47, 7},   {1, 200, 33},   {31, 9, 319},  {9, 21, 321},  {8, 8, 641},   {145, 33, 12},
      {150, 48, 350}, {64, 112, 576}, {2, 3100, 9}, {145, 150, 341}, {7, 200, 650}, {37, 129, 20}, {20, 3073, 30},
  };
  const double ab[][2] = {{1.0, 0.0}, {1.0, 1.0}, {0.25, -0.75}};
  for (const auto& s : shapes)
    for (const auto& t : kTrans)
      for (const auto& x : ab) {
        const Case c{t[0], t[1], s[0], s[1], s[2], x[0], x[1], 1, 3, 2};
        std::mt19937 rng(5);
        const Mat<float> a(c.ta ? c.k : c.m, c.ta ? c.m : c.k, c.pad_a, &rng);
        const Mat<float> b(c.tb ? c.n : c.k, c.tb ? c.k : c.n, c.pad_b, &rng);
        const Mat<float> c0(c.m, c.n, c.pad_c, &rng, kSentinel);
        auto run = [&](const sgemm::Kernel& kernel) {
          std::vector<float> out = c0.data;
          kernel.run(c.ta, c.tb, c.m, c.n, c.k, static_cast<float>(c.alpha), a.data.data(), a.ld, b.data.data(),
                     b.ld, static_cast<float>(c.beta), out.data(), c0.ld);
          return out;
        };
        // The same with op(B) packed panel by panel by its owner.
        const MatPanels<float> panels{&b, c.tb, c.k, c.n};
        auto run_panels = [&](const sgemm::Kernel& kernel) {
          std::vector<float> out = c0.data;
          kernel.run_panels(c.ta, c.m, c.n, c.k, static_cast<float>(c.alpha), a.data.data(), a.ld,
                            &MatPanels<float>::Pack, &panels, static_cast<float>(c.beta), out.data(), c0.ld);
          return out;
        };
        const std::vector<float> want = run(sgemm::Avx2Kernel());
        CHECK(std::memcmp(want.data(), run_panels(sgemm::Avx2Kernel()).data(), want.size() * sizeof(float)) == 0);
        for (const sgemm::Kernel& kernel : others) {
          INFO(kernel.name << ": " << Describe(c));
          const std::vector<float> got = run(kernel);
          CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
          CHECK(std::memcmp(want.data(), run_panels(kernel).data(), want.size() * sizeof(float)) == 0);
        }
        CHECK_FALSE(panels.out_of_range);
      }
}

template <typename T>
void CheckPanelsMatchMemory(const Case& c, ThreadPool* pool) {
  INFO(Describe(c) << " threads " << (pool ? pool->num_threads() : 0));
  std::mt19937 rng(9);
  const Mat<T> a(c.ta ? c.k : c.m, c.ta ? c.m : c.k, c.pad_a, &rng);
  const Mat<T> b(c.tb ? c.n : c.k, c.tb ? c.k : c.n, c.pad_b, &rng);
  const Mat<T> c0(c.m, c.n, c.pad_c, &rng, static_cast<T>(kSentinel));
  std::vector<T> want = c0.data, got = c0.data;
  Gemm<T>(c.ta, c.tb, c.m, c.n, c.k, static_cast<T>(c.alpha), a.data.data(), a.ld, b.data.data(), b.ld,
          static_cast<T>(c.beta), want.data(), c0.ld, pool);
  const MatPanels<T> panels{&b, c.tb, c.k, c.n};
  Gemm<T>(c.ta, c.m, c.n, c.k, static_cast<T>(c.alpha), a.data.data(), a.ld, panels.Panels(),
          static_cast<T>(c.beta), got.data(), c0.ld, pool);
  CHECK_FALSE(panels.out_of_range);
  if (std::is_same_v<T, float> && CpuHasAvx2()) {
    CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(T)) == 0);
  } else {  // Eigen: the panels are one matrix op(B), whose product may round as B^T's does not
    for (size_t i = 0; i < want.size(); ++i) CHECK(std::abs(double(want[i]) - double(got[i])) <= 1e-12 * c.k);
  }
}

TEST_CASE("a B that packs its own panels gives the product of the same B in memory, bit for bit") {
  ThreadPool p2(2), p3(3);
  // Panel (16, 32) and k-block (~320) edges, more columns than a column
  // block (3072), and products big enough to split by rows and by columns.
  const int64_t shapes[][3] = {{1, 1, 1},      {7, 13, 5},     {17, 33, 65},    {6, 32, 8},    {13, 47, 321},
                               {64, 96, 576},  {20, 3100, 30}, {150, 200, 700}, {401, 100, 333}};
  for (const auto& s : shapes)
    for (const auto& t : kTrans)
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &p2, &p3}) {
        const Case c{t[0], t[1], s[0], s[1], s[2], 0.5, s[0] % 2 ? 1.0 : 0.0, 2, 1, 3};
        CheckPanelsMatchMemory<float>(c, pool);
        if (s[0] * s[1] * s[2] < 1e6) CheckPanelsMatchMemory<double>(c, pool);
      }
}

// Batches of `batch` m x n x k products at strides, with pools of 1, 2, 3
// and 8 threads (batch >= threads: whole entries per thread; batch <
// threads: each entry's Gemm splits), beta 0 (C's entries hold NaN, which
// must not be read) and 0.5; everything outside the entries' m x n blocks
// stays untouched, and the operands' padding and gaps (NaN) are never
// read. Operands of f32, or bf16 (the bf16 GEMM, C in f32: its products
// exact in f32, its sums rounded as f32 ones).
template <typename TI>
void CheckBatched(int64_t batch, int64_t m, int64_t n, int64_t k) {
  constexpr bool kBf16 = std::is_same_v<TI, BFloat16>;
  auto value = [](float v) {
    if constexpr (kBf16) return ToBFloat16(v);
    else return v;
  };
  auto widen = [](TI v) {
    if constexpr (kBf16) return static_cast<double>(ToFloat(v));
    else return static_cast<double>(v);
  };
  for (const auto& t : kTrans) {
    const bool ta = t[0], tb = t[1];
    INFO((kBf16 ? "bf16" : "f32") << " batch=" << batch << " m=" << m << " n=" << n << " k=" << k << " ta=" << ta
                                  << " tb=" << tb);
    std::mt19937 rng(3);
    const int64_t lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 3, ldc = n + 1;
    const int64_t sa = (ta ? k : m) * lda + 11, sb = (tb ? n : k) * ldb + 5, sc = m * ldc + 7;
    auto operand = [&](int64_t rows, int64_t cols, int64_t ld, int64_t stride) {
      std::vector<TI> x(static_cast<size_t>(batch * stride), value(kNaN));
      std::uniform_real_distribution<float> u(-1, 1);
      for (int64_t e = 0; e < batch; ++e)
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j) x[e * stride + i * ld + j] = value(u(rng));
      return x;
    };
    const std::vector<TI> a = operand(ta ? k : m, ta ? m : k, lda, sa), b = operand(tb ? n : k, tb ? k : n, ldb, sb);
    std::vector<float> c0(static_cast<size_t>(batch * sc));
    for (float& v : c0) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    std::vector<std::vector<float>> results;
    ThreadPool p1(1), p2(2), p3(3), p8(8);
    for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &p1, &p2, &p3, &p8}) {
      for (const double beta : {0.0, 0.5}) {
        std::vector<float> c = c0;
        if (beta == 0.0)
          for (int64_t e = 0; e < batch; ++e)
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) c[e * sc + i * ldc + j] = kNaN;
        BatchedGemm(ta, tb, batch, m, n, k, 1.5f, a.data(), lda, sa, b.data(), ldb, sb, static_cast<float>(beta),
                    c.data(), ldc, sc, pool);
        int64_t bad = 0;
        for (int64_t e = 0; e < batch; ++e) {
          const TI *ae = a.data() + e * sa, *be = b.data() + e * sb;
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double sum = 0, mag = 0;
              for (int64_t p = 0; p < k; ++p) {
                const double x = widen(ta ? ae[p * lda + i] : ae[i * lda + p]);
                const double y = widen(tb ? be[j * ldb + p] : be[p * ldb + j]);
                sum += x * y;
                mag += std::abs(x * y);
              }
              const double cij = c0[e * sc + i * ldc + j];
              const double ref = 1.5 * sum + beta * cij, tol = 1e-5 * std::sqrt(k + 1.0) * (1.5 * mag + std::abs(cij));
              if (!(std::abs(c[e * sc + i * ldc + j] - ref) <= tol)) ++bad;
            }
          for (int64_t x = 0; x < sc; ++x) {
            const int64_t i = x / ldc, j = x % ldc;
            if ((i >= m || j >= n) && c[e * sc + x] != c0[e * sc + x]) ++bad;
          }
        }
        CHECK(bad == 0);
        if (beta == 0.0) results.push_back(c);
      }
    }
    if (kBf16 || CpuHasAvx2())
      for (size_t r = 1; r < results.size(); ++r)
        CHECK(std::memcmp(results[0].data(), results[r].data(), results[0].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("batched gemm f32 with strides, any thread count") {
  CheckBatched<float>(5, 23, 37, 45);      // small: runs on one thread
  CheckBatched<float>(4, 100, 120, 400);   // ~10 MFLOP per entry: entries spread over the threads
  CheckBatched<float>(2, 130, 150, 500);   // batch < 3 or 8 threads: each entry's Gemm splits
  CheckBatched<float>(4, 16, 300, 600);    // few rows, wide: entries over the threads, each run transposed
}

TEST_CASE("batched gemm of bf16 operands (AVX512_BF16) with strides, any thread count") {
  if (!HasBf16Gemm()) {
    WARN("no AVX512_BF16 on this CPU: the bf16 ops widen to f32, checked by their op tests");
    return;
  }
  CheckBatched<BFloat16>(1, 1, 1, 1);
  CheckBatched<BFloat16>(5, 23, 37, 45);     // odd k: the last pair padded with a zero
  CheckBatched<BFloat16>(4, 100, 120, 400);  // entries spread over the threads
  CheckBatched<BFloat16>(2, 130, 150, 501);  // each entry's product split into panels
  CheckBatched<BFloat16>(3, 7, 33, 1025);    // three k blocks, the last of an odd length
  CheckBatched<BFloat16>(1, 145, 40, 16);    // row blocks past kMC, a narrow last column panel
  CheckBatched<BFloat16>(1, 9, 3100, 24);    // column blocks past kNC
}

// Times Gemm<float> on the MLP's and a conv layer's shapes against Eigen's
// product (one thread), best of many runs:
//   bazel run -c opt //ops:gemm_test -- "[.bench]"
TEST_CASE("gemm f32 speed on training shapes", "[.bench]") {
  struct Shape {
    const char* name;
    bool ta, tb;
    int64_t m, n, k;
  };
  const Shape shapes[] = {
      {"linear fwd [128x784]x[256x784]^T", false, true, 128, 256, 784},
      {"dX [128x256]x[256x784]", false, false, 128, 784, 256},
      {"dW [128x256]^T x[128x784]", true, false, 256, 784, 128},
      {"linear2 fwd [128x256]x[128x256]^T", false, true, 128, 128, 256},
      {"[128x256]x[256x128]", false, false, 128, 128, 256},
      {"conv fwd [64x576]x[576x112]", false, false, 64, 112, 576},
      {"conv dx [576x64]^T x[64x112]", true, false, 576, 112, 64},
      {"conv dW [64x784]x[576x784]^T", false, true, 64, 576, 784},
      {"square 256", false, false, 256, 256, 256},
      {"square 1024", false, false, 1024, 1024, 1024},
  };
  ThreadPool pool2(2);
  std::mt19937 rng(5);
  for (const Shape& s : shapes) {
    Mat<float> a(s.ta ? s.k : s.m, s.ta ? s.m : s.k, 0, &rng), b(s.tb ? s.n : s.k, s.tb ? s.k : s.n, 0, &rng);
    std::vector<float> c(static_cast<size_t>(s.m * s.n));
    const double flops = 2.0 * s.m * s.n * s.k;
    const int reps = static_cast<int>(std::clamp(3e9 / flops, 5.0, 400.0));
    auto best = [&](auto&& fn) {
      fn();
      double t = 1e30;
      for (int r = 0; r < reps; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        fn();
        t = std::min(t, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      return flops / t / 1e9;
    };
    using RM = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::Map<const RM> A(a.data.data(), a.rows, a.cols), B(b.data.data(), b.rows, b.cols);
    Eigen::Map<RM> C(c.data(), s.m, s.n);
    const double eigen = best([&] {
      if (!s.ta && !s.tb) C.noalias() = A * B;
      else if (s.ta && !s.tb) C.noalias() = A.transpose() * B;
      else if (!s.ta && s.tb) C.noalias() = A * B.transpose();
      else C.noalias() = A.transpose() * B.transpose();
    });
    const double one = best([&] {
      Gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data.data(), a.ld, b.data.data(), b.ld, 0.0f, c.data(), s.n,
                  nullptr);
    });
    const double two = best([&] {
      Gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data.data(), a.ld, b.data.data(), b.ld, 0.0f, c.data(), s.n,
                  &pool2);
    });
    std::printf("%-36s eigen 1t %6.1f  gemm 1t %6.1f  gemm 2t %6.1f GFLOP/s\n", s.name, eigen, one, two);
  }
}

}  // namespace
}  // namespace loom
