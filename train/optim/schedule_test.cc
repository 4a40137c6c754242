// Schedules against hand-computed values, against torch.optim.lr_scheduler's
// recursive per-step updates (its get_lr, re-written here), and their errors.
#include "train/optim/schedule.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>

namespace loom {
namespace {

void SetMilestones(proto::ScheduleConfig* c, std::initializer_list<int64_t> milestones) {
  c->clear_milestones();
  for (int64_t m : milestones) c->add_milestones(m);
}

std::unique_ptr<Schedule> Make(const proto::ScheduleConfig& c, double base_lr) {
  auto s = MakeSchedule(c, base_lr);
  REQUIRE(s.status().ToString() == "OK");
  return std::move(s).value();
}

void CheckValues(const Schedule& s, const std::vector<std::pair<int64_t, double>>& want) {
  for (const auto& [t, lr] : want) {
    INFO(s.ToString() << " after " << t << " updates");
    CHECK(s.LearningRate(t) == Approx(lr).epsilon(1e-12).margin(1e-15));
  }
}

TEST_CASE("constant, step, multistep and exponential schedules by hand") {
  proto::ScheduleConfig c;
  CheckValues(*Make(c, 0.1), {{0, 0.1}, {1, 0.1}, {123456, 0.1}});

  c.set_type("step");
  c.set_step_size(3);
  c.set_gamma(0.5);
  CheckValues(*Make(c, 0.1), {{0, 0.1}, {2, 0.1}, {3, 0.05}, {5, 0.05}, {6, 0.025}, {9, 0.0125}});

  c = proto::ScheduleConfig();
  c.set_type("multistep");
  SetMilestones(&c, {2, 5});
  CheckValues(*Make(c, 1.0), {{0, 1.0}, {1, 1.0}, {2, 0.1}, {4, 0.1}, {5, 0.01}, {1000, 0.01}});

  c = proto::ScheduleConfig();
  c.set_type("exponential");
  c.set_gamma(0.9);
  CheckValues(*Make(c, 0.1), {{0, 0.1}, {1, 0.09}, {3, 0.0729}, {10, 0.034867844010000}});
}

TEST_CASE("cosine annealing by hand, with and without warm-up") {
  proto::ScheduleConfig c;
  c.set_type("cosine");
  c.set_t_max(10);
  c.set_eta_min(0.001);
  // t = 2: 0.001 + 0.099 (1 + cos(pi / 5)) / 2, cos(pi / 5) = 0.80901699437...
  CheckValues(*Make(c, 0.1), {{0, 0.1}, {2, 0.0905463412215599},
                              {5, 0.0505}, {10, 0.001}, {15, 0.0505}, {20, 0.1}});  // periodic past t_max, as torch

  c.set_t_max(4);
  c.set_eta_min(0);
  c.set_warmup_steps(2);
  c.set_warmup_start_factor(0.5);
  // Warm-up 0.5, 0.75; then the cosine from its start: 1, (1 + cos(pi/4)) / 2, 0.5, ..., 0.
  CheckValues(*Make(c, 1.0), {{0, 0.5}, {1, 0.75}, {2, 1.0}, {3, 0.85355339059327}, {4, 0.5}, {6, 0.0}});
}

TEST_CASE("linear warm-up alone") {
  proto::ScheduleConfig c;
  c.set_type("warmup");
  c.set_warmup_steps(4);
  c.set_warmup_start_factor(0.25);
  CheckValues(*Make(c, 0.2), {{0, 0.05}, {1, 0.0875}, {2, 0.125}, {3, 0.1625}, {4, 0.2}, {100, 0.2}});
  c.set_warmup_start_factor(1.0);  // no ramp at all
  CheckValues(*Make(c, 0.2), {{0, 0.2}, {3, 0.2}});
  c = proto::ScheduleConfig();
  c.set_type("warmup");
  c.set_warmup_steps(3);  // torch's default start factor 1/3: base/3, 5/9 base, 7/9 base
  CheckValues(*Make(c, 0.9), {{0, 0.3}, {1, 0.5}, {2, 0.7}, {3, 0.9}});
}

TEST_CASE("warm-up composes with the decaying schedules as SequentialLR does") {
  proto::ScheduleConfig c;
  c.set_type("step");
  c.set_step_size(2);
  c.set_gamma(0.5);
  c.set_warmup_steps(2);
  c.set_warmup_start_factor(0.5);
  // The step count restarts after the warm-up: decays at 2 + 2 and 2 + 4.
  CheckValues(*Make(c, 1.0), {{0, 0.5}, {1, 0.75}, {2, 1.0}, {3, 1.0}, {4, 0.5}, {6, 0.25}});
}

// torch.optim.lr_scheduler's get_lr: the rate after one more step from the
// previous rate (last_epoch = t >= 1); t = 0 is the initial rate.
using TorchStep = std::function<double(int64_t t, double prev, double base)>;

std::vector<double> TorchRates(const TorchStep& step, double initial, double base, int64_t n) {
  std::vector<double> lr = {initial};
  for (int64_t t = 1; t < n; ++t) lr.push_back(step(t, lr.back(), base));
  return lr;
}

TorchStep TorchCosine(int64_t t_max, double eta_min) {
  return [=](int64_t t, double prev, double base) {
    const int64_t period = 2 * t_max;
    if ((((t - 1 - t_max) % period) + period) % period == 0)  // Python's modulo
      return prev + (base - eta_min) * (1 - std::cos(M_PI / t_max)) / 2;
    return (1 + std::cos(M_PI * t / t_max)) / (1 + std::cos(M_PI * (t - 1) / t_max)) * (prev - eta_min) + eta_min;
  };
}

// SequentialLR([LinearLR(start, total_iters=w), after], milestones=[w]):
// LinearLR's recursion for t < w, after.step(0) (its closed form at 0, the
// base rate for every schedule here) at t = w, then after's recursion.
std::vector<double> TorchWarmup(int64_t w, double start, const TorchStep& after, double base, int64_t n) {
  std::vector<double> lr = {base * start};
  for (int64_t t = 1; t < n; ++t) {
    const double prev = lr.back();
    if (t < w) lr.push_back(prev * (1 + (1 - start) / (w * start + (t - 1) * (1 - start))));
    else if (t == w) lr.push_back(base);
    else lr.push_back(after(t - w, prev, base));
  }
  return lr;
}

void CheckAgainstTorch(const proto::ScheduleConfig& c, double base, const std::vector<double>& torch) {
  auto s = Make(c, base);
  for (size_t t = 0; t < torch.size(); ++t) {
    INFO(s->ToString() << " after " << t << " updates");
    REQUIRE(s->LearningRate(static_cast<int64_t>(t)) == Approx(torch[t]).epsilon(1e-10).margin(1e-14));
  }
}

TEST_CASE("the closed forms follow torch's per-step recursion") {
  const double base = 0.3;
  proto::ScheduleConfig c;
  c.set_type("step");
  c.set_step_size(7);
  c.set_gamma(0.8);
  CheckAgainstTorch(c, base, TorchRates([](int64_t t, double prev, double) { return t % 7 ? prev : prev * 0.8; }, base,
                                        base, 60));
  c = proto::ScheduleConfig();
  c.set_type("multistep");
  SetMilestones(&c, {3, 10, 11});
  c.set_gamma(0.5);
  CheckAgainstTorch(c, base, TorchRates([](int64_t t, double prev, double) {
                      return t == 3 || t == 10 || t == 11 ? prev * 0.5 : prev;
                    }, base, base, 30));
  c = proto::ScheduleConfig();
  c.set_type("exponential");
  c.set_gamma(0.97);
  CheckAgainstTorch(c, base, TorchRates([](int64_t, double prev, double) { return prev * 0.97; }, base, base, 100));
  c = proto::ScheduleConfig();
  c.set_type("cosine");
  c.set_t_max(12);
  c.set_eta_min(0.01);
  CheckAgainstTorch(c, base, TorchRates(TorchCosine(12, 0.01), base, base, 5 * 12));  // through two periods
  c.set_warmup_steps(5);
  c.set_warmup_start_factor(0.1);
  CheckAgainstTorch(c, base, TorchWarmup(5, 0.1, TorchCosine(12, 0.01), base, 40));
  c = proto::ScheduleConfig();
  c.set_type("warmup");
  c.set_warmup_steps(9);
  CheckAgainstTorch(c, base, TorchWarmup(9, 1.0 / 3, [](int64_t, double prev, double) { return prev; }, base, 20));
}

TEST_CASE("an epoch schedule steps once per epoch") {
  proto::ScheduleConfig c;
  c.set_type("step");
  c.set_step_size(2);  // epochs
  c.set_gamma(0.5);
  auto s = MakeEpochSchedule(c, 1.0, 4);
  REQUIRE(s.ok());
  CheckValues(**s, {{0, 1.0}, {7, 1.0}, {8, 0.5}, {15, 0.5}, {16, 0.25}});
  c = proto::ScheduleConfig();
  c.set_type("cosine");
  c.set_t_max(2);
  auto cosine = MakeEpochSchedule(c, 1.0, 3);
  REQUIRE(cosine.ok());
  CheckValues(**cosine, {{0, 1.0}, {2, 1.0}, {3, 0.5}, {5, 0.5}, {6, 0.0}});
  CHECK((*cosine)->ToString() == "cosine(1, t_max=2, eta_min=0) stepped per epoch of 3 updates");
  auto bad = MakeEpochSchedule(c, 1.0, 0);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "updates_per_epoch must be >= 1, got 0");
}

TEST_CASE("schedules describe themselves") {
  proto::ScheduleConfig c;
  c.set_type("multistep");
  SetMilestones(&c, {30, 60});
  CHECK(Make(c, 0.1)->ToString() == "multistep(0.1, milestones=[30, 60], gamma=0.1)");
  c = proto::ScheduleConfig();
  c.set_type("cosine");
  c.set_t_max(900);
  c.set_warmup_steps(100);
  c.set_warmup_start_factor(0.1);
  CHECK(Make(c, 0.1)->ToString() == "linear warm-up(100 updates from 0.1) then cosine(0.1, t_max=900, eta_min=0)");
}

TEST_CASE("unset fields take the documented defaults") {
  const proto::ScheduleConfig d = ScheduleWithDefaults(proto::ScheduleConfig());
  CHECK(d.type() == "constant");
  CHECK(d.unit() == "epoch");
  CHECK(d.has_gamma());
  CHECK(d.gamma() == 0.1);
  CHECK(d.has_warmup_start_factor());
  CHECK(d.warmup_start_factor() == 1.0 / 3.0);
  CHECK_FALSE(d.has_step_size());
  CHECK_FALSE(d.has_t_max());
  CHECK_FALSE(d.has_eta_min());
  CHECK_FALSE(d.has_warmup_steps());
  CHECK(d.milestones_size() == 0);

  // Set fields are kept, zeros included.
  proto::ScheduleConfig set;
  set.set_type("step");
  set.set_unit("step");
  set.set_gamma(0);
  set.set_warmup_start_factor(0.5);
  const proto::ScheduleConfig kept = ScheduleWithDefaults(set);
  CHECK(kept.type() == "step");
  CHECK(kept.unit() == "step");
  CHECK(kept.gamma() == 0);
  CHECK(kept.warmup_start_factor() == 0.5);

  // MakeSchedule applies them: an empty config is constant, a step or
  // exponential schedule without gamma decays by 0.1, a warm-up without a
  // start factor starts at base_lr / 3.
  CHECK(Make(proto::ScheduleConfig(), 0.1)->ToString() == "constant(0.1)");
  proto::ScheduleConfig c;
  c.set_step_size(2);
  c.set_type("step");
  CheckValues(*Make(c, 1.0), {{0, 1.0}, {2, 0.1}, {4, 0.01}});
  c = proto::ScheduleConfig();
  c.set_type("exponential");
  CheckValues(*Make(c, 1.0), {{0, 1.0}, {1, 0.1}, {2, 0.01}});
  c = proto::ScheduleConfig();
  c.set_warmup_steps(2);  // type unset: constant after the warm-up
  CheckValues(*Make(c, 0.9), {{0, 0.3}, {1, 0.6}, {2, 0.9}, {50, 0.9}});
  CHECK(Make(c, 0.9)->ToString() == StrCat("linear warm-up(2 updates from ", 1.0 / 3.0, ") then constant(0.9)"));
  // An unset type names the default in errors.
  c.set_warmup_steps(-1);
  auto bad = MakeSchedule(c, 0.1);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "constant schedule: warmup_steps must be >= 0, got -1");
}

TEST_CASE("bad schedule configs are rejected with what is wrong") {
  auto error = [](const proto::ScheduleConfig& c, double base_lr = 0.1) {
    auto s = MakeSchedule(c, base_lr);
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == StatusCode::kInvalidArgument);
    return s.status().message();
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  proto::ScheduleConfig c;
  CHECK(error(c, -0.1) == "the base learning rate must be >= 0 and finite, got -0.1");
  CHECK(error(c, nan) == "the base learning rate must be >= 0 and finite, got nan");
  c.set_type("cosin");
  CHECK(error(c) == "unknown schedule 'cosin' (expected constant, step, multistep, exponential, cosine or warmup)");

  c = proto::ScheduleConfig();
  c.set_type("step");
  CHECK(error(c) == "step schedule: step_size must be >= 1 update, got 0");
  c.set_step_size(-5);
  CHECK(error(c) == "step schedule: step_size must be >= 1 update, got -5");
  c.set_step_size(5);
  c.set_gamma(0);
  CHECK(error(c) == "step schedule: gamma must be > 0 and finite, got 0");
  c.set_gamma(-0.5);
  CHECK(error(c) == "step schedule: gamma must be > 0 and finite, got -0.5");

  c = proto::ScheduleConfig();
  c.set_type("multistep");
  CHECK(error(c) == "multistep schedule: milestones must not be empty");
  SetMilestones(&c, {30, 10});
  CHECK(error(c) == "multistep schedule: milestones must be strictly increasing, got 30 then 10");
  SetMilestones(&c, {10, 10});
  CHECK(error(c) == "multistep schedule: milestones must be strictly increasing, got 10 then 10");
  SetMilestones(&c, {-3, 10});
  CHECK(error(c) == "multistep schedule: milestones must be >= 1 update, got -3");
  SetMilestones(&c, {10, 30});
  c.set_gamma(nan);
  CHECK(error(c) == "multistep schedule: gamma must be > 0 and finite, got nan");

  c = proto::ScheduleConfig();
  c.set_type("exponential");
  c.set_gamma(std::numeric_limits<double>::infinity());
  CHECK(error(c) == "exponential schedule: gamma must be > 0 and finite, got inf");

  c = proto::ScheduleConfig();
  c.set_type("cosine");
  CHECK(error(c) == "cosine schedule: t_max must be >= 1 update, got 0");
  c.set_t_max(100);
  c.set_eta_min(-1e-3);
  CHECK(error(c) == "cosine schedule: eta_min must be >= 0 and finite, got -0.001");
  c.set_eta_min(0);
  c.set_warmup_steps(-10);
  CHECK(error(c) == "cosine schedule: warmup_steps must be >= 0, got -10");
  c.set_warmup_steps(10);
  c.set_warmup_start_factor(0);
  CHECK(error(c) == "cosine schedule: warmup_start_factor must be in (0, 1], got 0");
  c.set_warmup_start_factor(1.5);
  CHECK(error(c) == "cosine schedule: warmup_start_factor must be in (0, 1], got 1.5");

  c = proto::ScheduleConfig();
  c.set_type("warmup");
  CHECK(error(c) == "warmup schedule: warmup_steps must be >= 1 update, got 0");
}

}  // namespace
}  // namespace loom
