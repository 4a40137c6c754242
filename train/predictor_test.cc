#include "train/predictor.h"

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <thread>

#include "runtime/executor.h"
#include "tests/temp_files.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/data_spec.h"
#include "train/checkpoint/replica_export.h"
#include "train/checkpoint/run_dir.h"
#include "train/config/train_config.h"
#include "train/data/loader.h"
#include "train/run_parts.h"
#include "train/training_run.h"

namespace loom {
namespace {

// A tiny MLP on synthetic 1x6x6 images, 4 classes; dropout so that serving
// in training mode would show, and normalisation so that serving raw pixels
// unnormalised would. The test set has 96 / 5 = 19 examples: with
// eval_batch_size 8 its last batch is padded.
constexpr char kConfig[] = R"(
model { name: "mlp" args { key: "hidden" value: "16" } args { key: "dropout" value: "0.3" } }
data {
  dataset: "synthetic" input_shape: [1, 6, 6] num_classes: 4 num_examples: 96
  batch_size: 16 eval_batch_size: 8
  normalize { mean: 0.5 std: 0.25 }
}
optimizer { type: "sgd" lr: 0.1 momentum: 0.9 }
epochs: 2
threads: 1
tensorboard: false
)";

// The same with three fused replicas; "huge" diverges at once and leaves
// the array (its tensors are kept as retired/2/<name>).
constexpr char kFusedReplicas[] = R"(
replicas { name: "base" }
replicas { name: "slow" optimizer { lr: 0.02 } }
replicas { name: "huge" optimizer { lr: 1e30 } }
)";

proto::TrainConfig Config(const std::string& text) {
  auto config = ParseTrainConfig(text, "predictor_test config");
  REQUIRE(config.ok());
  return *config;
}

// Trains `text` into `dir` and returns the path of its newest checkpoint.
std::string Train(const std::string& text, const std::filesystem::path& dir) {
  train::RunOptions options;
  options.config = Config(text);
  options.config.set_out_dir(dir.string());
  options.config_name = "predictor_test";
  FILE* quiet = std::fopen("/dev/null", "w");
  options.console = quiet;
  auto result = train::RunTraining(options);
  std::fclose(quiet);
  INFO(result.status().ToString());
  REQUIRE(result.ok());
  auto latest = FindLatestCheckpoint(dir.string());
  REQUIRE(latest.ok());
  return latest->path;
}

// The run's checkpoints, trained once for the whole test binary.
const std::string& SingleCheckpoint() {
  static const std::string path = Train(kConfig, testing::FreshTempDir("predictor_single_run"));
  return path;
}
const std::string& FusedCheckpoint() {
  static const std::string path =
      Train(std::string(kConfig) + kFusedReplicas, testing::FreshTempDir("predictor_fused_run"));
  return path;
}

train::Datasets Data() {
  auto data = train::LoadDatasets(Config(kConfig).data());
  REQUIRE(data.ok());
  return *data;
}

// The test set's examples as the dataset gives them (raw pixels), [N, 1, 6, 6].
Tensor RawExamples(const Dataset& data, int64_t n) {
  Tensor t = Tensor::Zeros(Shape{n, 1, 6, 6}, DType::kF32);
  const int64_t per = 36;
  std::vector<int64_t> target(1);
  for (int64_t i = 0; i < n; ++i) data.Get(i % data.size(), t.data<float>() + i * per, target.data());
  return t;
}

// What loom train evaluates: the eval graph at the eval batch on the test
// loader's (normalised, padded) batches, with the checkpoint's tensors.
std::vector<float> DirectLogits(const std::string& checkpoint) {
  auto ckpt = LoadCheckpoint(checkpoint);
  REQUIRE(ckpt.ok());
  const proto::TrainConfig config = Config(ckpt->config_text);
  train::Datasets data = Data();
  Model m;
  m.set_training(false);
  const std::map<std::string, std::string> args(config.model().args().begin(), config.model().args().end());
  REQUIRE(models::BuildSupervised(m, "mlp", args, train::DataSpecOf(*data.train), config.data().eval_batch_size()).ok());
  auto exec = Executor::Create(m.graph());
  REQUIRE(exec.ok());
  for (const auto& [name, t] : (*exec)->state()) REQUIRE((*exec)->SetState(name, ckpt->tensors.at(name)).ok());
  auto loader = DataLoader::Create(data.test, train::LoaderOptions(config, data, /*training=*/false));
  REQUIRE(loader.ok());
  REQUIRE((*loader)->Start(0).ok());
  std::vector<float> logits;
  Batch b;
  for (;;) {
    auto more = (*loader)->Next(&b);
    REQUIRE(more.ok());
    if (!*more) break;
    auto out = (*exec)->Run({{"input", b.input}, {"target", b.target}});
    REQUIRE(out.ok());
    const float* p = out->at("logits").data<float>();
    logits.insert(logits.end(), p, p + b.valid * 4);
  }
  return logits;
}

std::vector<float> Values(const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); }

std::unique_ptr<Predictor> Load(const std::string& path, PredictorOptions options = {}) {
  auto p = Predictor::Load(path, options);
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  return std::move(*p);
}

std::string LoadError(const std::string& path, PredictorOptions options = {}) {
  auto p = Predictor::Load(path, options);
  REQUIRE(!p.ok());
  return p.status().message();
}

// The fraction of `classes` equal to the test set's labels.
double Accuracy(const std::vector<int64_t>& classes, const Dataset& test) {
  int64_t correct = 0;
  for (int64_t i = 0; i < test.size(); ++i) {
    float pixels[36];
    int64_t label = 0;
    test.Get(i, pixels, &label);
    correct += classes[i] == label;
  }
  return static_cast<double>(correct) / static_cast<double>(test.size());
}

TEST_CASE("predictor: logits equal the evaluation graph's on the test loader's batches") {
  train::Datasets data = Data();
  REQUIRE(data.test->size() == 19);
  const std::vector<float> direct = DirectLogits(SingleCheckpoint());
  auto predictor = Load(SingleCheckpoint());
  CHECK(predictor->batch_size() == 8);
  CHECK(predictor->data().input == Shape{1, 6, 6});
  CHECK(predictor->data().num_classes == 4);
  CHECK(predictor->config().model().name() == "mlp");
  auto logits = predictor->Predict(RawExamples(*data.test, 19));
  REQUIRE(logits.ok());
  CHECK(logits->shape() == Shape{19, 4});
  CHECK(Values(*logits) == direct);  // bit for bit, padding cut off

  // Classify is the arg-max of each row; subsets and repeats give the same rows.
  auto classes = predictor->Classify(RawExamples(*data.test, 19));
  REQUIRE(classes.ok());
  REQUIRE(classes->size() == 19);
  for (size_t i = 0; i < 19; ++i) {
    const float* row = direct.data() + i * 4;
    CHECK((*classes)[i] == std::max_element(row, row + 4) - row);
  }
  for (int64_t n : {1, 8, 9, 40}) {
    auto some = predictor->Predict(RawExamples(*data.test, n));
    REQUIRE(some.ok());
    REQUIRE(some->shape() == Shape{n, 4});
    for (int64_t i = 0; i < n; ++i)
      CHECK(std::memcmp(some->data<float>() + i * 4, direct.data() + (i % 19) * 4, 4 * sizeof(float)) == 0);
  }
  auto none = predictor->Predict(Tensor::Zeros(Shape{0, 1, 6, 6}, DType::kF32));
  REQUIRE(none.ok());
  CHECK(none->shape() == Shape{0, 4});
}

TEST_CASE("predictor: accuracy on the test set equals Trainer::Evaluate's") {
  const auto dir = testing::FreshTempDir("predictor_trainer");
  TrainerOptions o;
  o.out_dir = (dir / "run").string();
  auto trainer = Trainer::FromConfigText(kConfig, o);
  INFO(trainer.status().ToString());
  REQUIRE(trainer.ok());
  REQUIRE((*trainer)->Run().ok());
  auto eval = (*trainer)->Evaluate();
  REQUIRE(eval.ok());
  const std::string path = (dir / "model.loom").string();
  REQUIRE((*trainer)->SaveCheckpoint(path).ok());

  train::Datasets data = Data();
  auto classes = Load(path)->Classify(RawExamples(*data.test, data.test->size()));
  REQUIRE(classes.ok());
  CHECK(Accuracy(*classes, *data.test) == eval->accuracy);
  CHECK(DirectLogits(path).size() == 19 * 4);
}

TEST_CASE("predictor: a host network serves with the same NetworkBuilder") {
  const auto dir = testing::FreshTempDir("predictor_network");
  const NetworkBuilder network = [](Model& m, const models::ModelInputs& in) -> StatusOr<Sym> {
    return m.linear(m.relu(m.linear(m.flatten(in.input), 8, {}, "hidden")), in.num_classes, {}, "head");
  };
  TrainerOptions o;
  o.out_dir = (dir / "run").string();
  o.network = network;
  auto trainer = Trainer::FromConfigText(kConfig, o);
  INFO(trainer.status().ToString());
  REQUIRE(trainer.ok());
  REQUIRE((*trainer)->Run().ok());
  auto eval = (*trainer)->Evaluate();
  REQUIRE(eval.ok());
  const std::string path = (dir / "model.loom").string();
  REQUIRE((*trainer)->SaveCheckpoint(path).ok());

  PredictorOptions po;
  po.network = network;
  train::Datasets data = Data();
  auto classes = Load(path, po)->Classify(RawExamples(*data.test, data.test->size()));
  REQUIRE(classes.ok());
  CHECK(Accuracy(*classes, *data.test) == eval->accuracy);
  // Without it the config's zoo model is built, whose tensors the file lacks.
  CHECK_THAT(LoadError(path), Catch::StartsWith(path + ": no tensor 'fc1/weight'"));
}

TEST_CASE("predictor: another batch size or thread count gives the same logits") {
  train::Datasets data = Data();
  const Tensor input = RawExamples(*data.test, 19);
  auto base = Load(SingleCheckpoint())->Predict(input);
  REQUIRE(base.ok());
  for (auto [batch, threads] : {std::pair<int64_t, int>{5, 1}, {32, 2}, {1, 1}}) {
    PredictorOptions o;
    o.batch_size = batch;
    o.threads = threads;
    auto p = Load(SingleCheckpoint(), o);
    CHECK(p->batch_size() == batch);
    auto logits = p->Predict(input);
    REQUIRE(logits.ok());
    const std::vector<float> a = Values(*logits), b = Values(*base);
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).epsilon(1e-5));
  }
}

TEST_CASE("predictor: 8 threads at once give the single-threaded results") {
  train::Datasets data = Data();
  for (int pool_threads : {1, 2}) {
    PredictorOptions o;
    o.threads = pool_threads;
    auto predictor = Load(SingleCheckpoint(), o);
    std::vector<Tensor> inputs;
    std::vector<std::vector<float>> expected;
    for (int64_t n : {3, 8, 19, 25, 40, 1, 17, 33}) {
      inputs.push_back(RawExamples(*data.test, n));
      auto logits = predictor->Predict(inputs.back());
      REQUIRE(logits.ok());
      expected.push_back(Values(*logits));
    }
    std::vector<std::vector<std::vector<float>>> got(8);
    std::vector<std::string> errors(8);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        for (int round = 0; round < 20; ++round) {
          const size_t k = static_cast<size_t>(t + round) % inputs.size();
          auto logits = predictor->Predict(inputs[k]);
          if (!logits.ok()) {
            errors[t] = logits.status().ToString();
            return;
          }
          if (Values(*logits) != expected[k]) errors[t] = StrCat("round ", round, ": input ", k, " differs");
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (int t = 0; t < 8; ++t) {
      INFO("pool threads " << pool_threads << ", caller " << t);
      CHECK(errors[t] == "");
    }
  }
}

TEST_CASE("predictor: a fused run's replica serves as loom export --replica writes it") {
  const auto dir = testing::FreshTempDir("predictor_fused_export");
  auto fused = LoadCheckpoint(FusedCheckpoint());
  REQUIRE(fused.ok());
  train::Datasets data = Data();
  const Tensor input = RawExamples(*data.test, 19);
  std::vector<std::vector<float>> served;
  for (int64_t r = 0; r < 3; ++r) {
    auto exported = ExportReplica(*fused, r, "--replica");  // what tools/export_command.cc saves
    REQUIRE(exported.ok());
    CHECK(exported->status == (r == 2 ? "diverged (loss or gradient not finite)" : "running"));
    const std::string file = (dir / StrCat("r", r, ".loom")).string();
    REQUIRE(SaveCheckpoint(file, exported->checkpoint).ok());

    PredictorOptions o;
    o.replica = r;
    auto from_fused = Load(FusedCheckpoint(), o)->Predict(input);
    auto from_export = Load(file)->Predict(input);
    REQUIRE(from_fused.ok());
    REQUIRE(from_export.ok());
    CHECK(Values(*from_fused) == Values(*from_export));
    CHECK(Load(FusedCheckpoint(), o)->config().optimizer().lr() == (r == 0 ? 0.1 : r == 1 ? 0.02 : 1e30));
    served.push_back(Values(*from_fused));
  }
  CHECK(served[0] != served[1]);  // the rows are the replicas' own
}

// Erases the data spec's keys (data_spec.h), as in checkpoints written before them.
template <typename Map>
void EraseDataKeys(Map* values) {
  for (auto it = values->begin(); it != values->end();)
    it = it->first.rfind("data/", 0) == 0 ? values->erase(it) : std::next(it);
}
void EraseDataSpec(Checkpoint* c) {
  EraseDataKeys(&c->string_values);
  EraseDataKeys(&c->int_values);
}

TEST_CASE("predictor: the recorded data spec, or the config's data block without one") {
  const auto dir = testing::FreshTempDir("predictor_recorded_spec");
  auto ckpt = LoadCheckpoint(SingleCheckpoint());
  REQUIRE(ckpt.ok());
  train::Datasets data = Data();
  const Tensor input = RawExamples(*data.test, 19);
  auto expected = Load(SingleCheckpoint())->Predict(input);
  REQUIRE(expected.ok());

  // The trainer records what the fallback derives.
  auto recorded = ReadDataSpec(*ckpt);
  REQUIRE(recorded.ok());
  REQUIRE(recorded->has_value());
  const DataLoaderOptions eval = train::LoaderOptions(Config(kConfig), data, false);
  CHECK((*recorded)->spec.input == train::DataSpecOf(*data.train).input);
  CHECK((*recorded)->spec.num_classes == 4);
  CHECK((*recorded)->mean == eval.mean);
  CHECK((*recorded)->std == eval.std);

  auto save = [&](const std::string& name, const Checkpoint& c) {
    const std::string path = (dir / name).string();
    REQUIRE(SaveCheckpoint(path, c).ok());
    return path;
  };
  Checkpoint unrecorded = *ckpt;
  EraseDataSpec(&unrecorded);
  REQUIRE(!ReadDataSpec(unrecorded)->has_value());
  auto fallback = Load(save("unrecorded.loom", unrecorded))->Predict(input);
  REQUIRE(fallback.ok());
  CHECK(Values(*fallback) == Values(*expected));

  // A data block that no longer loads: served from the record alone.
  proto::TrainConfig moved = Config(ckpt->config_text);
  moved.mutable_data()->set_dataset("cifar10");
  moved.mutable_data()->set_path((dir / "gone").string());
  Checkpoint recorded_moved = *ckpt;
  recorded_moved.config_text = TrainConfigToText(moved);
  auto from_record = Load(save("recorded_moved.loom", recorded_moved))->Predict(input);
  REQUIRE(from_record.ok());
  CHECK(Values(*from_record) == Values(*expected));

  Checkpoint unrecorded_moved = recorded_moved;
  EraseDataSpec(&unrecorded_moved);
  const std::string path = save("unrecorded_moved.loom", unrecorded_moved);
  CHECK_THAT(LoadError(path), Catch::StartsWith(path + " records no data spec, and its config's data block (cifar10) "
                                                       "does not load: "));
}

TEST_CASE("predictor: bad inputs are errors that say what was expected") {
  auto predictor = Load(SingleCheckpoint());
  auto error = [&](const Tensor& t) {
    auto r = predictor->Predict(t);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    return r.status().message();
  };
  const std::string want = "expected [N, 1, 6, 6] f32 (N examples of [1, 6, 6] f32)";
  CHECK(error(Tensor::Zeros(Shape{3, 1, 6, 6}, DType::kI64)) == "Predict: input is [3, 1, 6, 6] i64, " + want);
  CHECK(error(Tensor::Zeros(Shape{3, 36}, DType::kF32)) == "Predict: input is [3, 36] f32, " + want);
  CHECK(error(Tensor::Zeros(Shape{3, 1, 6, 5}, DType::kF32)) == "Predict: input is [3, 1, 6, 5] f32, " + want);
  CHECK(error(Tensor::Zeros(Shape{1, 6, 6}, DType::kF32)) == "Predict: input is [1, 6, 6] f32, " + want);
  CHECK(error(Tensor()) == "Predict: the input tensor is empty (default-constructed); " + want);
  auto classes = predictor->Classify(Tensor::Zeros(Shape{2, 2}, DType::kF32));
  CHECK(!classes.ok());
}

TEST_CASE("predictor: bad checkpoints and options are errors naming the file, replica and tensor") {
  const auto dir = testing::FreshTempDir("predictor_errors");
  const std::string single = SingleCheckpoint(), fused = FusedCheckpoint();

  PredictorOptions o;
  o.replica = 0;
  CHECK(LoadError(single, o) == "PredictorOptions::replica 0: " + single +
                                    " is a single model's checkpoint (its config describes no replicas); leave "
                                    "replica unset (-1)");
  const std::string listing =
      " holds replicas 0 to 2:\n  0  base lr=0.1: running\n  1  slow lr=0.02: running\n  2  huge lr=1e+30: diverged";
  CHECK_THAT(LoadError(fused), Catch::StartsWith(fused + " is a fused run's checkpoint: set PredictorOptions::replica: "
                                                         "PredictorOptions::replica -1: " + fused + listing));
  o.replica = 3;
  CHECK_THAT(LoadError(fused, o), Catch::StartsWith("PredictorOptions::replica 3: " + fused + listing));

  o = {};
  o.batch_size = -2;
  CHECK(LoadError(single, o) == "PredictorOptions::batch_size must be >= 0, got -2");
  o = {};
  o.threads = -1;
  CHECK(LoadError(single, o) == "PredictorOptions::threads: must be >= 0, got -1");

  CHECK_THAT(LoadError((dir / "nope.loom").string()), Catch::Contains("nope.loom"));

  auto ckpt = LoadCheckpoint(single);
  REQUIRE(ckpt.ok());
  const std::string weight = "fc1/weight";
  REQUIRE(ckpt->tensors.count(weight));
  Checkpoint missing = *ckpt;
  missing.tensors.erase(weight);
  const std::string missing_path = (dir / "missing.loom").string();
  REQUIRE(SaveCheckpoint(missing_path, missing).ok());
  CHECK(LoadError(missing_path) == missing_path + ": no tensor 'fc1/weight' (" +
                                       TensorType{Shape{16, 36}, DType::kF32}.ToString() + ") for the model's Parameter");

  Checkpoint reshaped = *ckpt;
  reshaped.tensors[weight] = Tensor::Zeros(Shape{16, 35}, DType::kF32);
  const std::string reshaped_path = (dir / "reshaped.loom").string();
  REQUIRE(SaveCheckpoint(reshaped_path, reshaped).ok());
  CHECK(LoadError(reshaped_path) == reshaped_path + ": tensor 'fc1/weight' is [16, 35] f32, the model's Parameter is " +
                                        TensorType{Shape{16, 36}, DType::kF32}.ToString());

  Checkpoint no_config = *ckpt;
  no_config.config_text.clear();
  const std::string no_config_path = (dir / "no_config.loom").string();
  REQUIRE(SaveCheckpoint(no_config_path, no_config).ok());
  CHECK_THAT(LoadError(no_config_path), Catch::StartsWith(no_config_path + " holds no training config"));
}

}  // namespace
}  // namespace loom
