// `loom sweep`'s input: a sweep file (train/sweep/sweep_config.proto, docs
// /sweep.md) loaded and checked, and its trials drawn. Errors name the place
// as the train config loader's do:
//   sweep.pbtxt:7: field param[1].min: log_uniform needs min > 0, got 0
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "train/config/train_config.pb.h"
#include "train/sweep/sweep_config.pb.h"

namespace loom::sweep {

// A loaded sweep: the spec with defaults filled (train_config resolved into
// `train`, the base config with its defaults), and where each param's field
// is set in the file ("FILE:LINE") for later messages.
struct SweepInput {
  proto::SweepSpec spec;
  std::vector<std::string> param_lines;  // per param: "FILE:LINE" of its block
  std::string origin;                    // the file
};

StatusOr<SweepInput> LoadSweep(const std::string& path);
StatusOr<SweepInput> ParseSweep(const std::string& text, const std::string& origin, const std::string& base_dir);

// One trial: its complete single-model config (defaults filled; seed = the
// base seed + its id unless seed is searched) and its drawn values as text.
struct Trial {
  int64_t id = 0;
  proto::TrainConfig config;
  std::vector<std::string> values;  // per param, e.g. "0.0316", "64"
  std::string label;                // "t3 lr=0.0316 batch_size=64"
  // The values that cannot differ inside one fused array (all but the
  // optimizer's and schedule's numbers and the seed), as text: trials with
  // the same key can share an array.
  std::string packing_key;
};

// Trial `id` of the sweep: the draw of param j is a function of (seed, id,
// j) alone. Errors (a drawn value the train config refuses) name the
// param's line and the trial.
StatusOr<Trial> DrawTrial(const SweepInput& input, int64_t id);

// A param's short name in labels: "lr", "batch_size", "hidden".
std::string ShortFieldName(const std::string& path);

}  // namespace loom::sweep
