#include "ops/gemm.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "core/logging.h"
#include "ops/sgemm_kernels.h"

namespace loom {

namespace {

template <typename T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using ConstMap = Eigen::Map<const RowMat<T>, 0, Eigen::OuterStride<>>;
template <typename T>
using MutMap = Eigen::Map<RowMat<T>, 0, Eigen::OuterStride<>>;

// One single-threaded Eigen GEMM on a panel of C (double, and float on a
// CPU without AVX2 and FMA).
template <typename T>
void EigenPanel(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  MutMap<T> C(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == T(0)) {
    C.setZero();
  } else if (beta != T(1)) {
    C *= beta;
  }
  if (k == 0) return;
  // op(A) is m x k; stored A is (m x k) or (k x m) row-major.
  ConstMap<T> A(a, trans_a ? k : m, trans_a ? m : k, Eigen::OuterStride<>(lda));
  ConstMap<T> B(b, trans_b ? n : k, trans_b ? k : n, Eigen::OuterStride<>(ldb));
  if (!trans_a && !trans_b) C.noalias() += alpha * A * B;
  else if (trans_a && !trans_b) C.noalias() += alpha * A.transpose() * B;
  else if (!trans_a && trans_b) C.noalias() += alpha * A * B.transpose();
  else C.noalias() += alpha * A.transpose() * B.transpose();
}

// The f32 kernel this process runs: the widest instruction set the CPU
// has, or none (Eigen). LOOM_SGEMM=avx512|avx2|eigen asks for one (to
// compare them on one machine); one the CPU lacks is refused with a warning.
const sgemm::Kernel& SelectedKernel() {
  static const sgemm::Kernel kernel = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f");
    const char* env = std::getenv("LOOM_SGEMM");
    const std::string wanted = env ? env : "";
    if (wanted == "eigen") return sgemm::Kernel{};
    if (wanted == "avx2" && avx2) return sgemm::Avx2Kernel();
    if (wanted == "avx512" && avx512) return sgemm::Avx512Kernel();
    if (!wanted.empty() && wanted != "avx2" && wanted != "avx512")
      LOOM_LOG_WARN("LOOM_SGEMM={} is not one of avx512, avx2, eigen; choosing by the CPU", wanted);
    else if (!wanted.empty())
      LOOM_LOG_WARN("LOOM_SGEMM={}: this CPU lacks it; choosing by the CPU", wanted);
    if (avx512) return sgemm::Avx512Kernel();
    if (avx2) return sgemm::Avx2Kernel();
    return sgemm::Kernel{};
  }();
  return kernel;
}

// The bf16 kernel this process runs, where the CPU has AVX512_BF16 (none
// elsewhere: the bf16 ops widen their operands to f32).
// LOOM_BF16_GEMM=widen turns it off, to compare the two on one machine.
const sgemm::Bf16Kernel& SelectedBf16Kernel() {
  static const sgemm::Bf16Kernel kernel = [] {
    __builtin_cpu_init();
    const char* env = std::getenv("LOOM_BF16_GEMM");
    const std::string wanted = env ? env : "";
    if (wanted == "widen") return sgemm::Bf16Kernel{};
    if (!wanted.empty()) LOOM_LOG_WARN("LOOM_BF16_GEMM={} is not 'widen'; choosing by the CPU", wanted);
    if (__builtin_cpu_supports("avx512bf16")) return sgemm::Avx512Bf16Kernel();
    return sgemm::Bf16Kernel{};
  }();
  return kernel;
}

template <typename T>
void GemmPanel(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
               const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (const sgemm::SgemmFn run = SelectedKernel().run) {
      run(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
  }
  EigenPanel(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// The same with op(B) made by `b`: the micro-kernels ask for its panels;
// Eigen gets all of it at once, as one panel as wide as the product.
template <typename T>
void GemmPanel(bool trans_a, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
               const BPanels<T>& b, T beta, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (const sgemm::SgemmPanelsFn run = SelectedKernel().run_panels) {
      run(trans_a, m, n, k, alpha, a, lda, b.pack, b.ctx, beta, c, ldc);
      return;
    }
  }
  std::vector<T> whole(static_cast<size_t>(std::max<int64_t>(1, k * n)));
  if (k > 0) b.pack(b.ctx, 0, k, 0, n, n, whole.data());
  EigenPanel(trans_a, false, m, n, k, alpha, a, lda, whole.data(), n, beta, c, ldc);
}

// Panel granularity of the thread split (rows, columns): whole register
// tiles of the f32 kernel, so no thread gets extra edge tiles.
template <typename T>
int64_t RowGrain() {
  return std::is_same_v<T, float> && SelectedKernel().run ? SelectedKernel().rows : 16;
}
template <typename T>
int64_t ColGrain() {
  return std::is_same_v<T, float> && SelectedKernel().run ? SelectedKernel().cols : 16;
}

// Least work (flops) worth handing to another thread. Waking a pool worker
// costs 20-40 us when its vCPU has gone idle on these VMs, more when a
// neighbouring process holds it; but the workers spin for kSpin (50 us)
// after each task, and a training step's kernels mostly follow each other
// closer than that, so a worker is usually still awake. Each panel also
// repacks the shared operand. On the 2-vCPU Zen 4 with the workers
// spinning, 2 MFLOP (8 before they spun) made the MLP step 0.96 -> 0.79 ms
// and left transformer_lm and MobileNetV3 level (docs/benchmarks.md, "CPU
// GEMM").
constexpr double kMinFlopsPerThread = 2e6;

}  // namespace

std::string GemmInstructionSets() {
  const std::string eigen = std::string("Eigen (") + Eigen::SimdInstructionSetsInUse() + ")";
  const sgemm::Kernel& f32 = SelectedKernel();
  const std::string bf16 = std::string("; bf16: ") + (HasBf16Gemm() ? SelectedBf16Kernel().name : "widened to f32");
  return (f32.run ? std::string("f32: ") + f32.name + ", chosen at run time; f64: " + eigen : "f32 and f64: " + eigen) +
         bf16;
}

// Splits C [m, n] of a product of depth k into panels and runs
// panel(by_rows, lo, hi) for each: rows [lo, hi) of C, or columns. The
// larger side splits into at most one panel per thread, of whole register
// tiles, when the product is big enough; else panel(true, 0, m) runs here.
// Each panel is an independent GEMM reading a slice of A (rows) or B
// (columns), and computes each of its elements exactly as one thread would
// (the same FMAs in the same k order), so results do not depend on the split.
template <typename T, typename Fn>
void ForEachPanel(int64_t m, int64_t n, int64_t k, ThreadPool* pool, Fn&& panel) {
  const double flops = 2.0 * m * n * k;
  const int64_t parts =
      std::min<int64_t>(pool ? pool->num_threads() : 1, static_cast<int64_t>(flops / kMinFlopsPerThread));
  if (parts <= 1) {
    panel(true, 0, m);
    return;
  }
  const bool by_rows = m >= n;
  const int64_t extent = by_rows ? m : n, grain = by_rows ? RowGrain<T>() : ColGrain<T>();
  const int64_t tiles = (extent + grain - 1) / grain;
  const int64_t panels = std::min(parts, tiles);
  pool->ParallelFor(panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      panel(by_rows, tiles * p / panels * grain, std::min(extent, tiles * (p + 1) / panels * grain));
  });
}

// A product of few rows against a B of kSwapMinCols columns or more runs
// transposed, C^T = op(B)^T op(A)^T, when the micro-kernels then read B in
// place as their A and pack only the few rows of op(A), where the product
// as given packs all of B for those few rows (MobileNetV3's classifier, 32
// x 960 -> 1280, packs a 4.9 MB weight for 79 MFLOP). op(B) = B^T becomes
// an A read row by row, in place for up to kSwapMaxRows rows (two
// micro-panels of AVX2's 6x16 tiles, one of AVX-512's 6x32); op(B) = B
// becomes an A^T, read in place only by one micro-panel (docs/benchmarks.md:
// x W^T 1.47x on two threads, 1.18x with the AVX2 kernel; dy W 1.40x on
// AVX-512). Not where B's rows lie a multiple of 4 KiB apart and the few
// rows fill at most half of that micro-panel: each of its row tiles then
// reads a sliver of every row of B, and rows 4 KiB apart share a handful
// of cache sets, so the slivers are evicted before the next tile reads the
// rest of their lines (16 rows against B rows of 1024 floats: dy W 1.49x
// slower transposed, 8 rows 2.3x; 1280 or 960 floats, or 32 rows: faster
// transposed). Every element of C is the same sum of the same products in
// the same order, alpha and beta applied alike, so the results are the
// same bits.
constexpr int64_t kSwapMaxRows = 32;
constexpr int64_t kSwapMinCols = 256;
constexpr int64_t kAliasingStrideBytes = 4096;
template <typename T>
bool RunsTransposed(bool trans_b, int64_t m, int64_t n, int64_t ldb) {
  if (!std::is_same_v<T, float> || !SelectedKernel().run || n < kSwapMinCols) return false;
  if (trans_b) return m <= kSwapMaxRows;
  const bool aliased = ldb * static_cast<int64_t>(sizeof(T)) % kAliasingStrideBytes == 0;
  return m <= ColGrain<T>() && !(aliased && 2 * m <= ColGrain<T>());
}

template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc, ThreadPool* pool) {
  if (m == 0 || n == 0) return;
  if (RunsTransposed<T>(trans_b, m, n, ldb)) {
    const std::unique_ptr<T[]> ct(new T[static_cast<size_t>(n * m)]);  // C^T [n, m], written before it is read
    if (beta != T(0))  // beta == 0 never reads C
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) ct[j * m + i] = c[i * ldc + j];
    Gemm(!trans_b, !trans_a, n, m, k, alpha, b, ldb, a, lda, beta, ct.get(), m, pool);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = ct[j * m + i];
    return;
  }
  ForEachPanel<T>(m, n, k, pool, [&](bool by_rows, int64_t lo, int64_t hi) {
    if (by_rows) {
      const T* a_panel = trans_a ? a + lo : a + lo * lda;
      GemmPanel(trans_a, trans_b, hi - lo, n, k, alpha, a_panel, lda, b, ldb, beta, c + lo * ldc, ldc);
    } else {
      const T* b_panel = trans_b ? b + lo * ldb : b + lo;
      GemmPanel(trans_a, trans_b, m, hi - lo, k, alpha, a, lda, b_panel, ldb, beta, c + lo, ldc);
    }
  });
}

template <typename T>
void Gemm(bool trans_a, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const BPanels<T>& b,
          T beta, T* c, int64_t ldc, ThreadPool* pool) {
  if (m == 0 || n == 0) return;
  struct Shifted {  // b's columns from `first` on: a column panel's B
    const BPanels<T>* b;
    int64_t first;
    static void Pack(const void* ctx, int64_t p0, int64_t kc, int64_t j0, int64_t nc, int64_t nr, T* dst) {
      const Shifted& s = *static_cast<const Shifted*>(ctx);
      s.b->pack(s.b->ctx, p0, kc, s.first + j0, nc, nr, dst);
    }
  };
  ForEachPanel<T>(m, n, k, pool, [&](bool by_rows, int64_t lo, int64_t hi) {
    if (by_rows) {  // each row panel packs all of B
      const T* a_panel = trans_a ? a + lo : a + lo * lda;
      GemmPanel(trans_a, hi - lo, n, k, alpha, a_panel, lda, b, beta, c + lo * ldc, ldc);
    } else {
      const Shifted shifted{&b, lo};
      GemmPanel(trans_a, m, hi - lo, k, alpha, a, lda, BPanels<T>{&Shifted::Pack, &shifted}, beta, c + lo, ldc);
    }
  });
}

namespace {

// Runs entry(i, pool) for `batch` independent products of entry_flops each:
// with at least one entry per thread, one thread per group of entries,
// each group at least kMinFlopsPerThread of work (else all on this one),
// each entry on its thread alone (pool null; a fused Linear's few-row
// entries then run transposed as a single one does); else one after
// another, each split over the pool.
template <typename Entry>
void ForEachEntry(int64_t batch, double entry_flops, ThreadPool* pool, Entry&& entry) {
  const int threads = pool ? pool->num_threads() : 1;
  if (batch >= threads && threads > 1) {
    const int64_t min_chunk =
        std::max<int64_t>(1, static_cast<int64_t>(std::ceil(kMinFlopsPerThread / std::max(1.0, entry_flops))));
    pool->ParallelFor(batch, min_chunk, [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0; i < b1; ++i) entry(i, static_cast<ThreadPool*>(nullptr));
    });
    return;
  }
  for (int64_t i = 0; i < batch; ++i) entry(i, pool);
}

// One bf16 product, split into panels of C as Gemm's.
void GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
              int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc, ThreadPool* pool) {
  const sgemm::Bf16GemmFn run = SelectedBf16Kernel().run;
  LOOM_CHECK(run != nullptr, "a bf16 GEMM on a CPU without AVX512_BF16 (callers check HasBf16Gemm)");
  if (m == 0 || n == 0) return;
  ForEachPanel<float>(m, n, k, pool, [&](bool by_rows, int64_t lo, int64_t hi) {
    if (by_rows) {
      run(trans_a, trans_b, hi - lo, n, k, alpha, trans_a ? a + lo : a + lo * lda, lda, b, ldb, beta, c + lo * ldc,
          ldc);
    } else {
      run(trans_a, trans_b, m, hi - lo, k, alpha, a, lda, trans_b ? b + lo * ldb : b + lo, ldb, beta, c + lo, ldc);
    }
  });
}

}  // namespace

template <typename T>
void BatchedGemm(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                 int64_t lda, int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, T beta, T* c, int64_t ldc,
                 int64_t stride_c, ThreadPool* pool) {
  ForEachEntry(batch, 2.0 * m * n * k, pool, [&](int64_t i, ThreadPool* entry_pool) {
    Gemm(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta, c + i * stride_c, ldc,
         entry_pool);
  });
}

bool HasBf16Gemm() { return SelectedBf16Kernel().run != nullptr; }

void BatchedGemm(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                 const BFloat16* a, int64_t lda, int64_t stride_a, const BFloat16* b, int64_t ldb, int64_t stride_b,
                 float beta, float* c, int64_t ldc, int64_t stride_c, ThreadPool* pool) {
  static_assert(sizeof(BFloat16) == sizeof(uint16_t), "bf16 is its bit pattern");
  const uint16_t* a16 = reinterpret_cast<const uint16_t*>(a);
  const uint16_t* b16 = reinterpret_cast<const uint16_t*>(b);
  ForEachEntry(batch, 2.0 * m * n * k, pool, [&](int64_t i, ThreadPool* entry_pool) {
    GemmBf16(trans_a, trans_b, m, n, k, alpha, a16 + i * stride_a, lda, b16 + i * stride_b, ldb, beta,
             c + i * stride_c, ldc, entry_pool);
  });
}

#define LOOM_INSTANTIATE_GEMM(T)                                                                                   \
  template void Gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, int64_t, T, T*,      \
                        int64_t, ThreadPool*);                                                                     \
  template void Gemm<T>(bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const BPanels<T>&, T, T*, int64_t,  \
                        ThreadPool*);                                                                              \
  template void BatchedGemm<T>(bool, bool, int64_t, int64_t, int64_t, int64_t, T, const T*, int64_t, int64_t,       \
                               const T*, int64_t, int64_t, T, T*, int64_t, int64_t, ThreadPool*);
LOOM_INSTANTIATE_GEMM(float)
LOOM_INSTANTIATE_GEMM(double)
#undef LOOM_INSTANTIATE_GEMM

}  // namespace loom
