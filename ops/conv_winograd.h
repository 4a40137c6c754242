// 3x3 unit-stride convolutions by Winograd's minimal filtering F(2x2, 3x3)
// (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks"):
// each 2x2 block of outputs from a 4x4 tile of the input in 16 products
// instead of 36. Per block of images:
//   U[xi] [O, C] = (G w G^T)[xi]         the weight, transformed once a call
//   V[xi] [C, P] = (B^T d B)[xi]         each tile d of each input plane
//   M[xi] [O, P] = U[xi] V[xi]           16 GEMMs, one per tile position xi
//   y             = A^T M A              each 2x2 block of each output plane
// P is the block's tiles (images x tiles per plane); V's and M's positions
// lie PositionStride(C * P) and PositionStride(O * P) apart, the GEMMs'
// batch strides. The weight gradient is
// the same map transposed: dM = A dy A^T per 2x2 block of dy, dU[xi] [O, C]
// = sum over the blocks of dM[xi] V[xi]^T, dw = G^T dU G.
// The GEMMs do 4/9 of the direct product's multiply-adds; the transforms
// are adds and halvings only, so f32 results differ from the direct
// product's by a few ulps of the partial sums. Each output element is a
// function of the geometry alone, never of the thread count: the
// transforms are per tile, and the GEMMs' sums run in a fixed order (the
// weight gradient's in groups of blocks that the geometry fixes).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "ops/conv_geometry.h"
#include "ops/cpu_util.h"
#include "ops/gemm.h"

namespace loom::conv::winograd {

constexpr int kTile = 4;       // input tile edge
constexpr int kOut = 2;        // output block edge
constexpr int kPositions = 16; // kTile * kTile: one GEMM each
// The GEMMs' work per tile grows as C * O, the transforms' as C + O. The
// smallest C * O / (C + O) measured to gain is ResNet-18's 64-channel
// stage (32: 1.19-1.30x on two threads with whole blocks per thread; with
// a block's phases shared by the threads it had lost, 0.78-0.94x); smaller
// ones stay direct: with the bound at 16 the Fashion-MNIST CNN's 32 -> 64
// layer (21, 14x14 planes) ran by Winograd, and its step stayed within
// the noise (31.8-34.3 against 32.3-40.5 ms, three alternating runs).
constexpr int64_t kMinProductOverSum = 32;
// A block of images holds V and M in about this many elements, so that
// the GEMMs read V and the output transform M from L2 / L3, not memory.
constexpr int64_t kBlockElems = 1 << 20;

// Whether geometry g (a forward product) runs here, group by group: a 3x3
// kernel, unit stride and dilation, padding of at most 2 that keeps the
// output the same "valid" extent of the padded planes, and enough channels
// per group (a fused array's R replicas are R groups).
inline bool Applies(const ConvGeom& g) {
  return g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1 && g.ph <= 2 && g.pw <= 2 &&
         g.oh == g.h + 2 * g.ph - 2 && g.ow == g.w + 2 * g.pw - 2 && g.oh > 0 && g.ow > 0 &&
         g.cg() * g.og() >= kMinProductOverSum * (g.cg() + g.og());
}

// One group of g as a convolution of its own.
inline ConvGeom GroupOf(const ConvGeom& g) {
  ConvGeom one = g;
  one.c = g.cg();
  one.o = g.og();
  one.groups = 1;
  return one;
}

// U [16, O, C] = G w G^T per (o, c), w [O, C, 3, 3]; G = [1 0 0; 1/2 1/2
// 1/2; 1/2 -1/2 1/2; 0 0 1]. A run of filters at a time, each position's
// values then stored as one contiguous run.
template <typename T>
std::unique_ptr<T[]> TransformWeights(int64_t o, int64_t c, const T* w, ThreadPool* pool) {
  constexpr int64_t kRun = 64;
  const int64_t filters = o * c;
  std::unique_ptr<T[]> u = Scratch<T>(kPositions * filters);
  const T half = T(0.5);
  ParallelRange(pool, (filters + kRun - 1) / kRun, [&](int64_t r0, int64_t r1) {
    T run[kPositions][kRun];
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t f0 = r * kRun, count = std::min(kRun, filters - f0);
      for (int64_t f = 0; f < count; ++f) {
        const T* g = w + (f0 + f) * 9;
        T rows[kTile][3];  // G g: [4, 3]
        for (int j = 0; j < 3; ++j) {
          rows[0][j] = g[j];
          rows[1][j] = half * (g[j] + g[3 + j] + g[6 + j]);
          rows[2][j] = half * (g[j] - g[3 + j] + g[6 + j]);
          rows[3][j] = g[6 + j];
        }
        for (int i = 0; i < kTile; ++i) {  // (G g) G^T: [4, 4]
          const T* q = rows[i];
          run[i * kTile + 0][f] = q[0];
          run[i * kTile + 1][f] = half * (q[0] + q[1] + q[2]);
          run[i * kTile + 2][f] = half * (q[0] - q[1] + q[2]);
          run[i * kTile + 3][f] = q[2];
        }
      }
      for (int xi = 0; xi < kPositions; ++xi) std::copy(run[xi], run[xi] + count, u.get() + xi * filters + f0);
    }
  }, 4);
  return u;
}

// The input side of a block of `images` images: plane c of image i at
// x + i * image_stride + c * plane_stride, h x w. Tile (ty, tx) of a plane
// reads rows 2 ty - ph + [0, 4) and columns 2 tx - pw + [0, 4), zeros
// outside.
template <typename T>
struct Planes {
  const T* x;
  int64_t image_stride, plane_stride, c, h, w, ph, pw;
  int64_t tiles_y, tiles_x;
  int64_t tiles() const { return tiles_y * tiles_x; }
};

// The elements between two tile positions of V [16, C, P] (n = C * P), M
// and dM [16, O, P] (n = O * P): n rounded up to 16 and 16 more. The
// transforms write (and read) all 16 positions of a row of tiles at once;
// at n * 4 bytes a multiple of 4 KiB (each of ResNet-18's stages: 128 KiB)
// those 16 rows would share one set of the L1 cache, which holds 8.
// Shifted 64 bytes a position, they take 16 sets.
inline int64_t PositionStride(int64_t n) { return (n + 15) / 16 * 16 + 16; }

// The transforms' loops over a row of tiles are functions whose pointers
// are restrict parameters: GCC ignores restrict on pointers a loop body
// declares, and left those loops scalar, loading every operand again after
// each store (the input transform was 12% of a 128-channel 16x16
// convolution's forward and backward on one thread).

// B^T's rows on four values a, b, c, d per tile (t-th at kStride * t):
// (a - c, b + c, c - b, b - d).
template <int kStride, typename T>
void InputRows(int64_t n, const T* __restrict a, const T* __restrict b, const T* __restrict c,
               const T* __restrict d, T* __restrict v0, T* __restrict v1, T* __restrict v2, T* __restrict v3) {
  for (int64_t t = 0; t < n; ++t) {
    const T at = a[kStride * t], bt = b[kStride * t], ct = c[kStride * t], dt = d[kStride * t];
    v0[t] = at - ct;
    v1[t] = bt + ct;
    v2[t] = ct - bt;
    v3[t] = bt - dt;
  }
}

// A^T's rows on four rows of values: (m0 + m1 + m2, m1 - m2 - m3).
template <typename T>
void OutputRows(int64_t n, const T* __restrict m0, const T* __restrict m1, const T* __restrict m2,
                const T* __restrict m3, T* __restrict r0, T* __restrict r1) {
  for (int64_t t = 0; t < n; ++t) {
    r0[t] = m0[t] + m1[t] + m2[t];
    r1[t] = m1[t] - m2[t] - m3[t];
  }
}

// A^T's rows on four columns of values, into an output row's even and odd
// elements, plus the bias.
template <typename T>
void OutputColumns(int64_t n, const T* __restrict q0, const T* __restrict q1, const T* __restrict q2,
                   const T* __restrict q3, T bias, T* __restrict line) {
  for (int64_t t = 0; t < n; ++t) {
    line[2 * t] = q0[t] + q1[t] + q2[t] + bias;
    line[2 * t + 1] = q1[t] - q2[t] - q3[t] + bias;
  }
}

// Loops between a transform's own buffers run over whole 256-bit vectors
// of tiles (their padding lanes zeros, never read) where a row has more
// than half a vector's: a 14x14 plane's rows of 7 tiles ran 5% slower
// vectorized than in the scalar loops before, every row in a loop's scalar
// tail; padded to 8, 1.00-1.03x. Rows of 2 or 4 (4x4 and 8x8 planes) stay
// as they are: padded to 16 they ran 0.86x and 0.96x.
template <typename T>
int64_t VectorsOf(int64_t n) {
  constexpr int64_t kLanes = 32 / static_cast<int64_t>(sizeof(T));
  return 2 * n <= kLanes ? n : (n + kLanes - 1) / kLanes * kLanes;
}

// A row's even and odd elements.
template <typename T>
void Deinterleave(int64_t n, const T* __restrict x, T* __restrict even, T* __restrict odd) {
  for (int64_t t = 0; t < n; ++t) {
    even[t] = x[2 * t];
    odd[t] = x[2 * t + 1];
  }
}

// A's rows on a row (a(t), b(t)) per tile: (a, a + b, a - b, -b).
template <typename T, typename A, typename B>
void GradColumns(int64_t n, A a, B b, T* __restrict d0, T* __restrict d1, T* __restrict d2, T* __restrict d3) {
  for (int64_t t = 0; t < n; ++t) {
    const T at = a(t), bt = b(t);
    d0[t] = at;
    d1[t] = at + bt;
    d2[t] = at - bt;
    d3[t] = -bt;
  }
}

// V [16, C, P] = B^T d B for every tile d of every plane of the block;
// B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]. Per plane, each padded
// row r gives the tiles' column transforms (c0 = r[2t] - r[2t+2], c1 =
// r[2t+1] + r[2t+2], c2 = r[2t+2] - r[2t+1], c3 = r[2t+1] - r[2t+3]), then
// four such rows the row transform, every step a loop over a row of tiles.
template <typename T>
void TransformInput(const Planes<T>& in, int64_t images, T* v, ThreadPool* pool) {
  const int64_t tiles = in.tiles(), p = images * tiles, tx_n = in.tiles_x, tx_p = VectorsOf<T>(tx_n);
  const int64_t rows = kOut * in.tiles_y + 2, span = kOut * tx_n + 2;  // padded rows and columns read
  // The columns of a padded row that the plane fills: [first, last).
  const int64_t first = std::min(in.pw, span), last = std::clamp<int64_t>(in.pw + in.w, first, span);
  ParallelRange(pool, in.c * images, [&](int64_t q0, int64_t q1) {
    std::vector<T> buffer(static_cast<size_t>(kOut * tx_p + 2 + rows * kTile * tx_p));
    T* row = buffer.data();         // one padded row (zeros past `span`)
    T* cols = row + kOut * tx_p + 2;  // [rows, 4, tx_p]
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t ch = q % in.c, image = q / in.c;
      const T* plane = in.x + image * in.image_stride + ch * in.plane_stride;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t yy = r - in.ph;
        std::fill(row, row + span, T(0));
        if (yy >= 0 && yy < in.h) std::copy(plane + yy * in.w, plane + yy * in.w + (last - first), row + first);
        T* c0 = cols + r * kTile * tx_p;
        InputRows<2>(tx_p, row, row + 1, row + 2, row + 3, c0, c0 + tx_p, c0 + 2 * tx_p, c0 + 3 * tx_p);
      }
      T* out = v + ch * p + image * tiles;
      const int64_t step = PositionStride(in.c * p);
      for (int64_t ty = 0; ty < in.tiles_y; ++ty) {
        const T* a = cols + (kOut * ty) * kTile * tx_p;
        const T* b = a + kTile * tx_p;
        const T* c = b + kTile * tx_p;
        const T* d = c + kTile * tx_p;
        T* at = out + ty * tx_n;
        for (int j = 0; j < kTile; ++j)
          InputRows<1>(tx_n, a + j * tx_p, b + j * tx_p, c + j * tx_p, d + j * tx_p, at + j * step,
                       at + (kTile + j) * step, at + (2 * kTile + j) * step, at + (3 * kTile + j) * step);
      }
    }
  }, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, tiles)));
}

// y's block of images: plane k of image i at y + i * image_stride + k *
// plane_stride, oh x ow (+ bias[k]) = A^T m A for each 2x2 block m of M
// [16, O, P];
// A^T = [1 1 1 0; 0 1 -1 -1]. A row of tiles at a time: the row transform
// (two rows r0, r1 of four values per tile), then the column transform
// into the output rows' even and odd elements. Blocks past the plane's
// edge are cut.
template <typename T>
void TransformOutput(const T* m, int64_t o, int64_t images, int64_t tiles_y, int64_t tiles_x, const T* bias, T* y,
                     int64_t image_stride, int64_t plane_stride, int64_t oh, int64_t ow, ThreadPool* pool) {
  const int64_t tiles = tiles_y * tiles_x, p = images * tiles, step = PositionStride(o * p);
  const int64_t tx_p = VectorsOf<T>(tiles_x);
  ParallelRange(pool, o * images, [&](int64_t q0, int64_t q1) {
    std::vector<T> buffer(static_cast<size_t>((2 * kTile + kOut) * tx_p));
    T* r = buffer.data();              // [2, 4, tx_p]
    T* line = r + 2 * kTile * tx_p;    // one output row, 2 * tx_p wide
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t k = q % o, image = q / o;
      const T* in = m + k * p + image * tiles;
      T* plane = y + image * image_stride + k * plane_stride;
      const T b = bias ? bias[k] : T(0);
      for (int64_t ty = 0; ty < tiles_y; ++ty) {
        const T* at = in + ty * tiles_x;
        for (int j = 0; j < kTile; ++j)
          OutputRows(tiles_x, at + j * step, at + (kTile + j) * step, at + (2 * kTile + j) * step,
                     at + (3 * kTile + j) * step, r + j * tx_p, r + (kTile + j) * tx_p);
        for (int i = 0; i < kOut; ++i) {
          const int64_t yy = kOut * ty + i;
          if (yy >= oh) break;
          const T* q = r + i * kTile * tx_p;
          OutputColumns(tx_p, q, q + tx_p, q + 2 * tx_p, q + 3 * tx_p, b, line);
          std::copy(line, line + ow, plane + yy * ow);
        }
      }
    }
  }, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, tiles)));
}

// dM [16, O, P] = A dy A^T for each 2x2 block of each of the block's dy
// planes (plane k of image i at dy + i * image_stride + k * plane_stride,
// oh x ow; rows and columns past the plane read as zeros); A = [1 0; 1 1;
// 1 -1; 0 -1].
// A row of tiles at a time: the two dy rows' even and odd elements (e, o)
// give A Y's four rows (e0, o0), (e0 + e1, o0 + o1), (e0 - e1, o0 - o1),
// (-e1, -o1), and each row (a, b) the four values a, a + b, a - b, -b.
template <typename T>
void TransformGradOutput(const T* dy, int64_t image_stride, int64_t plane_stride, int64_t o, int64_t oh, int64_t ow,
                         int64_t images, int64_t tiles_y, int64_t tiles_x, T* dm, ThreadPool* pool) {
  const int64_t tiles = tiles_y * tiles_x, p = images * tiles, step = PositionStride(o * p);
  const int64_t tx_p = VectorsOf<T>(tiles_x);
  ParallelRange(pool, o * images, [&](int64_t q0, int64_t q1) {
    std::vector<T> buffer(static_cast<size_t>(3 * kOut * tx_p));
    T* line = buffer.data();        // one dy row, zero-padded to 2 * tx_p
    T* rows = line + kOut * tx_p;   // the dy rows' even and odd elements: [2, 2, tx_p]
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t k = q % o, image = q / o;
      const T* plane = dy + image * image_stride + k * plane_stride;
      T* out = dm + k * p + image * tiles;
      for (int64_t ty = 0; ty < tiles_y; ++ty) {
        const T* e0 = rows;  // the two dy rows' even and odd elements
        const T* o0 = rows + tx_p;
        const T* e1 = rows + 2 * tx_p;
        const T* o1 = rows + 3 * tx_p;
        for (int i = 0; i < kOut; ++i) {
          const int64_t yy = kOut * ty + i;
          std::fill(line, line + kOut * tiles_x, T(0));
          if (yy < oh) std::copy(plane + yy * ow, plane + yy * ow + ow, line);
          Deinterleave(tx_p, line, rows + 2 * i * tx_p, rows + (2 * i + 1) * tx_p);
        }
        T* at = out + ty * tiles_x;
        // Row i of A Y, (a(t), b(t)) per tile, as the four positions (i, 0..3).
        auto emit = [&](int i, auto a, auto b) {
          GradColumns<T>(tiles_x, a, b, at + i * kTile * step, at + (i * kTile + 1) * step,
                         at + (i * kTile + 2) * step, at + (i * kTile + 3) * step);
        };
        emit(0, [&](int64_t t) { return e0[t]; }, [&](int64_t t) { return o0[t]; });
        emit(1, [&](int64_t t) { return e0[t] + e1[t]; }, [&](int64_t t) { return o0[t] + o1[t]; });
        emit(2, [&](int64_t t) { return e0[t] - e1[t]; }, [&](int64_t t) { return o0[t] - o1[t]; });
        emit(3, [&](int64_t t) { return -e1[t]; }, [&](int64_t t) { return -o1[t]; });
      }
    }
  }, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, tiles)));
}

// dw [O, C, 3, 3] = G^T dU G per (o, c), dU [16, O, C]; G^T = [1 1/2 1/2 0;
// 0 1/2 -1/2 0; 0 1/2 1/2 1].
template <typename T>
void TransformWeightGrad(const T* du, int64_t o, int64_t c, T* dw) {
  const int64_t filters = o * c;
  const T half = T(0.5);
  for (int64_t f = 0; f < filters; ++f) {
    T t[3][kTile];  // G^T dU: [3, 4]
    for (int j = 0; j < kTile; ++j) {
      const T u0 = du[(0 * kTile + j) * filters + f], u1 = du[(1 * kTile + j) * filters + f];
      const T u2 = du[(2 * kTile + j) * filters + f], u3 = du[(3 * kTile + j) * filters + f];
      t[0][j] = u0 + half * (u1 + u2);
      t[1][j] = half * (u1 - u2);
      t[2][j] = half * (u1 + u2) + u3;
    }
    T* g = dw + f * 9;
    for (int i = 0; i < 3; ++i) {  // (G^T dU) G: [3, 3]
      const T* q = t[i];
      g[i * 3 + 0] = q[0] + half * (q[1] + q[2]);
      g[i * 3 + 1] = half * (q[1] - q[2]);
      g[i * 3 + 2] = half * (q[1] + q[2]) + q[3];
    }
  }
}

// How the N images of g split into blocks of about kBlockElems of V and M:
// several whole images, or, where one image's tiles exceed it (a VGG's
// 224x224 planes), one image's bands of tile rows. A function of the
// geometry alone (the weight gradient's order of sums follows it).
struct Blocking {
  int64_t tiles_y = 0, tiles_x = 0;
  int64_t images = 1;     // per block
  int64_t band_rows = 0;  // tile rows per block
  int64_t bands = 1;      // blocks per image (1: whole images)
  int64_t blocks = 0;

  Blocking(const ConvGeom& g, int64_t n) : tiles_y((g.oh + kOut - 1) / kOut), tiles_x((g.ow + kOut - 1) / kOut) {
    const int64_t budget = std::max<int64_t>(1, kBlockElems / (kPositions * (g.c + g.o)));  // tiles per block
    if (tiles_y * tiles_x <= budget) {
      images = std::clamp<int64_t>(budget / (tiles_y * tiles_x), 1, n);
      band_rows = tiles_y;
      blocks = (n + images - 1) / images;
    } else {
      band_rows = std::max<int64_t>(1, budget / tiles_x);
      bands = (tiles_y + band_rows - 1) / band_rows;
      blocks = n * bands;
    }
  }
  // The most tiles a block holds.
  int64_t max_tiles() const { return images * band_rows * tiles_x; }
  // The elements of a block's V (channels C) or M and dM (channels O).
  int64_t ScratchElems(int64_t channels) const { return kPositions * PositionStride(channels * max_tiles()); }
};

// Block b of Blocking l: its images [n0, n0 + images) and tile rows [ty0,
// ty0 + rows); `in` as the band's planes (from its first input row, the
// top padding only for the first band), and the first output row.
template <typename T>
struct Block {
  int64_t n0, images, ty0, rows;
  Planes<T> in;
  int64_t out_row;  // 2 * ty0
  int64_t tiles() const { return images * rows * in.tiles_x; }
};

template <typename T>
Block<T> BlockOf(const Blocking& l, const ConvGeom& g, int64_t n, const T* x, int64_t image_stride, int64_t b) {
  Block<T> k;
  if (l.bands == 1) {
    k.n0 = b * l.images, k.images = std::min(l.images, n - k.n0), k.ty0 = 0, k.rows = l.tiles_y;
  } else {
    k.n0 = b / l.bands, k.images = 1, k.ty0 = b % l.bands * l.band_rows;
    k.rows = std::min(l.band_rows, l.tiles_y - k.ty0);
  }
  k.out_row = kOut * k.ty0;
  // The band's first input row: inside the plane past the first band (ph <= 2).
  const int64_t first_row = k.ty0 == 0 ? 0 : k.out_row - g.ph;
  k.in = Planes<T>{x + k.n0 * image_stride + first_row * g.w, image_stride, g.hw(), g.c, g.h - first_row, g.w,
                   k.ty0 == 0 ? g.ph : 0, g.pw, k.rows, l.tiles_x};
  return k;
}

// fn(i, v, m, inner) for each unit i in [0, units) (a block, or a group of
// blocks), with scratch v and m of v_elems and m_elems. Where there are at
// least two units a thread, each thread takes whole units (inner null),
// their data staying in its own cache: the phases' hand-offs between
// threads cost the 64-channel 32x32 stage its gain on two threads. Else the
// units run in order, the threads sharing each one's phases (inner: pool).
template <typename T, typename Fn>
void ForEachUnit(ThreadPool* pool, int64_t units, int64_t v_elems, int64_t m_elems, const Fn& fn) {
  const int threads = pool ? pool->num_threads() : 1;
  if (units >= 2 * threads && threads > 1) {
    ParallelRange(pool, units, [&](int64_t i0, int64_t i1) {
      const std::unique_ptr<T[]> v = Scratch<T>(v_elems), m = Scratch<T>(m_elems);
      for (int64_t i = i0; i < i1; ++i) fn(i, v.get(), m.get(), nullptr);
    }, 1);
    return;
  }
  const std::unique_ptr<T[]> v = Scratch<T>(v_elems), m = Scratch<T>(m_elems);
  for (int64_t i = 0; i < units; ++i) fn(i, v.get(), m.get(), pool);
}

// y [N, O, OH, OW] (+ bias [O]) = the convolution g (Applies(g)) of the
// N images at x (image_stride apart) by w [O, C, 3, 3]; y's images
// y_stride apart.
template <typename T>
void Conv3x3(const ConvGeom& g, int64_t n, const T* x, int64_t image_stride, const T* w, const T* bias, T* y,
             int64_t y_stride, ThreadPool* pool) {
  const std::unique_ptr<T[]> u = TransformWeights(g.o, g.c, w, pool);
  const Blocking l(g, n);
  // A block's transforms and GEMMs on `inner` (null: this thread alone).
  auto run_block = [&](int64_t b, T* v, T* m, ThreadPool* inner) {
    const Block<T> k = BlockOf(l, g, n, x, image_stride, b);
    const int64_t p = k.tiles();
    TransformInput(k.in, k.images, v, inner);
    BatchedGemm<T>(false, false, kPositions, g.o, p, g.c, T(1), u.get(), g.c, g.o * g.c, v, p,
                   PositionStride(g.c * p), T(0), m, p, PositionStride(g.o * p), inner);
    TransformOutput(m, g.o, k.images, k.rows, l.tiles_x, bias, y + k.n0 * y_stride + k.out_row * g.ow, y_stride,
                    g.ohw(), g.oh - k.out_row, g.ow, inner);
  };
  ForEachUnit<T>(pool, l.blocks, l.ScratchElems(g.c), l.ScratchElems(g.o), run_block);
}

// The weight gradient's partial sums dU, one per group of blocks, hold at
// most about this many elements in all (four 1M-element partials of the
// 256-channel 8x8 stage ran its weight gradient 0.80x of one).
constexpr int64_t kMaxPartialElems = 1 << 20;

// dw [O, C, 3, 3] = the weight gradient of the convolution g (Applies(g))
// of the N images at x by dy [N, O, OH, OW] (images image_stride and
// dy_stride apart). The blocks of images fall into groups, a function of
// the geometry alone: each group sums its blocks' products in order into
// its own dU, and the groups' dU are added in group order, so the bits
// never depend on the thread count, whether the threads take whole groups
// or share each block's phases.
template <typename T>
void WeightGrad3x3(const ConvGeom& g, int64_t n, const T* x, int64_t image_stride, const T* dy, int64_t dy_stride,
                   T* dw, ThreadPool* pool) {
  const Blocking l(g, n);
  const int64_t du_elems = kPositions * g.o * g.c;
  const int64_t groups = std::clamp<int64_t>(kMaxPartialElems / du_elems, 1, l.blocks);
  const std::unique_ptr<T[]> du = Scratch<T>(groups * du_elems);
  // Group q: blocks [q * blocks / groups, (q + 1) * blocks / groups) into du_q.
  auto run_group = [&](int64_t q, T* v, T* dm, ThreadPool* inner) {
    const int64_t b0 = q * l.blocks / groups, b1 = (q + 1) * l.blocks / groups;
    for (int64_t b = b0; b < b1; ++b) {
      const Block<T> k = BlockOf(l, g, n, x, image_stride, b);
      const int64_t p = k.tiles();
      TransformInput(k.in, k.images, v, inner);
      TransformGradOutput(dy + k.n0 * dy_stride + k.out_row * g.ow, dy_stride, g.ohw(), g.o, g.oh - k.out_row, g.ow,
                          k.images, k.rows, l.tiles_x, dm, inner);
      BatchedGemm<T>(false, true, kPositions, g.o, g.c, p, T(1), dm, p, PositionStride(g.o * p), v, p,
                     PositionStride(g.c * p), b == b0 ? T(0) : T(1), du.get() + q * du_elems, g.c, g.o * g.c, inner);
    }
  };
  ForEachUnit<T>(pool, groups, l.ScratchElems(g.c), l.ScratchElems(g.o), run_group);
  T* total = du.get();
  if (groups > 1) {
    ParallelRange(pool, du_elems, [&](int64_t i0, int64_t i1) {
      for (int64_t q = 1; q < groups; ++q) {
        const T* part = du.get() + q * du_elems;
        for (int64_t i = i0; i < i1; ++i) total[i] += part[i];
      }
    });
  }
  TransformWeightGrad(total, g.o, g.c, dw);
}

}  // namespace loom::conv::winograd
