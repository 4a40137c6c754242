// A service that embeds loom (docs/embedding.md): it trains an MLP on
// Fashion-MNIST with loom::Trainer, saves the model, then serves it with
// loom::Predictor from 8 threads at once.
//
//   service DATA_DIR WORK_DIR [STEPS]
//
// DATA_DIR holds the Fashion-MNIST IDX files (t10k-images-idx3-ubyte.gz,
// ...; tools/setup.sh installs them in /usr/share/datasets/fashion-mnist),
// WORK_DIR is a folder of the service's own (the run folder and model go
// there), STEPS the training steps (default 300). It checks what it serves:
// the 8 threads' predictions equal the same requests served one at a time,
// bit for bit, and the predictor's accuracy on the test set equals what
// Trainer::Evaluate reports for the same model. Exit status 0 when both
// hold, 1 (saying why) otherwise. Both consumer builds, tests/consumers/cmake
// and tests/consumers/bazel, compile this file.
#include <loom/loom.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

// The training run: models/configs/fashion_mnist_mlp.pbtxt, shortened.
std::string Config(const std::string& data_dir, int64_t steps) {
  return R"(
model { name: "mlp" args { key: "hidden" value: "256,128" } }
data { dataset: "fashion_mnist" path: ")" + data_dir + R"(" batch_size: 128 eval_batch_size: 1000 }
optimizer { type: "sgd" lr: 0.05 momentum: 0.9 }
schedule { type: "cosine" unit: "step" }
epochs: 1
max_steps: )" + std::to_string(steps) + R"(
log_every_steps: 100
)";
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "service: FAILED: %s\n", what.c_str());
  return 1;
}

// An IDX file (gzip): its dimensions after the magic, then its bytes.
bool ReadIdx(const std::string& path, uint32_t magic, std::vector<uint32_t>* dims, std::vector<uint8_t>* bytes) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) return false;
  auto read_u32 = [&](uint32_t* v) {
    unsigned char b[4];
    if (gzread(f, b, 4) != 4) return false;
    *v = (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
    return true;
  };
  uint32_t m = 0;
  bool ok = read_u32(&m) && m == magic;
  size_t n = 1;
  for (uint32_t i = 0; ok && i < (magic & 0xff); ++i) {
    uint32_t d = 0;
    ok = read_u32(&d);
    dims->push_back(d);
    n *= d;
  }
  if (ok) {
    bytes->resize(n);
    ok = gzread(f, bytes->data(), static_cast<unsigned>(n)) == static_cast<int>(n);
  }
  gzclose(f);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: service DATA_DIR WORK_DIR [STEPS]\n");
    return 2;
  }
  const std::string data_dir = argv[1], work = argv[2];
  const int64_t steps = argc > 3 ? std::stoll(argv[3]) : 300;
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };

  // ---- train
  loom::TrainerOptions options;
  options.out_dir = work + "/run";
  options.console = stdout;
  auto trainer = loom::Trainer::FromConfigText(Config(data_dir, steps), options);
  if (!trainer.ok()) return Fail(trainer.status().ToString());
  while (!(*trainer)->done()) {
    auto step = (*trainer)->Step();
    if (!step.ok()) return Fail(step.status().ToString());
  }
  auto eval = (*trainer)->Evaluate();
  if (!eval.ok()) return Fail(eval.status().ToString());
  const std::string model = work + "/model.loom";
  if (loom::Status s = (*trainer)->SaveCheckpoint(model); !s.ok()) return Fail(s.ToString());
  std::printf("trained %lld steps: test accuracy %.4f (Trainer::Evaluate), saved %s (%.1f s)\n",
              static_cast<long long>((*trainer)->step()), eval->accuracy, model.c_str(), seconds());
  trainer->reset();  // the model is served from its file alone

  // ---- serve
  auto loaded = loom::Predictor::Load(model);
  if (!loaded.ok()) return Fail(loaded.status().ToString());
  const loom::Predictor& predictor = **loaded;

  // The test set as a client would send it: pixels in [0, 1].
  std::vector<uint32_t> image_dims, label_dims;
  std::vector<uint8_t> pixels, labels;
  if (!ReadIdx(data_dir + "/t10k-images-idx3-ubyte.gz", 0x803, &image_dims, &pixels) ||
      !ReadIdx(data_dir + "/t10k-labels-idx1-ubyte.gz", 0x801, &label_dims, &labels) || image_dims.size() != 3 ||
      image_dims[0] != label_dims[0])
    return Fail("cannot read the Fashion-MNIST test set in " + data_dir);
  const int64_t n = image_dims[0], rows = image_dims[1], cols = image_dims[2];
  loom::Tensor images = loom::Tensor::Zeros(loom::Shape{n, 1, rows, cols}, loom::DType::kF32);
  for (size_t i = 0; i < pixels.size(); ++i) images.data<float>()[i] = static_cast<float>(pixels[i]) / 255.0f;

  // Bad requests are errors, not crashes.
  auto wrong = predictor.Predict(loom::Tensor::Zeros(loom::Shape{2, 784}, loom::DType::kF32));
  if (wrong.ok()) return Fail("a [2, 784] input was accepted");
  std::printf("a bad request: %s\n", wrong.status().ToString().c_str());

  // Requests of assorted sizes (one image up to several batches) covering
  // the test set; the last batch of each is padded inside Predict.
  struct Request {
    int64_t begin, size;
    loom::Tensor input, logits;
  };
  std::vector<Request> requests;
  const int64_t sizes[] = {1, 7, 64, 250, 1000, 1500, 3};
  const int64_t example = rows * cols;
  for (int64_t begin = 0, k = 0; begin < n; ++k) {
    const int64_t size = std::min(sizes[k % 7], n - begin);
    loom::Tensor input = loom::Tensor::Zeros(loom::Shape{size, 1, rows, cols}, loom::DType::kF32);
    std::memcpy(input.data<float>(), images.data<float>() + begin * example, size * example * sizeof(float));
    requests.push_back({begin, size, input, {}});
    begin += size;
  }
  for (Request& r : requests) {  // one at a time
    auto logits = predictor.Predict(r.input);
    if (!logits.ok()) return Fail(logits.status().ToString());
    r.logits = *logits;
  }

  // The same requests from 8 threads at once, each taking the next one.
  std::atomic<size_t> next{0};
  std::atomic<int> mismatches{0};
  std::vector<std::string> errors(8);
  std::vector<std::thread> threads;
  const double serve_start = seconds();
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i; (i = next.fetch_add(1)) < requests.size();) {
        auto logits = predictor.Predict(requests[i].input);
        if (!logits.ok()) {
          errors[t] = logits.status().ToString();
          return;
        }
        const loom::Tensor& want = requests[i].logits;
        if (logits->shape() != want.shape() || std::memcmp(logits->raw_data(), want.raw_data(), want.nbytes()) != 0)
          ++mismatches;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& e : errors)
    if (!e.empty()) return Fail("a serving thread: " + e);
  if (mismatches > 0)
    return Fail(std::to_string(mismatches.load()) + " of " + std::to_string(requests.size()) +
                " requests served by 8 threads differ from the same requests served one at a time");
  std::printf("served %zu requests (%lld images) from 8 threads in %.2f s: equal to one at a time\n", requests.size(),
              static_cast<long long>(n), seconds() - serve_start);

  // ---- the predictor's accuracy is the trainer's
  auto classes = predictor.Classify(images);
  if (!classes.ok()) return Fail(classes.status().ToString());
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) correct += (*classes)[i] == labels[i];
  const double accuracy = static_cast<double>(correct) / static_cast<double>(n);
  std::printf("predictor accuracy %.4f (%lld of %lld), Trainer::Evaluate %.4f\n", accuracy,
              static_cast<long long>(correct), static_cast<long long>(n), eval->accuracy);
  if (accuracy != eval->accuracy) return Fail("the predictor's test accuracy differs from Trainer::Evaluate's");
  if (accuracy < 0.7) return Fail("test accuracy below 0.7 after " + std::to_string(steps) + " steps");
  std::printf("service: ok (%.1f s)\n", seconds());
  return 0;
}
