// `loom train`: trains the MLP on the real Fashion-MNIST data and reports
// test accuracy after each epoch. (Config files, checkpoints and the other
// models arrive with the training issue; this is the single-model path.)
#include <chrono>
#include <cstdio>

#include "core/logging.h"
#include "core/thread_pool.h"
#include "models/mlp.h"
#include "runtime/trainer.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace loom::tools {

Status TrainCommand(const std::vector<std::string>& args) {
  Flags flags({{"epochs", "passes over the training set (default 10)"},
               {"batch", "mini-batch size (default 128)"},
               {"lr", "learning rate (default 0.05)"},
               {"momentum", "SGD momentum (default 0.9)"},
               {"threads", "CPU threads (default: all cores)"},
               {"seed", "seed for initialisation and shuffling (default 0)"},
               {"max-steps", "stop after this many steps (default: no limit)"},
               {"data", std::string("Fashion-MNIST folder (default ") + kFashionMnistDir + ")"}});
  LOOM_RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::printf("usage: loom train [flags]\n%s", flags.Help().c_str());
    return Status::Ok();
  }
  SetLogVerbosity(flags.verbosity());
  LOOM_ASSIGN_OR_RETURN(int64_t epochs, flags.Int("epochs", 10));
  LOOM_ASSIGN_OR_RETURN(int64_t batch, flags.Int("batch", 128));
  LOOM_ASSIGN_OR_RETURN(double lr, flags.Float("lr", 0.05));
  LOOM_ASSIGN_OR_RETURN(double momentum, flags.Float("momentum", 0.9));
  LOOM_ASSIGN_OR_RETURN(int64_t threads, flags.Int("threads", 0));
  LOOM_ASSIGN_OR_RETURN(int64_t seed, flags.Int("seed", 0));
  LOOM_ASSIGN_OR_RETURN(int64_t max_steps, flags.Int("max-steps", 0));
  if (epochs < 1) return InvalidArgument("--epochs must be >= 1, got ", epochs);
  if (batch < 1) return InvalidArgument("--batch must be >= 1, got ", batch);
  if (lr <= 0) return InvalidArgument("--lr must be > 0, got ", lr);
  if (threads > 0) ThreadPool::SetDefaultThreads(static_cast<int>(threads));
  const std::string dir = flags.Str("data", kFashionMnistDir);

  LOOM_ASSIGN_OR_RETURN(ImageDataset train, LoadFashionMnist(dir, "train"));
  LOOM_ASSIGN_OR_RETURN(ImageDataset test, LoadFashionMnist(dir, "test"));
  std::printf("Fashion-MNIST: %lld training and %lld test images\n", static_cast<long long>(train.size()),
              static_cast<long long>(test.size()));

  Model m;
  Sym image = m.input("image", {batch, 1, 28, 28});
  Sym label = m.input("label", {batch}, DType::kI64);
  Sym logits = models::Mlp(m, image);
  m.set_output("logits", logits);
  m.set_output("loss", m.cross_entropy(logits, label));
  if (!m.status().ok()) return m.status().WithContext("building the MLP");

  TrainerOptions opts;
  opts.optimizer.momentum = momentum;
  opts.learning_rate = lr;
  opts.seed = static_cast<uint64_t>(seed);
  opts.max_steps = max_steps;
  LOOM_ASSIGN_OR_RETURN(auto trainer, ClassifierTrainer::Create(m.graph(), opts));
  std::printf("model: mlp 784-256-128-10, SGD lr %g momentum %g, batch %lld, %d threads\n", lr, momentum,
              static_cast<long long>(batch), ThreadPool::Default().num_threads());

  const auto start = std::chrono::steady_clock::now();
  EvalReport last;
  for (int64_t e = 1; e <= epochs && !trainer->done(); ++e) {
    LOOM_ASSIGN_OR_RETURN(double train_loss, trainer->TrainEpoch(train, 100, [&](const StepReport& r) {
      std::printf("  step %6lld  loss %.4f  %8.0f samples/s\n", static_cast<long long>(r.step), r.loss, r.samples_per_s);
      std::fflush(stdout);
    }));
    LOOM_ASSIGN_OR_RETURN(last, trainer->Evaluate(test));
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("epoch %lld: train loss %.4f, test loss %.4f, test accuracy %.4f (%.1f s)\n", static_cast<long long>(e),
                train_loss, last.loss, last.accuracy, secs);
    std::fflush(stdout);
  }
  std::printf("final test accuracy %.4f after %lld steps\n", last.accuracy, static_cast<long long>(trainer->steps()));
  return Status::Ok();
}

}  // namespace loom::tools
