// Checks that the compiler, with the project's flags on this CPU, copies
// small constant arrays correctly. GCC 12.2 with -march=native on AVX-512
// hosts stores a 32-byte constant such as int64 {1, 1, 0, 0} as a broadcast
// of its low word ({1, 1, 1, 1}); .bazelrc's -mmove-max/-mstore-max avoid it.
// Each case copies the constant through a function that is not inlined, so
// the store is really emitted, and checks the bytes against values built at
// run time.
#include <cstdint>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

namespace {

// The stored pattern is `ones` copies of `value` followed by zeros; built
// element by element from a volatile so no constant folding can hide a bug.
template <typename T>
std::vector<T> Expected(int n, int ones, T value) {
  volatile T v = value;
  std::vector<T> out(n, T(0));
  for (int i = 0; i < ones; ++i) out[i] = v;
  return out;
}

#define LOOM_CONSTANT_COPY(name, type, n, ...)    \
  __attribute__((noinline)) void name(type* out) { \
    const type values[n] = {__VA_ARGS__};        \
    for (int i = 0; i < n; ++i) out[i] = values[i]; \
  }

LOOM_CONSTANT_COPY(I64x4, int64_t, 4, 1, 1, 0, 0)
LOOM_CONSTANT_COPY(I64x8, int64_t, 8, 1, 1, 0, 0, 0, 0, 0, 0)
LOOM_CONSTANT_COPY(I64x8Six, int64_t, 8, 5, 5, 5, 5, 5, 5, 0, 0)
LOOM_CONSTANT_COPY(I32x8, int32_t, 8, 1, 1, 1, 1, 0, 0, 0, 0)
LOOM_CONSTANT_COPY(I32x16, int32_t, 16, 7, 7, 7, 7, 7, 7, 7, 7, 0, 0, 0, 0, 0, 0, 0, 0)

__attribute__((noinline)) std::vector<double> DoubleList() { return std::vector<double>{1, 1, 0, 0}; }

template <typename T, typename Fn>
std::vector<T> Run(int n, Fn fn) {
  std::vector<T> out(n, T(-9));
  fn(out.data());
  return out;
}

TEST_CASE("constant arrays are copied as written (GCC 12 broadcast miscompile)") {
  CHECK(Run<int64_t>(4, I64x4) == Expected<int64_t>(4, 2, 1));
  CHECK(Run<int64_t>(8, I64x8) == Expected<int64_t>(8, 2, 1));
  CHECK(Run<int64_t>(8, I64x8Six) == Expected<int64_t>(8, 6, 5));
  CHECK(Run<int32_t>(8, I32x8) == Expected<int32_t>(8, 4, 1));
  CHECK(Run<int32_t>(16, I32x16) == Expected<int32_t>(16, 8, 7));
  // The form that failed in ops/reduce_ops_test: an initializer list.
  CHECK(DoubleList() == Expected<double>(4, 2, 1.0));
}

}  // namespace
