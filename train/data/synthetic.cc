#include "train/data/synthetic.h"

#include <algorithm>

#include "core/rng.h"

namespace loom {

namespace {
constexpr uint64_t kSyntheticStream = 0x53594e54;  // "SYNT": keeps these draws apart from other users of the seed
}  // namespace

StatusOr<std::shared_ptr<SyntheticDataset>> SyntheticDataset::Create(const SyntheticOptions& options) {
  const ExampleSpec& in = options.input;
  if (options.size < 1) return InvalidArgument("synthetic dataset: size must be >= 1, got ", options.size);
  if (options.num_classes < 1)
    return InvalidArgument("synthetic dataset: num_classes must be >= 1, got ", options.num_classes);
  if (in.shape.rank() < 1 || in.shape.numel() == 0)
    return InvalidArgument("synthetic dataset: input shape must be non-empty, got ", in.shape.ToString());
  if (in.dtype == DType::kI64) {
    if (in.shape.rank() != 1)
      return InvalidArgument("synthetic dataset: token inputs are i64 [T], got ", in.ToString());
  } else if (options.class_target) {
    return InvalidArgument("synthetic dataset: a class target per example is for token inputs; ", in.ToString(),
                           " examples always have one");
  } else if (in.dtype != DType::kF32) {
    return InvalidArgument("synthetic dataset: inputs are f32 or i64 tokens, got ", in.ToString());
  }
  return std::shared_ptr<SyntheticDataset>(new SyntheticDataset(options));
}

ExampleSpec SyntheticDataset::target_spec() const {
  return options_.input.dtype == DType::kI64 && !options_.class_target ? ExampleSpec{options_.input.shape, DType::kI64}
                                                                       : ExampleSpec{Shape{}, DType::kI64};
}

void SyntheticDataset::Get(int64_t index, void* input, int64_t* target) const {
  Rng rng = Rng::Stream(options_.seed, kSyntheticStream, static_cast<uint64_t>(index));
  const int64_t n = options_.input.shape.numel();
  if (options_.input.dtype == DType::kI64) {
    int64_t* tokens = static_cast<int64_t*>(input);
    int64_t prev = rng.UniformInt(options_.num_classes);
    for (int64_t t = 0; t < n; ++t) {
      tokens[t] = prev;
      prev = rng.UniformInt(options_.num_classes);
      if (!options_.class_target) target[t] = prev;
    }
    if (options_.class_target) *target = prev;
    return;
  }
  *target = rng.UniformInt(options_.num_classes);
  // Eight pixels per draw: a 3x224x224 image costs 19k draws.
  float* pixels = static_cast<float*>(input);
  for (int64_t i = 0; i < n; i += 8) {
    uint64_t bits = rng.NextU64();
    for (int64_t j = i; j < std::min(n, i + 8); ++j, bits >>= 8)
      pixels[j] = static_cast<float>(bits & 0xff) * (1.0f / 255.0f);
  }
}

}  // namespace loom
