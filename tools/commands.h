// The subcommands of the `loom` binary.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "graph/ir.h"
#include "simulator/cost_model.h"
#include "simulator/machine.h"
#include "simulator/profile.h"
#include "runtime/comm/communicator.h"
#include "train/config/train_config.h"

namespace loom::tools {

// Under mpirun: this process's rank in the job (MPI_COMM_WORLD); null when
// loom was started alone. Made by main before the command runs.
Communicator* ProcessCommunicator();
// Leaves the MPI job cleanly (every rank must): for a command that ends the
// process itself (a run stopped by a signal exits with 128 + signal).
void LeaveProcesses();

Status TrainCommand(const std::vector<std::string>& args);
Status BenchCommand(const std::vector<std::string>& args);
Status OpsCommand(const std::vector<std::string>& args);
Status CheckpointCommand(const std::vector<std::string>& args);
// Fused replicas (docs/fusion_tools.md): how many fit in a device's memory,
// and one replica of a fused run's checkpoint as a single model's.
Status PlanCommand(const std::vector<std::string>& args);
// loom sweep: hyper-parameter search in fused arrays (docs/sweep.md).
Status SweepCommand(const std::vector<std::string>& args);
Status ExportCommand(const std::vector<std::string>& args);
// A zoo model's layers, parameters and FLOPs; its forward graph to a file
// (docs/inspect.md).
Status InspectCommand(const std::vector<std::string>& args);
// Parallelization strategies (docs/parallel.md): the standard ones for a
// config's model, and a strategy's split of every layer (`loom inspect
// --config C --strategy S`).
Status StrategyCommand(const std::vector<std::string>& args);
// The predicted step of a config's model on a machine, this machine's
// description, and predicted against measured steps (docs/simulator.md).
Status SimulateCommand(const std::vector<std::string>& args);
Status MachineCommand(const std::vector<std::string>& args);
// The cost model of `--profile FILE` (docs/simulator.md): the profile's
// measured tasks and the roofline calibrated on it for the rest; without a
// profile (an empty path), the analytical roofline.
class FlagCostModel {
 public:
  static StatusOr<std::unique_ptr<FlagCostModel>> Load(const std::string& profile_path, const Machine& machine);
  const CostModel& get() const;
  // "the analytical roofline", or "profile P: N tasks measured, M by the
  // roofline calibrated on it" (after the model has been used).
  std::string Describe() const;

 private:
  FlagCostModel(const std::string& path, Profile profile, const Machine& machine);
  const std::string path_;
  const Profile profile_;
  const AnalyticalCostModel analytical_;
  const CalibratedCostModel calibrated_;
  const ProfiledCostModel profiled_;
};

// This machine as the simulator sees the task runtime's CPU devices,
// measured now (`loom machine probe`), with at least `devices` devices.
StatusOr<Machine> ProbeCpuMachine(int reps, int64_t devices = 0);
// The same, and under mpirun (`world`) a node per process joined by the
// link their messages take, measured between ranks 0 and 1: every rank
// calls it and gets rank 0's. `devices`: all processes' (0: one per core).
StatusOr<Machine> ProbeMachine(int reps, Communicator* world, int64_t devices = 0);
Status ProfileCommand(const std::vector<std::string>& args);
Status BenchSimulator(const std::vector<std::string>& args);
// A strategy found by simulated search (docs/search.md).
Status SearchCommand(const std::vector<std::string>& args);
// The forward graph and the training step `loom train` builds for a
// config (fused when it has replicas or a sweep, in its precision), every
// replica with the config's optimizer: what strategies split.
struct ConfigPrograms {
  Graph forward, step;
};
StatusOr<ConfigPrograms> BuildConfigPrograms(const proto::TrainConfig& config);

// The strategy's split of every layer; with `taskgraph`, the training
// step's task graph (and its JSON to `json_path` when not empty).
Status InspectStrategy(const std::string& config_path, const std::string& strategy_path, bool taskgraph,
                       const std::string& json_path);

}  // namespace loom::tools
