// What a model's examples are, recorded in its checkpoints so that the
// checkpoint alone serves the model (loom::Predictor): the DataSpec the
// model was built for and the normalisation the evaluation loader applied.
// Keys (docs/embedding.md, "Checkpoints"):
//   string_values["data/input_shape"]     "1,28,28" (per example)
//   string_values["data/input_dtype"]     "f32" | "i64"
//   string_values["data/target_shape"]    "" (one class) or "32"
//   int_values["data/num_classes"], int_values["data/vocabulary"]
//   string_values["data/normalize_mean"], ["data/normalize_std"]
//                                         "0.286" or "0.49,0.48,0.45"; "" none
// Floats are written with 9 significant digits, so they read back exactly.
#pragma once

#include <optional>
#include <vector>

#include "core/status.h"
#include "models/zoo.h"
#include "train/checkpoint/checkpoint.h"

namespace loom {

struct RecordedData {
  models::DataSpec spec;
  // (x - mean[c]) / std[c] per channel of f32 image inputs (one value: every
  // channel), as DataLoaderOptions::mean and std; empty: not normalised.
  std::vector<float> mean, std;
};

// Sets the keys above (replacing earlier ones).
void RecordDataSpec(const RecordedData& data, Checkpoint* checkpoint);

// nullopt when the checkpoint has none of the keys (written before they
// existed); DataLoss naming the file and key when some are missing or do
// not parse.
StatusOr<std::optional<RecordedData>> ReadDataSpec(const Checkpoint& checkpoint);

}  // namespace loom
