// Learning-rate schedules as pure functions of the number of optimizer
// updates done so far, with torch.optim.lr_scheduler semantics when the
// scheduler is stepped once per update (scheduler.step() after every
// optimizer.step()):
//
//   lr = schedule.LearningRate(t)   t = updates done before this one
//
// so the first update uses LearningRate(0) = the schedule's initial value,
// and update number k (the training graph's 1-based "step" input) uses
// LearningRate(k - 1). docs/optimizers.md has the formulas.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "train/optim/schedule.pb.h"

namespace loom {

class Schedule {
 public:
  virtual ~Schedule() = default;
  // `updates_done` >= 0 (a negative count is a caller bug and aborts).
  double LearningRate(int64_t updates_done) const;
  // For logs, e.g. "linear warm-up(100 updates from 0.1) then cosine(0.1, t_max=900, eta_min=0)".
  virtual std::string ToString() const = 0;

 protected:
  virtual double At(int64_t updates_done) const = 0;
};

// `config` (train/optim/schedule.proto, one schema with train configs) with
// every unset field at its default, the one place they live: type
// "constant", unit "epoch", gamma 0.1, warmup_start_factor 1/3 (torch's
// LinearLR default); everything else 0 or empty. MakeSchedule and
// MakeEpochSchedule apply it to what they are given; train configs apply it
// when loaded (train/config/train_config.h FillDefaults).
proto::ScheduleConfig ScheduleWithDefaults(const proto::ScheduleConfig& config);

// Checks the config, unset fields at their defaults (errors name the field
// and the value), and builds it, lengths counted in updates. `unit` is the
// caller's business (it chooses this or MakeEpochSchedule) and is ignored;
// t_max must be >= 1 for a cosine (a train config's 0 = "the whole run" is
// resolved by train/run_parts.h BuildSchedule).
StatusOr<std::unique_ptr<Schedule>> MakeSchedule(const proto::ScheduleConfig& config, double base_lr);

// The same config read in epochs and stepped once per epoch, as torch does
// when scheduler.step() is called after each epoch: LearningRate(t) is the
// per-epoch schedule at epoch floor(t / updates_per_epoch).
StatusOr<std::unique_ptr<Schedule>> MakeEpochSchedule(const proto::ScheduleConfig& config, double base_lr,
                                                      int64_t updates_per_epoch);

}  // namespace loom
