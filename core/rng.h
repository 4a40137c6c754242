// Seeded random numbers that are the same on every run and platform:
// xoshiro256** seeded through splitmix64, with our own uniform/normal
// transforms (std:: distributions differ between standard libraries).
#pragma once

#include <cstdint>

namespace loom {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0);
  // An independent stream derived from this seed and a key (e.g. a node id
  // and a step), so that each consumer's numbers do not depend on order.
  static Rng Stream(uint64_t seed, uint64_t key1, uint64_t key2 = 0);

  uint64_t NextU64();
  double Uniform();                    // [0, 1)
  double Uniform(double lo, double hi);
  double Normal();                     // mean 0, stddev 1 (Box-Muller)
  int64_t UniformInt(int64_t n);       // [0, n)

 private:
  uint64_t s_[4];
  bool has_spare_ = false;
  double spare_ = 0;
};

}  // namespace loom
