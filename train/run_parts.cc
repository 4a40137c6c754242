#include "train/run_parts.h"

#include <algorithm>
#include <ctime>

#include "train/data/cifar.h"
#include "train/data/idx.h"
#include "train/data/point_cloud.h"
#include "train/data/synthetic.h"
#include "train/data/text.h"
#include "train/data/text_classes.h"

namespace loom::train {

namespace {

// Generated datasets (synthetic, point_clouds) test on a fifth as many
// examples as they train on, drawn with another seed.
constexpr uint64_t kGeneratedTrainSeed = 1, kGeneratedTestSeed = 2;
int64_t GeneratedTestSize(int64_t train_size) { return std::max<int64_t>(1, train_size / 5); }

// Train and test examples must be alike, or the model built for the
// training data fails only at the first evaluation. The sources name where
// each split came from.
Status CheckSplitsAlike(const Datasets& data, const std::string& train_source, const std::string& test_source) {
  auto differ = [&](const char* what, const ExampleSpec& train, const ExampleSpec& test) {
    return InvalidArgument("data: train ", what, " are ", train.ToString(), " (", train_source, ") but test ", what,
                           " are ", test.ToString(), " (", test_source, ")");
  };
  if (!(data.train->input_spec() == data.test->input_spec()))
    return differ("inputs", data.train->input_spec(), data.test->input_spec());
  if (!(data.train->target_spec() == data.test->target_spec()))
    return differ("targets", data.train->target_spec(), data.test->target_spec());
  return Status::Ok();
}

}  // namespace

StatusOr<Datasets> LoadDatasets(const proto::DataConfig& d) {
  Datasets out;
  const std::string& name = d.dataset();
  std::string train_source = d.path().empty() ? name : d.path(), test_source = train_source;
  if (name == "fashion_mnist" || name == "mnist") {
    if (name == "mnist" && d.path().empty()) return InvalidArgument("data.path is required for mnist (the IDX folder)");
    std::string dir = d.path().empty() ? kFashionMnistDir : d.path();
    LOOM_ASSIGN_OR_RETURN(out.train, LoadMnist(dir, "train"));
    LOOM_ASSIGN_OR_RETURN(out.test, LoadMnist(dir, "test"));
    train_source = MnistImagesPath(dir, "train");
    test_source = MnistImagesPath(dir, "test");
    out.mean = {name == "mnist" ? kMnistMean : kFashionMnistMean};
    out.std = {name == "mnist" ? kMnistStd : kFashionMnistStd};
  } else if (name == "cifar10") {
    if (d.path().empty()) return InvalidArgument("data.path is required for cifar10 (the folder of data_batch_*.bin)");
    LOOM_ASSIGN_OR_RETURN(out.train, LoadCifar10(d.path(), "train"));
    LOOM_ASSIGN_OR_RETURN(out.test, LoadCifar10(d.path(), "test"));
    out.mean = kCifar10Mean;
    out.std = kCifar10Std;
  } else if (name == "synthetic") {
    SyntheticOptions o;
    o.input = d.sequence_length() > 0
                  ? ExampleSpec{Shape{d.sequence_length()}, DType::kI64}
                  : ExampleSpec{Shape(std::vector<int64_t>(d.input_shape().begin(), d.input_shape().end())), DType::kF32};
    o.class_target = d.text_target() == "class";
    o.num_classes = d.num_classes();
    o.size = d.num_examples();
    o.seed = kGeneratedTrainSeed;
    LOOM_ASSIGN_OR_RETURN(out.train, SyntheticDataset::Create(o));
    o.seed = kGeneratedTestSeed;
    o.size = GeneratedTestSize(d.num_examples());
    LOOM_ASSIGN_OR_RETURN(out.test, SyntheticDataset::Create(o));
  } else if (name == "text") {
    // One file: the first 1 - test_fraction of its tokens train, the rest test.
    TextDatasetOptions o;
    o.seq_len = d.sequence_length();
    o.level = d.text_level() == "byte" ? TextLevel::kByte : TextLevel::kChar;
    o.end_fraction = 1 - d.test_fraction();
    std::shared_ptr<const Dataset> train, test;
    LOOM_ASSIGN_OR_RETURN(train, TokenStreamDataset::FromFile(d.path(), o));
    o.begin_fraction = o.end_fraction;
    o.end_fraction = 1;
    LOOM_ASSIGN_OR_RETURN(test, TokenStreamDataset::FromFile(d.path(), o));
    if (d.text_target() == "masked") {
      // Fixed masks: different for the two parts, the same every epoch.
      LOOM_ASSIGN_OR_RETURN(train, MaskedTokenDataset::Create(train, 0.15, 1));
      LOOM_ASSIGN_OR_RETURN(test, MaskedTokenDataset::Create(test, 0.15, 2));
    } else if (d.text_target() == "reversed") {
      LOOM_ASSIGN_OR_RETURN(train, ReversedTokenDataset::Create(train));
      LOOM_ASSIGN_OR_RETURN(test, ReversedTokenDataset::Create(test));
    }
    out.train = train;
    out.test = test;
  } else if (name == "text_classes") {
    TextClassOptions o;
    o.seq_len = d.sequence_length();
    o.level = d.text_level() == "byte" ? TextLevel::kByte : TextLevel::kChar;
    const std::vector<std::string> files(d.class_files().begin(), d.class_files().end());
    o.end_fraction = 1 - d.test_fraction();
    LOOM_ASSIGN_OR_RETURN(out.train, TextClassDataset::FromFiles(files, o));
    o.begin_fraction = o.end_fraction;
    o.end_fraction = 1;
    LOOM_ASSIGN_OR_RETURN(out.test, TextClassDataset::FromFiles(files, o));
  } else if (name == "point_clouds") {
    PointCloudOptions o;
    o.num_points = d.num_points();
    o.num_examples = d.num_examples();
    o.segmentation = d.segmentation();
    o.seed = kGeneratedTrainSeed;
    LOOM_ASSIGN_OR_RETURN(out.train, PointCloudDataset::Create(o));
    o.seed = kGeneratedTestSeed;
    o.num_examples = GeneratedTestSize(d.num_examples());
    LOOM_ASSIGN_OR_RETURN(out.test, PointCloudDataset::Create(o));
  } else {
    return Unimplemented("data.dataset '", name, "'");
  }
  LOOM_RETURN_IF_ERROR(CheckSplitsAlike(out, train_source, test_source));
  if (d.train_limit() > 0 && d.train_limit() < out.train->size()) {
    LOOM_ASSIGN_OR_RETURN(out.train, SliceDataset(out.train, 0, d.train_limit()));
  }
  if (d.test_limit() > 0 && d.test_limit() < out.test->size()) {
    LOOM_ASSIGN_OR_RETURN(out.test, SliceDataset(out.test, 0, d.test_limit()));
  }
  return out;
}

models::DataSpec DataSpecOf(const Dataset& data) {
  return models::DataSpec{data.input_spec().shape, data.input_spec().dtype, data.target_spec().shape,
                          data.num_classes(), data.input_vocabulary()};
}

Status BuildConfigModel(Model& m, const proto::TrainConfig& c, const models::DataSpec& data, int64_t batch,
                        const models::NetworkFn& network) {
  if (network) return models::BuildSupervised(m, network, data, batch);
  const std::map<std::string, std::string> args(c.model().args().begin(), c.model().args().end());
  return models::BuildSupervised(m, c.model().name(), args, data, batch);
}

DataLoaderOptions LoaderOptions(const proto::TrainConfig& c, const Datasets& data, bool training) {
  const proto::DataConfig& d = c.data();
  DataLoaderOptions o;
  o.batch_size = training ? d.batch_size() : d.eval_batch_size();
  o.shuffle = training && d.shuffle();
  o.seed = c.seed();
  o.drop_last = training && d.drop_last();
  o.prefetch = static_cast<int>(d.prefetch());
  if (d.normalize().mean_size() > 0) {
    o.mean.assign(d.normalize().mean().begin(), d.normalize().mean().end());
    o.std.assign(d.normalize().std().begin(), d.normalize().std().end());
  } else {
    o.mean = data.mean;
    o.std = data.std;
  }
  if (training) {
    o.crop_padding = d.augment().random_crop_padding();
    o.crop_height = o.crop_width = d.augment().crop_size();
    o.random_flip = d.augment().horizontal_flip();
  }
  return o;
}

StatusOr<std::unique_ptr<Schedule>> BuildSchedule(const proto::TrainConfig& c, int64_t steps_per_epoch,
                                                  int64_t total_steps) {
  // The config's own block (one schema, train/optim/schedule.proto); only
  // t_max 0, "anneal over the whole run (after the warm-up)", is resolved here.
  proto::ScheduleConfig s = c.schedule();
  const bool per_epoch = s.unit() == "epoch";
  if (s.t_max() <= 0)
    s.set_t_max(per_epoch ? c.epochs() : std::max<int64_t>(1, total_steps - s.warmup_steps()));
  auto made = per_epoch ? MakeEpochSchedule(s, c.optimizer().lr(), steps_per_epoch) : MakeSchedule(s, c.optimizer().lr());
  if (!made.ok()) return made.status().WithContext("schedule");
  return made;
}

std::string DefaultOutDir(const std::string& config_name) {
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", std::localtime(&now));
  return "runs/" + config_name + "-" + stamp;
}

}  // namespace loom::train
