// A counter-based random generator: the n-th number of a stream is a pure
// function of (stream key, n), so any thread, on the CPU or on a GPU, can
// draw any element without walking the ones before it. It is SplitMix64
// (Steele, Lea, Flood 2014: the n-th output of the generator seeded with
// `key`), which passes BigCrush. Random ops that must give the same bits on
// every device (dropout masks) draw from it. Header-only and usable from
// CUDA device code.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace loom {

// The step between a stream's counters: number n of stream `key` mixes
// key + (n + 1) * kCounterGamma.
constexpr uint64_t kCounterGamma = 0x9E3779B97F4A7C15ull;

// SplitMix64's mix of a counter. A template so that CPU kernels can mix
// vectors of counters (GCC vector extensions) with the same bits.
template <typename U>
LOOM_HOST_DEVICE inline U MixCounter(U z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The n-th 64-bit number of the stream `key`.
LOOM_HOST_DEVICE inline uint64_t CounterU64(uint64_t key, uint64_t n) {
  return MixCounter(key + (n + 1) * kCounterGamma);
}

// The n-th number of the stream as a double in [0, 1), from its top 53 bits
// (exact on every device: no rounding happens).
LOOM_HOST_DEVICE inline double CounterUniform(uint64_t key, uint64_t n) {
  return static_cast<double>(CounterU64(key, n) >> 11) * 0x1.0p-53;
}

}  // namespace loom
