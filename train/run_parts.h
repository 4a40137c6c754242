// The parts of a `loom train` run that the supervised loop
// (training_run.cc) and the GAN loop (gan_run.cc) share: datasets from the
// data block, loader options, schedules, the default run folder.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/zoo.h"
#include "train/config/train_config.h"
#include "train/data/dataset.h"
#include "train/data/loader.h"
#include "train/optim/schedule.h"

namespace loom::train {

struct Datasets {
  std::shared_ptr<const Dataset> train, test;
  std::vector<float> mean, std;  // the dataset's published normalisation
};

// The training and test datasets of a data block (text: one file split by
// test_fraction; point clouds: generated), with train_limit/test_limit.
StatusOr<Datasets> LoadDatasets(const proto::DataConfig& d);

// What a dataset's examples are, for models::BuildSupervised.
models::DataSpec DataSpecOf(const Dataset& data);

// The config's model (or `network` in its place, when set) for examples of
// `data` at `batch`, as loom train builds it (models::BuildSupervised).
Status BuildConfigModel(Model& m, const proto::TrainConfig& c, const models::DataSpec& data, int64_t batch,
                        const models::NetworkFn& network = nullptr);

// The loader of the training (shuffled, augmented) or test data.
DataLoaderOptions LoaderOptions(const proto::TrainConfig& c, const Datasets& data, bool training);

// The learning-rate schedule of a config's optimizer and schedule blocks.
StatusOr<std::unique_ptr<Schedule>> BuildSchedule(const proto::TrainConfig& c, int64_t steps_per_epoch,
                                                  int64_t total_steps);

// runs/<config name>-<date>-<time>
std::string DefaultOutDir(const std::string& config_name);

}  // namespace loom::train
