// Device code of the optimizer family: the torch.optim updates of
// ops/optimizer_ops.cc element by element, in the CPU kernels' order of
// operations and precision. The arithmetic goes through the _rn intrinsics,
// which nvcc never contracts into FMAs, so each result rounds as the CPU
// kernel's does where that is built without FMA (x86-64-v2). The clipping
// norm is a two-pass deterministic reduction in double.
#include "ops/cuda/optimizer_kernels.h"

#include <algorithm>

#include "ops/cuda/device_util.cuh"
#include "ops/cuda/pack16.cuh"

namespace loom::cuda {
namespace {

// Enough resident blocks to fill the GPU; the grid-stride loops cover the
// rest, which also amortizes each thread's per-replica setup (Adam's pows).
constexpr int kBlocksPerSm = 8;

__device__ inline float AddRn(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double AddRn(double a, double b) { return __dadd_rn(a, b); }
__device__ inline float SubRn(float a, float b) { return __fsub_rn(a, b); }
__device__ inline double SubRn(double a, double b) { return __dsub_rn(a, b); }
__device__ inline float MulRn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double MulRn(double a, double b) { return __dmul_rn(a, b); }
__device__ inline float DivRn(float a, float b) { return __fdiv_rn(a, b); }
__device__ inline double DivRn(double a, double b) { return __ddiv_rn(a, b); }
__device__ inline float SqrtRn(float a) { return __fsqrt_rn(a); }
__device__ inline double SqrtRn(double a) { return __dsqrt_rn(a); }

// std::max(a, b) is (a < b) ? b : a: with a NaN it keeps a.
template <typename T>
__device__ inline T StdMax(T a, T b) {
  return a < b ? b : a;
}

// ---- Update rules: rule(p, g, s) turns param p and slots s[] into their new values ----

// SGD; the momentum buffer is slot 0 when kSlots == 1 and this replica's
// momentum != 0 (a fused replica without momentum keeps its buffer chunk).
template <typename T, int kSlotCount>
struct SgdRule {
  static constexpr int kSlots = kSlotCount;
  T lr, momentum, one_minus_dampening, wd;
  bool has_buf, nesterov, first_step;
  __device__ SgdRule(const UpdateFlags& f, const double* h, T lr_, double step)
      : lr(lr_),
        momentum(static_cast<T>(h[0])),
        one_minus_dampening(SubRn(T(1), static_cast<T>(h[1]))),
        wd(static_cast<T>(h[2])),
        has_buf(kSlots == 1 && h[0] != 0),
        nesterov(f.nesterov),
        first_step(step <= 1) {}
  __device__ void operator()(T& p, T g, T* s) const {
    T d = AddRn(g, MulRn(wd, p));
    if constexpr (kSlots == 1) {
      if (has_buf) {
        const T b = first_step ? d : AddRn(MulRn(momentum, s[0]), MulRn(one_minus_dampening, d));
        s[0] = b;
        d = nesterov ? AddRn(d, MulRn(momentum, b)) : b;
      }
    }
    p = SubRn(p, MulRn(lr, d));
  }
};

// Adam / AdamW: exp_avg, exp_avg_sq and, with amsgrad (kSlots == 3), max_exp_avg_sq.
template <typename T, int kSlotCount>
struct AdamRule {
  static constexpr int kSlots = kSlotCount;
  T lr, b1, b2, one_minus_b1, one_minus_b2, eps, wd, bc1, sqrt_bc2;
  bool decoupled;
  __device__ AdamRule(const UpdateFlags& f, const double* h, T lr_, double step)
      : lr(lr_),
        b1(static_cast<T>(h[0])),
        b2(static_cast<T>(h[1])),
        one_minus_b1(SubRn(T(1), b1)),
        one_minus_b2(SubRn(T(1), b2)),
        eps(static_cast<T>(h[2])),
        wd(static_cast<T>(h[3])),
        // In double, as the CPU: beta^step underflows gracefully there.
        bc1(static_cast<T>(SubRn(1.0, pow(h[0], step)))),
        sqrt_bc2(static_cast<T>(SqrtRn(SubRn(1.0, pow(h[1], step))))),
        decoupled(f.decoupled) {}
  __device__ void operator()(T& p, T g, T* s) const {
    T pi = p, gi = g;
    if (decoupled) pi = SubRn(pi, MulRn(MulRn(lr, wd), pi));
    else gi = AddRn(gi, MulRn(wd, pi));
    const T mi = AddRn(MulRn(b1, s[0]), MulRn(one_minus_b1, gi));
    const T vi = AddRn(MulRn(b2, s[1]), MulRn(MulRn(one_minus_b2, gi), gi));
    s[0] = mi;
    s[1] = vi;
    T v_used = vi;
    if constexpr (kSlots == 3) v_used = s[2] = StdMax(s[2], vi);
    p = SubRn(pi, DivRn(MulRn(DivRn(lr, bc1), mi), AddRn(DivRn(SqrtRn(v_used), sqrt_bc2), eps)));
  }
};

// Adadelta: square_avg, acc_delta.
template <typename T>
struct AdadeltaRule {
  static constexpr int kSlots = 2;
  T lr, rho, one_minus_rho, eps, wd;
  __device__ AdadeltaRule(const UpdateFlags&, const double* h, T lr_, double)
      : lr(lr_),
        rho(static_cast<T>(h[0])),
        one_minus_rho(SubRn(T(1), rho)),
        eps(static_cast<T>(h[1])),
        wd(static_cast<T>(h[2])) {}
  __device__ void operator()(T& p, T g, T* s) const {
    const T gi = AddRn(g, MulRn(wd, p));
    const T sq = AddRn(MulRn(rho, s[0]), MulRn(MulRn(one_minus_rho, gi), gi));
    const T delta = MulRn(DivRn(SqrtRn(AddRn(s[1], eps)), SqrtRn(AddRn(sq, eps))), gi);
    s[0] = sq;
    s[1] = AddRn(MulRn(rho, s[1]), MulRn(MulRn(one_minus_rho, delta), delta));
    p = SubRn(p, MulRn(lr, delta));
  }
};

// RMSprop: square_avg, then the momentum buffer (when the op has one), then
// the gradient average (kCentered). A fused replica with momentum 0 keeps
// its buffer chunk.
template <typename T, int kSlotCount, bool kCentered>
struct RmspropRule {
  static constexpr int kSlots = kSlotCount;
  static constexpr bool kOpHasBuf = kSlots - 1 - (kCentered ? 1 : 0) == 1;
  T lr, alpha, one_minus_alpha, eps, wd, momentum;
  bool has_buf;
  __device__ RmspropRule(const UpdateFlags&, const double* h, T lr_, double)
      : lr(lr_),
        alpha(static_cast<T>(h[0])),
        one_minus_alpha(SubRn(T(1), alpha)),
        eps(static_cast<T>(h[1])),
        wd(static_cast<T>(h[2])),
        momentum(static_cast<T>(h[3])),
        has_buf(kOpHasBuf && h[3] > 0) {}
  __device__ void operator()(T& p, T g, T* s) const {
    const T gi = AddRn(g, MulRn(wd, p));
    const T sq = AddRn(MulRn(alpha, s[0]), MulRn(MulRn(one_minus_alpha, gi), gi));
    s[0] = sq;
    T var = sq;
    if constexpr (kCentered) {
      constexpr int kAvgSlot = kOpHasBuf ? 2 : 1;
      const T ga = AddRn(MulRn(alpha, s[kAvgSlot]), MulRn(one_minus_alpha, gi));
      s[kAvgSlot] = ga;
      var = StdMax(T(0), SubRn(sq, MulRn(ga, ga)));  // std::max(0, x): NaN becomes 0, as on the CPU
    }
    const T step_dir = DivRn(gi, AddRn(SqrtRn(var), eps));
    if constexpr (kOpHasBuf) {
      if (has_buf) {
        const T b = AddRn(MulRn(momentum, s[1]), step_dir);
        s[1] = b;
        p = SubRn(p, MulRn(lr, b));
        return;
      }
    }
    p = SubRn(p, MulRn(lr, step_dir));
  }
};

// A frozen replica (active[r] == 0): param and slots unchanged, bit for bit.
template <int kSlotCount>
struct KeepRule {
  template <typename T>
  __device__ void operator()(T&, T, T*) const {}
};

// Up to kMaxNodesPerLaunch nodes and kMaxReplicasPerLaunch replicas. Node k
// takes blocks [block_begin[k], block_begin[k + 1]) of the grid's x, each
// replica a row of y.
template <typename T>
struct UpdateLaunch {
  UpdateTensors<T> node[kMaxNodesPerLaunch];
  int block_begin[kMaxNodesPerLaunch + 1];
  int count = 0;
  UpdateFlags flags;
  int64_t replica_begin = 0;  // replica of blockIdx.y == 0
  double hyper[kMaxReplicasPerLaunch][kMaxUpdateHyper];
};
// The parameter space every CUDA version and GPU accepts.
static_assert(sizeof(UpdateLaunch<double>) <= 4096, "an update launch's parameters exceed 4 KiB");

template <typename T, int kSlots>
struct ChunkPointers {
  const T* p;
  const T* g;
  T* new_p;
  const T* slot[kSlots > 0 ? kSlots : 1];
  T* new_slot[kSlots > 0 ? kSlots : 1];

  __device__ bool Aligned() const {
    bool ok = Aligned16(p) && Aligned16(g) && Aligned16(new_p);
    for (int k = 0; k < kSlots; ++k) ok = ok && Aligned16(slot[k]) && Aligned16(new_slot[k]);
    return ok;
  }
  __device__ bool InPlace() const {
    bool same = new_p == p;
    for (int k = 0; k < kSlots; ++k) same = same && new_slot[k] == slot[k];
    return same;
  }
};

// Applies rule to elements [0, n) of the chunk, 16 bytes per load where every
// pointer allows it; this thread takes the vectors (and elements) first,
// first + stride, ... Each thread reads element i of every input before it
// writes element i of any output and touches no other, so outputs may alias
// their inputs.
template <typename T, int kSlots, typename Rule>
__device__ void UpdateChunkOnDevice(const ChunkPointers<T, kSlots>& c, int64_t n, const Rule& rule, int64_t first,
                                    int64_t stride) {
  constexpr int kLanes = Pack<T>::kLanes;
  constexpr int kS = kSlots > 0 ? kSlots : 1;
  int64_t scalar_begin = 0;
  if (c.Aligned()) {
    const int64_t vectors = n / kLanes;
    for (int64_t v = first; v < vectors; v += stride) {
      Pack<T> p = reinterpret_cast<const Pack<T>*>(c.p)[v];
      const Pack<T> g = reinterpret_cast<const Pack<T>*>(c.g)[v];
      Pack<T> s[kS];
#pragma unroll
      for (int k = 0; k < kSlots; ++k) s[k] = reinterpret_cast<const Pack<T>*>(c.slot[k])[v];
#pragma unroll
      for (int l = 0; l < kLanes; ++l) {
        T lane[kS];
#pragma unroll
        for (int k = 0; k < kSlots; ++k) lane[k] = s[k].v[l];
        rule(p.v[l], g.v[l], lane);
#pragma unroll
        for (int k = 0; k < kSlots; ++k) s[k].v[l] = lane[k];
      }
      reinterpret_cast<Pack<T>*>(c.new_p)[v] = p;
#pragma unroll
      for (int k = 0; k < kSlots; ++k) reinterpret_cast<Pack<T>*>(c.new_slot[k])[v] = s[k];
    }
    scalar_begin = vectors * kLanes;
  }
  for (int64_t i = scalar_begin + first; i < n; i += stride) {
    T p = c.p[i];
    T lane[kS];
#pragma unroll
    for (int k = 0; k < kSlots; ++k) lane[k] = c.slot[k][i];
    rule(p, c.g[i], lane);
    c.new_p[i] = p;
#pragma unroll
    for (int k = 0; k < kSlots; ++k) c.new_slot[k][i] = lane[k];
  }
}

// blockIdx.x picks the node and strides over its chunk with the node's other
// blocks; blockIdx.y picks the replica (within this launch's group).
// __grid_constant__: the node is picked at run time, and indexing a by value
// would copy all of it to each thread's local memory.
template <typename T, typename Rule>
__global__ void __launch_bounds__(kThreads, sizeof(T) == 4 ? 4 : 3)
    UpdateKernel(const __grid_constant__ UpdateLaunch<T> a) {
  constexpr int kSlots = Rule::kSlots;
  int k = 0;
  while (static_cast<int>(blockIdx.x) >= a.block_begin[k + 1]) ++k;
  const UpdateTensors<T>& t = a.node[k];
  const int64_t block = static_cast<int64_t>(blockIdx.x) - a.block_begin[k];
  const int64_t blocks = a.block_begin[k + 1] - a.block_begin[k];
  const int64_t first = block * blockDim.x + threadIdx.x, stride = blocks * blockDim.x;
  const int64_t r = a.replica_begin + blockIdx.y;
  const int64_t base = r * t.n;
  ChunkPointers<T, kSlots> c;
  c.p = t.p + base;
  c.g = t.g + base;
  c.new_p = t.new_p + base;
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    c.slot[j] = t.slot[j] + base;
    c.new_slot[j] = t.new_slot[j] + base;
  }
  // The CPU updates when active[r] != 0 (a NaN flag too).
  if (t.active != nullptr && !(t.active[r] != T(0))) {
    if (c.InPlace()) return;
    UpdateChunkOnDevice(c, t.n, KeepRule<kSlots>{}, first, stride);
    return;
  }
  const Rule rule(a.flags, a.hyper[blockIdx.y], t.lr[r], static_cast<double>(t.step[0]));
  UpdateChunkOnDevice(c, t.n, rule, first, stride);
}

cudaError_t MultiprocessorCount(int* sms) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  return cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device);
}

// Each node gets blocks for its vectors, at most enough to fill the GPU once
// per replica row on its own; nodes without elements get none.
template <typename T, typename Rule>
cudaError_t LaunchRule(const UpdateFlags& flags, const UpdateTensors<T>* nodes, int count, const UpdateHyper* hyper,
                       int64_t replicas, cudaStream_t stream) {
  int sms = 0;
  cudaError_t err = MultiprocessorCount(&sms);
  if (err != cudaSuccess) return err;
  for (int k0 = 0; k0 < count; k0 += kMaxNodesPerLaunch) {
    for (int64_t r0 = 0; r0 < replicas; r0 += kMaxReplicasPerLaunch) {
      const int64_t group = std::min<int64_t>(kMaxReplicasPerLaunch, replicas - r0);
      const int64_t cap = std::max<int64_t>(1, int64_t{sms} * kBlocksPerSm / group);
      UpdateLaunch<T> a;
      a.count = std::min(kMaxNodesPerLaunch, count - k0);
      a.block_begin[0] = 0;
      for (int k = 0; k < a.count; ++k) {
        a.node[k] = nodes[k0 + k];
        const int64_t vectors = (a.node[k].n + Pack<T>::kLanes - 1) / Pack<T>::kLanes;
        const int64_t blocks = vectors == 0 ? 0 : std::min<int64_t>(Blocks(vectors), cap);
        a.block_begin[k + 1] = a.block_begin[k] + static_cast<int>(blocks);
      }
      if (a.block_begin[a.count] == 0) continue;
      a.flags = flags;
      a.replica_begin = r0;
      for (int64_t r = 0; r < group; ++r)
        for (int h = 0; h < kMaxUpdateHyper; ++h) a.hyper[r][h] = hyper[r0 + r].v[h];
      const dim3 grid(static_cast<unsigned>(a.block_begin[a.count]), static_cast<unsigned>(group));
      UpdateKernel<T, Rule><<<grid, kThreads, 0, stream>>>(a);
      err = cudaGetLastError();
      if (err != cudaSuccess) return err;
    }
  }
  return cudaSuccess;
}

// ---- SquaredNorm ----

constexpr int kMaxNormInputs = 64;

// Up to kMaxNormInputs inputs of one SquaredNorm; its tiles are columns
// [col_offset, col_offset + tile_begin[count]) of the partials.
template <typename T>
struct NormBatch {
  const T* x[kMaxNormInputs];
  int64_t n[kMaxNormInputs];                  // chunk length (per sum)
  int64_t tile_begin[kMaxNormInputs + 1];     // first tile of input k within the batch
  int count;
  int64_t col_offset, cols, sums;
};

// One block's sum of squares of x[0, len), in double, in a fixed order.
template <typename T>
__device__ double TileSumOfSquares(const T* x, int64_t len, double* scratch) {
  constexpr int kLanes = Pack<T>::kLanes;
  double acc[kLanes] = {};
  int64_t scalar_begin = 0;
  if (Aligned16(x)) {
    const int64_t vectors = len / kLanes;
    for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
      const Pack<T> p = reinterpret_cast<const Pack<T>*>(x)[v];
#pragma unroll
      for (int l = 0; l < kLanes; ++l) {
        const double e = static_cast<double>(p.v[l]);
        acc[l] += e * e;
      }
    }
    scalar_begin = vectors * kLanes;
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < len; i += blockDim.x) {
    const double e = static_cast<double>(x[i]);
    acc[0] += e * e;
  }
  double total = 0;
#pragma unroll
  for (int l = 0; l < kLanes; ++l) total += acc[l];
  return BlockSum(total, scratch);
}

template <typename T>
__global__ void SquaredNormTilesKernel(NormBatch<T> b, double* partial) {
  __shared__ double scratch[kThreads];
  const int64_t tiles = b.tile_begin[b.count];
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    int k = 0;
    while (tile >= b.tile_begin[k + 1]) ++k;  // inputs without tiles (empty) are skipped
    const int64_t j0 = (tile - b.tile_begin[k]) * kSquaredNormTile;
    constexpr int64_t kTile = kSquaredNormTile;  // a device-side copy: the header's constant is host-only
    const int64_t len = std::min<int64_t>(kTile, b.n[k] - j0);
    for (int64_t r = blockIdx.y; r < b.sums; r += gridDim.y) {
      const double total = TileSumOfSquares(b.x[k] + r * b.n[k] + j0, len, scratch);
      if (threadIdx.x == 0) partial[r * b.cols + b.col_offset + tile] = total;
    }
  }
}

template <typename T>
__global__ void SquaredNormFinishKernel(const double* partial, int64_t cols, int64_t sums, T* out) {
  __shared__ double scratch[kThreads];
  for (int64_t r = blockIdx.x; r < sums; r += gridDim.x) {
    double acc = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) acc += partial[r * cols + c];
    const double total = BlockSum(acc, scratch);
    if (threadIdx.x == 0) out[r] = static_cast<T>(total);
  }
}

// ---- ClipScale, IsFinite ----

constexpr int kClipBatch = 256;

struct ClipBatch {
  double max_norm[kClipBatch];
  int64_t begin, count;
};

template <typename T>
__global__ void ClipScaleKernel(const T* norm, T* out, ClipBatch b) {
  const int64_t i = threadIdx.x;
  if (i >= b.count) return;
  const int64_t r = b.begin + i;
  const double coef = DivRn(b.max_norm[i], AddRn(static_cast<double>(norm[r]), 1e-6));
  out[r] = static_cast<T>(coef > 1 ? 1.0 : coef);  // NaN stays NaN
}

template <typename T>
__global__ void IsFiniteKernel(const T* x, T* y, int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) y[i] = isfinite(x[i]) ? T(1) : T(0);
}

}  // namespace

template <typename T>
cudaError_t LaunchUpdate(UpdateRule rule, const UpdateFlags& flags, int slots, const UpdateTensors<T>* nodes,
                         int count, const UpdateHyper* hyper, int64_t replicas, cudaStream_t stream) {
  if (count <= 0 || replicas <= 0) return cudaSuccess;
  switch (rule) {
    case UpdateRule::kSgd:
      if (slots == 0) return LaunchRule<T, SgdRule<T, 0>>(flags, nodes, count, hyper, replicas, stream);
      if (slots == 1) return LaunchRule<T, SgdRule<T, 1>>(flags, nodes, count, hyper, replicas, stream);
      break;
    case UpdateRule::kAdam:
      if (slots == 2) return LaunchRule<T, AdamRule<T, 2>>(flags, nodes, count, hyper, replicas, stream);
      if (slots == 3) return LaunchRule<T, AdamRule<T, 3>>(flags, nodes, count, hyper, replicas, stream);
      break;
    case UpdateRule::kAdadelta:
      if (slots == 2) return LaunchRule<T, AdadeltaRule<T>>(flags, nodes, count, hyper, replicas, stream);
      break;
    case UpdateRule::kRmsprop:
      if (flags.centered) {
        if (slots == 2) return LaunchRule<T, RmspropRule<T, 2, true>>(flags, nodes, count, hyper, replicas, stream);
        if (slots == 3) return LaunchRule<T, RmspropRule<T, 3, true>>(flags, nodes, count, hyper, replicas, stream);
      } else {
        if (slots == 1) return LaunchRule<T, RmspropRule<T, 1, false>>(flags, nodes, count, hyper, replicas, stream);
        if (slots == 2) return LaunchRule<T, RmspropRule<T, 2, false>>(flags, nodes, count, hyper, replicas, stream);
      }
      break;
  }
  return cudaErrorInvalidValue;  // a slot count the op's type inference never gives
}

template <typename T>
cudaError_t LaunchSquaredNorm(const T* const* x, const int64_t* chunk_n, int count, int64_t sums, double* partial,
                              T* out, cudaStream_t stream) {
  if (sums <= 0) return cudaSuccess;
  const int64_t cols = SquaredNormPartials(chunk_n, count);
  int64_t col_offset = 0;
  for (int k0 = 0; k0 < count; k0 += kMaxNormInputs) {
    NormBatch<T> b;
    b.count = std::min(kMaxNormInputs, count - k0);
    b.tile_begin[0] = 0;
    for (int k = 0; k < b.count; ++k) {
      b.x[k] = x[k0 + k];
      b.n[k] = chunk_n[k0 + k];
      b.tile_begin[k + 1] = b.tile_begin[k] + (b.n[k] + kSquaredNormTile - 1) / kSquaredNormTile;
    }
    b.col_offset = col_offset;
    b.cols = cols;
    b.sums = sums;
    const int64_t tiles = b.tile_begin[b.count];
    if (tiles == 0) continue;
    const dim3 grid(BlocksPerItem(tiles), static_cast<unsigned>(std::min<int64_t>(sums, 65535)));
    SquaredNormTilesKernel<<<grid, kThreads, 0, stream>>>(b, partial);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    col_offset += tiles;
  }
  // With no elements at all every sum is 0, which the finishing pass writes.
  SquaredNormFinishKernel<<<BlocksPerItem(sums), kThreads, 0, stream>>>(partial, cols, sums, out);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchClipScale(const T* norm, T* out, const double* max_norm, int64_t count, cudaStream_t stream) {
  for (int64_t r0 = 0; r0 < count; r0 += kClipBatch) {
    ClipBatch b;
    b.begin = r0;
    b.count = std::min<int64_t>(kClipBatch, count - r0);
    for (int64_t i = 0; i < b.count; ++i) b.max_norm[i] = max_norm[r0 + i];
    ClipScaleKernel<<<1, kClipBatch, 0, stream>>>(norm, out, b);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t LaunchIsFinite(const T* x, T* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  IsFiniteKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

#define LOOM_INSTANTIATE_OPTIMIZER_KERNELS(T)                                                                      \
  template cudaError_t LaunchUpdate<T>(UpdateRule, const UpdateFlags&, int, const UpdateTensors<T>*, int,          \
                                       const UpdateHyper*, int64_t, cudaStream_t);                                  \
  template cudaError_t LaunchSquaredNorm<T>(const T* const*, const int64_t*, int, int64_t, double*, T*,            \
                                            cudaStream_t);                                                          \
  template cudaError_t LaunchClipScale<T>(const T*, T*, const double*, int64_t, cudaStream_t);                     \
  template cudaError_t LaunchIsFinite<T>(const T*, T*, int64_t, cudaStream_t);

LOOM_INSTANTIATE_OPTIMIZER_KERNELS(float)
LOOM_INSTANTIATE_OPTIMIZER_KERNELS(double)
#undef LOOM_INSTANTIATE_OPTIMIZER_KERNELS

}  // namespace loom::cuda
