// Random examples for benchmarks and tests: nothing to learn, no memory
// held, and example i is a pure function of (seed, i), generated when asked.
#pragma once

#include <memory>

#include "train/data/dataset.h"

namespace loom {

struct SyntheticOptions {
  int64_t size = 1024;  // examples
  // f32 inputs of any non-empty shape (images [C, H, W]: pixels k / 255 for
  // uniform random bytes k) with a class label in [0, num_classes); or i64
  // tokens [T], uniform in [0, num_classes), whose target is the same random
  // stream shifted by one token (a language-model example).
  ExampleSpec input{Shape{3, 32, 32}, DType::kF32};
  int64_t num_classes = 10;
  // i64 tokens: one class in [0, num_classes) per example instead (a text
  // classification example).
  bool class_target = false;
  uint64_t seed = 0;
};

class SyntheticDataset : public Dataset {
 public:
  static StatusOr<std::shared_ptr<SyntheticDataset>> Create(const SyntheticOptions& options);

  int64_t size() const override { return options_.size; }
  ExampleSpec input_spec() const override { return options_.input; }
  ExampleSpec target_spec() const override;
  int64_t num_classes() const override { return options_.num_classes; }
  void Get(int64_t index, void* input, int64_t* target) const override;

 private:
  explicit SyntheticDataset(const SyntheticOptions& options) : options_(options) {}
  SyntheticOptions options_;
};

}  // namespace loom
