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
#include <vector>

#include "core/status.h"

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

// What a config file says. Lengths count optimizer updates.
struct ScheduleConfig {
  // constant | step | multistep | exponential | cosine | warmup
  // ("warmup" is the linear warm-up alone: constant after it).
  std::string type = "constant";
  int64_t step_size = 0;            // step: updates between decays (StepLR)
  std::vector<int64_t> milestones;  // multistep: strictly increasing, >= 1 (MultiStepLR)
  double gamma = 0.1;               // step, multistep, exponential: decay factor, > 0
  int64_t t_max = 0;                // cosine: updates from the peak to eta_min (CosineAnnealingLR)
  double eta_min = 0.0;             // cosine: the floor
  // Any type: a linear ramp from base_lr * warmup_start_factor to base_lr over
  // warmup_steps updates (LinearLR), after which the schedule runs with its
  // own count restarted at 0 (SequentialLR). 0 = no warm-up.
  int64_t warmup_steps = 0;
  double warmup_start_factor = 1.0 / 3.0;  // in (0, 1]; torch's LinearLR default
};

// Checks the config (errors name the field and the value) and builds it.
StatusOr<std::unique_ptr<Schedule>> MakeSchedule(const ScheduleConfig& config, double base_lr);

// The same config read in epochs and stepped once per epoch, as torch does
// when scheduler.step() is called after each epoch: LearningRate(t) is the
// per-epoch schedule at epoch floor(t / updates_per_epoch).
StatusOr<std::unique_ptr<Schedule>> MakeEpochSchedule(const ScheduleConfig& config, double base_lr,
                                                      int64_t updates_per_epoch);

}  // namespace loom
