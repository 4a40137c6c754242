#include "train/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace loom {

double Schedule::LearningRate(int64_t updates_done) const {
  LOOM_CHECK(updates_done >= 0, "a learning rate for ", updates_done, " updates done (must be >= 0)");
  return At(updates_done);
}

namespace {

template <typename S, typename... Args>
StatusOr<std::unique_ptr<Schedule>> Make(Args&&... args) {
  return std::unique_ptr<Schedule>(std::make_unique<S>(std::forward<Args>(args)...));
}

// The closed forms of torch.optim.lr_scheduler (_get_closed_form_lr), which
// equal its recursive per-step updates.

class ConstantSchedule : public Schedule {
 public:
  explicit ConstantSchedule(double base_lr) : base_lr_(base_lr) {}
  double At(int64_t) const override { return base_lr_; }
  std::string ToString() const override { return StrCat("constant(", base_lr_, ")"); }

 private:
  double base_lr_;
};

// StepLR: base_lr * gamma^floor(t / step_size).
class StepSchedule : public Schedule {
 public:
  StepSchedule(double base_lr, int64_t step_size, double gamma)
      : base_lr_(base_lr), step_size_(step_size), gamma_(gamma) {}
  double At(int64_t t) const override {
    return base_lr_ * std::pow(gamma_, static_cast<double>(t / step_size_));
  }
  std::string ToString() const override {
    return StrCat("step(", base_lr_, ", step_size=", step_size_, ", gamma=", gamma_, ")");
  }

 private:
  double base_lr_;
  int64_t step_size_;
  double gamma_;
};

// MultiStepLR: base_lr * gamma^(number of milestones <= t).
class MultiStepSchedule : public Schedule {
 public:
  MultiStepSchedule(double base_lr, std::vector<int64_t> milestones, double gamma)
      : base_lr_(base_lr), milestones_(std::move(milestones)), gamma_(gamma) {}
  double At(int64_t t) const override {
    const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), t) - milestones_.begin();
    return base_lr_ * std::pow(gamma_, static_cast<double>(passed));
  }
  std::string ToString() const override {
    std::string ms;
    for (int64_t m : milestones_) ms += (ms.empty() ? "" : ", ") + std::to_string(m);
    return StrCat("multistep(", base_lr_, ", milestones=[", ms, "], gamma=", gamma_, ")");
  }

 private:
  double base_lr_;
  std::vector<int64_t> milestones_;
  double gamma_;
};

// ExponentialLR: base_lr * gamma^t.
class ExponentialSchedule : public Schedule {
 public:
  ExponentialSchedule(double base_lr, double gamma) : base_lr_(base_lr), gamma_(gamma) {}
  double At(int64_t t) const override { return base_lr_ * std::pow(gamma_, static_cast<double>(t)); }
  std::string ToString() const override { return StrCat("exponential(", base_lr_, ", gamma=", gamma_, ")"); }

 private:
  double base_lr_;
  double gamma_;
};

// CosineAnnealingLR: eta_min + (base_lr - eta_min) (1 + cos(pi t / t_max)) / 2.
// Past t_max the cosine rises again, as torch's does; a run that should end
// at eta_min sets t_max to its length.
class CosineSchedule : public Schedule {
 public:
  CosineSchedule(double base_lr, int64_t t_max, double eta_min) : base_lr_(base_lr), t_max_(t_max), eta_min_(eta_min) {}
  double At(int64_t t) const override {
    const double phase = M_PI * static_cast<double>(t) / static_cast<double>(t_max_);
    return eta_min_ + (base_lr_ - eta_min_) * (1 + std::cos(phase)) / 2;
  }
  std::string ToString() const override {
    return StrCat("cosine(", base_lr_, ", t_max=", t_max_, ", eta_min=", eta_min_, ")");
  }

 private:
  double base_lr_;
  int64_t t_max_;
  double eta_min_;
};

// SequentialLR([LinearLR(start_factor, end_factor=1, total_iters=steps),
// after], milestones=[steps]): base_lr * (start + (1 - start) t / steps)
// during the warm-up, then `after` counted from 0.
class WarmupSchedule : public Schedule {
 public:
  WarmupSchedule(double base_lr, int64_t steps, double start_factor, std::unique_ptr<Schedule> after)
      : base_lr_(base_lr), steps_(steps), start_factor_(start_factor), after_(std::move(after)) {}
  double At(int64_t t) const override {
    if (t >= steps_) return after_->LearningRate(t - steps_);
    const double frac = static_cast<double>(t) / static_cast<double>(steps_);
    return base_lr_ * (start_factor_ + (1 - start_factor_) * frac);
  }
  std::string ToString() const override {
    return StrCat("linear warm-up(", steps_, " updates from ", start_factor_, ") then ", after_->ToString());
  }

 private:
  double base_lr_;
  int64_t steps_;
  double start_factor_;
  std::unique_ptr<Schedule> after_;
};

// A schedule stepped once every `period` updates.
class PerEpochSchedule : public Schedule {
 public:
  PerEpochSchedule(std::unique_ptr<Schedule> per_epoch, int64_t period)
      : per_epoch_(std::move(per_epoch)), period_(period) {}
  double At(int64_t t) const override { return per_epoch_->LearningRate(t / period_); }
  std::string ToString() const override {
    return StrCat(per_epoch_->ToString(), " stepped per epoch of ", period_, " updates");
  }

 private:
  std::unique_ptr<Schedule> per_epoch_;
  int64_t period_;
};

// Checks that let NaN fail too.
Status ExpectPositive(const std::string& type, const char* field, double v) {
  if (!(v > 0) || std::isinf(v)) return InvalidArgument(type, " schedule: ", field, " must be > 0 and finite, got ", v);
  return Status::Ok();
}
Status ExpectAtLeastOne(const std::string& type, const char* field, int64_t v) {
  if (v < 1) return InvalidArgument(type, " schedule: ", field, " must be >= 1 update, got ", v);
  return Status::Ok();
}

// `c` has its defaults (ScheduleWithDefaults).
StatusOr<std::unique_ptr<Schedule>> MakeMain(const proto::ScheduleConfig& c, double base_lr) {
  const std::string& type = c.type();
  if (type == "constant" || type == "warmup") return Make<ConstantSchedule>(base_lr);
  if (type == "step") {
    LOOM_RETURN_IF_ERROR(ExpectAtLeastOne(type, "step_size", c.step_size()));
    LOOM_RETURN_IF_ERROR(ExpectPositive(type, "gamma", c.gamma()));
    return Make<StepSchedule>(base_lr, c.step_size(), c.gamma());
  }
  if (type == "multistep") {
    if (c.milestones().empty()) return InvalidArgument("multistep schedule: milestones must not be empty");
    for (int i = 0; i < c.milestones_size(); ++i) {
      if (c.milestones(i) < 1)
        return InvalidArgument("multistep schedule: milestones must be >= 1 update, got ", c.milestones(i));
      if (i > 0 && c.milestones(i) <= c.milestones(i - 1))
        return InvalidArgument("multistep schedule: milestones must be strictly increasing, got ",
                               c.milestones(i - 1), " then ", c.milestones(i));
    }
    LOOM_RETURN_IF_ERROR(ExpectPositive(type, "gamma", c.gamma()));
    return Make<MultiStepSchedule>(base_lr, std::vector<int64_t>(c.milestones().begin(), c.milestones().end()),
                                   c.gamma());
  }
  if (type == "exponential") {
    LOOM_RETURN_IF_ERROR(ExpectPositive(type, "gamma", c.gamma()));
    return Make<ExponentialSchedule>(base_lr, c.gamma());
  }
  if (type == "cosine") {
    LOOM_RETURN_IF_ERROR(ExpectAtLeastOne(type, "t_max", c.t_max()));
    if (!(c.eta_min() >= 0) || std::isinf(c.eta_min()))
      return InvalidArgument("cosine schedule: eta_min must be >= 0 and finite, got ", c.eta_min());
    return Make<CosineSchedule>(base_lr, c.t_max(), c.eta_min());
  }
  return InvalidArgument("unknown schedule '", type,
                         "' (expected constant, step, multistep, exponential, cosine or warmup)");
}

}  // namespace

proto::ScheduleConfig ScheduleWithDefaults(const proto::ScheduleConfig& config) {
  proto::ScheduleConfig c = config;
  if (c.type().empty()) c.set_type("constant");
  if (c.unit().empty()) c.set_unit("epoch");
  if (!c.has_gamma()) c.set_gamma(0.1);
  if (!c.has_warmup_start_factor()) c.set_warmup_start_factor(1.0 / 3.0);
  return c;
}

StatusOr<std::unique_ptr<Schedule>> MakeSchedule(const proto::ScheduleConfig& config, double base_lr) {
  if (!(base_lr >= 0) || std::isinf(base_lr))
    return InvalidArgument("the base learning rate must be >= 0 and finite, got ", base_lr);
  const proto::ScheduleConfig c = ScheduleWithDefaults(config);
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Schedule> main, MakeMain(c, base_lr));
  const int64_t warmup = c.warmup_steps();
  if (warmup < 0) return InvalidArgument(c.type(), " schedule: warmup_steps must be >= 0, got ", warmup);
  if (c.type() == "warmup" && warmup == 0)
    return InvalidArgument("warmup schedule: warmup_steps must be >= 1 update, got 0");
  if (warmup == 0) return main;
  const double start = c.warmup_start_factor();
  if (!(start > 0 && start <= 1))
    return InvalidArgument(c.type(), " schedule: warmup_start_factor must be in (0, 1], got ", start);
  return Make<WarmupSchedule>(base_lr, warmup, start, std::move(main));
}

StatusOr<std::unique_ptr<Schedule>> MakeEpochSchedule(const proto::ScheduleConfig& c, double base_lr,
                                                      int64_t updates_per_epoch) {
  if (updates_per_epoch < 1) return InvalidArgument("updates_per_epoch must be >= 1, got ", updates_per_epoch);
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Schedule> per_epoch, MakeSchedule(c, base_lr));
  return Make<PerEpochSchedule>(std::move(per_epoch), updates_per_epoch);
}

}  // namespace loom
