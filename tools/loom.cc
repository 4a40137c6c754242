// The loom command line.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/mpi_communicator.h"
#include "tools/commands.h"

namespace {

std::unique_ptr<loom::MpiCommunicator> processes;  // under mpirun

constexpr const char* kUsage =
    "usage: loom <command> [flags]\n"
    "commands:\n"
    "  train          train a model from a config file, or resume a run (loom train --help)\n"
    "  bench kernels  GEMM, Conv2d and MLP-step throughput against the Eigen GEMM roof\n"
    "  ops            list the registered ops and the devices that have kernels for them\n"
    "  checkpoint F   the training position and per-tensor checksums of checkpoint F\n"
    "  plan           how many fused replicas of a config's model fit in memory (loom plan --help)\n"
    "  export         one replica of a fused run's checkpoint as a single-model checkpoint\n"
    "  inspect        a zoo model's layers, parameters and FLOPs; --export its graph (loom inspect --help)\n"
    "  strategy       a standard parallelization strategy for a config's model (loom strategy --help)\n"
    "  simulate       the predicted training step of a config's model on a machine (loom simulate --help)\n"
    "  search         a parallelization strategy for a config's model on a machine (loom search --help)\n"
    "  sweep          hyper-parameter search (random, Hyperband) in fused arrays (loom sweep --help)\n"
    "  machine probe  this machine's description for the simulator, measured\n"
    "  profile        kernel times of a config's step on CPU devices, for loom simulate --profile\n";

}  // namespace

namespace loom::tools {
Communicator* ProcessCommunicator() { return processes.get(); }
void LeaveProcesses() {
  processes.reset();
  FinalizeMpi();
}
}  // namespace loom::tools

int main(int argc, char** argv) {
  // Under `bazel run`, paths on the command line are the user's: work from
  // the folder bazel was started in.
  if (const char* dir = std::getenv("BUILD_WORKING_DIRECTORY")) {
    if (chdir(dir) != 0) std::perror("loom: cannot change to BUILD_WORKING_DIRECTORY");
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string command = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  const std::map<std::string, loom::Status (*)(const std::vector<std::string>&)> commands = {
      {"train", loom::tools::TrainCommand},     {"checkpoint", loom::tools::CheckpointCommand},
      {"ops", loom::tools::OpsCommand},         {"bench", loom::tools::BenchCommand},
      {"plan", loom::tools::PlanCommand},       {"export", loom::tools::ExportCommand},
      {"inspect", loom::tools::InspectCommand}, {"strategy", loom::tools::StrategyCommand},
      {"simulate", loom::tools::SimulateCommand}, {"machine", loom::tools::MachineCommand},
      {"profile", loom::tools::ProfileCommand}, {"search", loom::tools::SearchCommand},
      {"sweep", loom::tools::SweepCommand},
  };
  auto it = commands.find(command);
  if (it == commands.end()) {
    std::fprintf(stderr, "loom: unknown command '%s'\n%s", command.c_str(), kUsage);
    return 2;
  }
  if (loom::LaunchedByMpirun()) {
    auto world = loom::MpiCommunicator::World();
    if (!world.ok()) {
      std::fprintf(stderr, "loom: cannot join the MPI job: %s\n", world.status().message().c_str());
      return 1;
    }
    processes = std::move(*world);
  }
  loom::Status status;
  // Errors are Status values; an exception that still escapes (from the
  // standard library: std::system_error, std::bad_alloc) is reported as the
  // command's error rather than an abort with no message.
  try {
    status = it->second(rest);
  } catch (const std::exception& e) {
    status = loom::Internal("uncaught exception: ", e.what());
  }
  if (!status.ok()) {
    // One failed rank ends the job: the others would wait for it forever.
    if (processes && processes->size() > 1) processes->Abort(status.WithContext(loom::StrCat("loom ", command)));
    std::fprintf(stderr, "loom %s: error: %s\n", command.c_str(), status.message().c_str());
    return 1;
  }
  loom::tools::LeaveProcesses();
  return 0;
}
