#include "train/sweep/sweep.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/file_util.h"
#include "core/parse.h"
#include "core/text_proto.h"
#include "train/checkpoint/run_dir.h"
#include "train/config/replicas.h"
#include "train/config/train_config.h"
#include "train/metrics/event_writer.h"
#include "train/metrics/metrics_jsonl.h"
#include "train/metrics/progress.h"
#include "train/replica_plan.h"
#include "train/sweep/hparams.pb.h"
#include "train/stop_signals.h"
#include "train/training_loop.h"

namespace loom::sweep {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::vector<Bracket> PlanBrackets(const proto::SweepSpec& spec) {
  const int64_t R = spec.max_resource(), r = spec.min_resource(), eta = spec.eta();
  std::vector<Bracket> iteration;
  if (spec.algorithm() == "random") {
    iteration.push_back({0, spec.trials(), {R}});
  } else if (spec.algorithm() == "asha") {
    // One bracket of every trial: rungs at r, r eta, r eta^2, ... and R.
    Bracket b{0, spec.trials(), {}};
    for (int64_t e = r; e < R; e *= eta) b.rung_epochs.push_back(e);
    b.rung_epochs.push_back(R);
    iteration.push_back(b);
  } else {
    int64_t s_max = 0;
    for (int64_t e = eta; r * e <= R; e *= eta) ++s_max;
    for (int64_t s = s_max; s >= 0; --s) {
      int64_t eta_s = 1;
      for (int64_t i = 0; i < s; ++i) eta_s *= eta;
      Bracket b;
      b.n = (s_max + 1) * eta_s / (s + 1) + ((s_max + 1) * eta_s % (s + 1) != 0 ? 1 : 0);
      for (int64_t i = 0; i <= s; ++i) {
        double epochs = static_cast<double>(R);
        for (int64_t k = i; k < s; ++k) epochs /= static_cast<double>(eta);
        int64_t e = std::max<int64_t>(1, std::llround(epochs));
        if (!b.rung_epochs.empty()) e = std::max(e, b.rung_epochs.back() + 1);
        b.rung_epochs.push_back(std::min(e, R));
      }
      iteration.push_back(b);
    }
  }
  int64_t total = spec.trials();
  if (total == 0)
    for (const Bracket& b : iteration) total += b.n;
  std::vector<Bracket> out;
  int64_t next = 0;
  while (next < total) {
    for (Bracket b : iteration) {
      if (next >= total) break;
      b.first_trial = next;
      b.n = std::min(b.n, total - next);
      next += b.n;
      out.push_back(b);
    }
  }
  return out;
}

double Quantile(std::vector<double> values, double q) {
  values.erase(std::remove_if(values.begin(), values.end(), [](double v) { return !std::isfinite(v); }), values.end());
  if (values.empty()) return -INFINITY;
  std::sort(values.begin(), values.end());
  const double pos = q * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = static_cast<size_t>(std::ceil(pos));
  return values[lo] + (values[hi] - values[lo]) * (pos - static_cast<double>(lo));
}

namespace {

// One fused array (or one trial alone): an ordinary run folder.
struct Array {
  std::string name;     // "b0-a1"
  std::string folder;   // out/arrays/b0-a1
  std::vector<int64_t> trials;  // ids, in replica order
  proto::TrainConfig config;
  bool fused() const { return trials.size() > 1; }
};

struct TrialState {
  Trial trial;
  int64_t bracket = -1;
  std::string array;
  int64_t replica = 0;                 // its row index in the array's config order
  std::map<int64_t, double> rung_metric;  // epoch -> metric
  std::string status = "pending";
  int64_t epochs = 0;  // the bracket's last rung: its config's epochs
};

double Metric(const metrics::MetricsRecord& r, const std::string& metric) {
  if (metric == "test_loss") return r.loss;
  return r.accuracy ? *r.accuracy : NAN;
}

// Higher is better after this: NaN (diverged, missing) ranks last.
double Score(double metric, const std::string& direction) {
  if (std::isnan(metric)) return -INFINITY;
  return direction == "max" ? metric : -metric;
}

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

class Sweep {
 public:
  explicit Sweep(const SweepOptions& options) : opt_(options), spec_(opt_.input.spec) {}

  StatusOr<SweepResult> Run();

 private:
  Status Prepare();
  Status PlanArrays();
  StatusOr<int64_t> Capacity(const Trial& t);
  Status RunBracket(size_t b);
  // ASHA's bracket: its arrays one after another, each through every rung.
  Status RunAsha(size_t b);
  // Whether array `a` may begin: false once the budget is spent (its
  // trials are then marked not run).
  StatusOr<bool> MayBegin(const Array& a);
  // Trains `a` to `epoch` after stopping its trials that left the bracket.
  Status Advance(const Array& a, int64_t epoch, const std::set<int64_t>& alive);
  // The test records of an array's metrics.jsonl by (replica, epoch).
  StatusOr<std::map<std::pair<int64_t, int64_t>, metrics::MetricsRecord>> TestRecords(const Array& a) const;
  Status RecordRung(const Array& a, int64_t epoch, const std::set<int64_t>& alive);
  Status SaveState();
  // The trial's session for TensorBoard's HParams view, beside its scalars.
  Status WriteHParams(const TrialState& t);
  Status WriteRecords();
  std::vector<TrialResult> Leaderboard() const;
  std::string LeaderboardText() const;
  double Elapsed() const {
    return state_.elapsed_s() + std::chrono::duration<double>(Clock::now() - start_).count();
  }
  void Say(const std::string& line) {
    if (opt_.console) {
      std::fprintf(opt_.console, "%s\n", line.c_str());
      std::fflush(opt_.console);
    }
  }

  SweepOptions opt_;
  const proto::SweepSpec& spec_;
  std::vector<Bracket> brackets_;
  std::vector<TrialState> trials_;
  std::vector<std::vector<Array>> arrays_;  // per bracket
  std::map<std::string, int64_t> capacity_;  // packing key -> trials per array
  proto::SweepState state_;
  Clock::time_point start_ = Clock::now();
  int stop_signal_ = 0;  // SIGINT or SIGTERM received: the sweep stops
};

StatusOr<int64_t> Sweep::Capacity(const Trial& t) {
  if (!opt_.packing) return 1;
  auto it = capacity_.find(t.packing_key);
  if (it != capacity_.end()) return it->second;
  uint64_t memory = train::PhysicalMemory();
  if (!spec_.memory().empty()) {
    LOOM_ASSIGN_OR_RETURN(memory, train::ParseMemorySize(spec_.memory(), StrCat(opt_.input.origin, ": field memory")));
  }
  if (memory == 0) return FailedPrecondition("cannot read this machine's physical memory; give the sweep a memory: size");
  // The most trials of this key in any bracket bounds the search.
  int64_t most = 1;
  for (const Bracket& b : brackets_) {
    int64_t same = 0;
    for (int64_t i = b.first_trial; i < b.first_trial + b.n; ++i) same += trials_[i].trial.packing_key == t.packing_key;
    most = std::max(most, same);
  }
  proto::TrainConfig c = t.config;
  c.mutable_fusion()->set_per_replica_data_order(true);
  auto plan = train::PlanReplicas(c, memory, Device::Cpu(), std::min(most, spec_.max_array()), /*with_eval=*/true);
  if (!plan.ok()) return plan.status().WithContext(StrCat(opt_.input.origin, ": trial ", t.label));
  if (plan->largest_fitting == 0)
    return InvalidArgument(opt_.input.origin, ": trial ", t.label, ": not even one trial fits in ", memory,
                           " bytes by the memory plan (loom plan --with-eval)");
  capacity_[t.packing_key] = plan->largest_fitting;
  return plan->largest_fitting;
}

Status Sweep::PlanArrays() {
  arrays_.assign(brackets_.size(), {});
  for (size_t b = 0; b < brackets_.size(); ++b) {
    const Bracket& br = brackets_[b];
    // Groups of equal non-fusible values, in the order of their first trial.
    std::vector<std::string> keys;
    std::map<std::string, std::vector<int64_t>> groups;
    for (int64_t i = br.first_trial; i < br.first_trial + br.n; ++i) {
      const std::string& key = trials_[i].trial.packing_key;
      if (!groups.count(key)) keys.push_back(key);
      groups[key].push_back(i);
    }
    for (const std::string& key : keys) {
      const std::vector<int64_t>& ids = groups[key];
      LOOM_ASSIGN_OR_RETURN(const int64_t cap, Capacity(trials_[ids[0]].trial));
      for (size_t begin = 0; begin < ids.size(); begin += static_cast<size_t>(cap)) {
        Array a;
        a.name = StrCat("b", b, "-a", arrays_[b].size());
        a.folder = (fs::path(opt_.out_dir) / "arrays" / a.name).string();
        a.trials.assign(ids.begin() + static_cast<std::ptrdiff_t>(begin),
                        ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), begin + static_cast<size_t>(cap))));
        const int64_t epochs = br.rung_epochs.back();
        a.config = trials_[a.trials[0]].trial.config;
        a.config.set_epochs(epochs);
        a.config.set_out_dir(a.folder);
        if (a.fused()) {
          // Each replica trains as its trial would alone: its own optimizer
          // and schedule numbers, seed and data order.
          a.config.mutable_fusion()->set_per_replica_data_order(true);
          a.config.mutable_fusion()->clear_early_stop();
          for (int64_t id : a.trials) {
            proto::ReplicaConfig* r = a.config.add_replicas();
            r->set_name(StrCat("t", id));
            *r->mutable_optimizer() = trials_[id].trial.config.optimizer();
            *r->mutable_schedule() = trials_[id].trial.config.schedule();
            r->set_seed(trials_[id].trial.config.seed());
          }
          // The array's replicas must be the trials (what `loom export`
          // gives back is the trial's own config).
          LOOM_ASSIGN_OR_RETURN(const std::vector<ReplicaSpec> specs, ExpandReplicas(a.config));
          for (size_t k = 0; k < specs.size(); ++k) {
            proto::TrainConfig want = trials_[a.trials[k]].trial.config;
            want.set_epochs(epochs);
            proto::TrainConfig got = specs[k].config;
            want.clear_fusion();  // the array's own block
            got.clear_fusion();
            if (std::string diff = RunDifferences(want, got); !diff.empty())
              return Internal("array ", a.name, ": replica ", k, " is not trial ", a.trials[k], ": ", diff);
          }
          FillDefaults(&a.config);
        }
        for (size_t k = 0; k < a.trials.size(); ++k) {
          TrialState& t = trials_[a.trials[k]];
          t.bracket = static_cast<int64_t>(b);
          t.array = a.name;
          t.replica = a.fused() ? static_cast<int64_t>(k) : 0;
          t.epochs = epochs;
        }
        arrays_[b].push_back(std::move(a));
      }
    }
  }
  return Status::Ok();
}

Status Sweep::Prepare() {
  if (spec_.algorithm() != "hyperband" && spec_.trials() == 0)
    return InvalidArgument(opt_.input.origin, ": ", spec_.algorithm(),
                           " needs a number of trials (trials: N in the file, or --trials N)");
  brackets_ = PlanBrackets(spec_);
  int64_t total = 0;
  for (const Bracket& b : brackets_) total += b.n;
  for (int64_t id = 0; id < total; ++id) {
    LOOM_ASSIGN_OR_RETURN(Trial t, DrawTrial(opt_.input, id));
    TrialState s;
    s.trial = std::move(t);
    trials_.push_back(std::move(s));
  }
  LOOM_RETURN_IF_ERROR(PlanArrays());

  const fs::path out = opt_.out_dir;
  const fs::path saved = out / "sweep.pbtxt";
  if (opt_.resume) {
    if (!fs::exists(saved)) return NotFound(opt_.out_dir, " holds no sweep to resume (no sweep.pbtxt)");
    const fs::path state = out / "sweep_state.pbtxt";
    if (fs::exists(state)) {
      LOOM_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(state.string(), "sweep state"));
      LOOM_RETURN_IF_ERROR(ParseTextProto(text, state.string(), &state_).status());
    }
  } else {
    std::error_code ec;
    if (fs::exists(out) && !fs::is_empty(out, ec))
      return FailedPrecondition(opt_.out_dir, " is not empty; resume a sweep there with loom sweep --resume ", opt_.out_dir,
                           " or choose another --out");
    fs::create_directories(out / "arrays", ec);
    if (ec) return Internal("cannot create ", (out / "arrays").string(), ": ", ec.message());
    std::string text;
    google::protobuf::TextFormat::PrintToString(spec_, &text);
    LOOM_RETURN_IF_ERROR(WriteFileAtomically(saved.string(), text));
  }
  return Status::Ok();
}

StatusOr<std::map<std::pair<int64_t, int64_t>, metrics::MetricsRecord>> Sweep::TestRecords(const Array& a) const {
  std::map<std::pair<int64_t, int64_t>, metrics::MetricsRecord> out;
  const std::string path = (fs::path(a.folder) / "metrics.jsonl").string();
  if (!fs::exists(path)) return out;
  LOOM_ASSIGN_OR_RETURN(const std::vector<metrics::MetricsRecord> records, metrics::ReadMetricsFile(path));
  for (const metrics::MetricsRecord& r : records)
    if (r.split == metrics::Split::kTest) out[{r.replica, r.epoch}] = r;
  return out;
}

Status Sweep::Advance(const Array& a, int64_t epoch, const std::set<int64_t>& alive) {
  if (const int signal = train::StopSignals::Received(); signal != 0) {
    stop_signal_ = signal;
    return Status::Ok();
  }
  // Done already (a resumed sweep): every running trial has its record.
  LOOM_ASSIGN_OR_RETURN(auto records, TestRecords(a));
  bool have_all = true;
  for (int64_t id : a.trials)
    if (alive.count(id) && !records.count({trials_[id].replica, epoch})) have_all = false;
  if (have_all) return Status::Ok();

  const Clock::time_point began = Clock::now();
  train::LoopOptions lo;
  lo.config = a.config;
  lo.resume = fs::exists(fs::path(a.folder) / "config.pbtxt");
  lo.console = nullptr;
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<train::TrainingLoop> loop, train::TrainingLoop::Open(std::move(lo)));
  const int64_t epoch_before = loop->epoch();
  // Trains the array to `target` epochs; false when the sweep ends here (a
  // signal: the array checkpointed first) or every trial diverged.
  auto train_to = [&](int64_t target) -> StatusOr<bool> {
    while (loop->epoch() < target && !loop->done()) {
      Status trained = loop->Step().status();
      if (trained.ok()) {
        // SIGINT or SIGTERM: the array's checkpoint now, then the sweep ends
        // (loom sweep --resume goes on from here).
        if (const int signal = train::StopSignals::Received(); signal != 0) {
          LOOM_RETURN_IF_ERROR(loop->SaveCheckpoint());
          stop_signal_ = signal;
          return false;
        }
        continue;
      }
      // Every trial of the array diverged: a result of the search (they rank
      // last), not a failure of the sweep. Any other error is one.
      bool all_diverged = true;
      for (const train::Replica& r : loop->replicas())
        all_diverged = all_diverged && (a.fused() ? r.status != "running" : !std::isfinite(r.train_loss));
      if (!all_diverged) return trained;
      Say(StrCat("  array ", a.name, ": ", trained.message()));
      return false;
    }
    return true;
  };
  if (a.fused()) {
    // Nothing left to train (the trials still in the bracket diverged):
    // leave the array as it is rather than stop its last replica.
    int64_t trainable = 0;
    for (size_t k = 0; k < a.trials.size(); ++k)
      trainable += alive.count(a.trials[k]) && loop->replicas()[k].status == "running";
    if (trainable == 0) return Status::Ok();
    // The trials the bracket dropped leave the array at the epoch of the
    // rung that dropped them (their state then is what `loom export`
    // gives). An array resumed from an earlier checkpoint (the sweep was
    // killed after a rung's records, before the array's next checkpoint)
    // trains to each such epoch again first.
    std::map<int64_t, std::vector<int64_t>> stop_at;  // epoch -> positions
    for (size_t k = 0; k < a.trials.size(); ++k) {
      if (alive.count(a.trials[k]) || loop->replicas()[k].status != "running") continue;
      const std::map<int64_t, double>& rungs = trials_[a.trials[k]].rung_metric;
      stop_at[rungs.empty() ? 0 : rungs.rbegin()->first].push_back(static_cast<int64_t>(k));
    }
    for (const auto& [at, positions] : stop_at) {
      LOOM_ASSIGN_OR_RETURN(const bool go_on, train_to(at));
      if (!go_on) return Status::Ok();
      LOOM_RETURN_IF_ERROR(
          loop->StopReplicas(positions, StrCat("stopped by the sweep (rung at epoch ", loop->epoch(), ")")));
    }
  }
  LOOM_ASSIGN_OR_RETURN(const bool trained_to_rung, train_to(epoch));
  if (!trained_to_rung && stop_signal_ != 0) return Status::Ok();
  int64_t running = 0;
  for (int64_t id : a.trials) running += alive.count(id);
  Say(StrCat("  array ", a.name, ": ", running, running == 1 ? " trial" : " trials", ", epochs ", epoch_before, " -> ",
             loop->epoch(), " in ", metrics::FormatDuration(std::chrono::duration<double>(Clock::now() - began).count())));
  return Status::Ok();
}

StatusOr<bool> Sweep::MayBegin(const Array& a) {
  // The budget: an array not begun yet does not begin once it is spent.
  const bool begun = fs::exists(fs::path(a.folder) / "config.pbtxt");
  if (begun || spec_.budget_s() <= 0 || (!state_.budget_spent() && Elapsed() < spec_.budget_s())) return true;
  if (!state_.budget_spent()) {
    state_.set_budget_spent(true);
    LOOM_RETURN_IF_ERROR(SaveState());
    Say(StrCat("the budget of ", metrics::FormatDuration(spec_.budget_s()), " is spent: no new array starts"));
  }
  for (int64_t id : a.trials) trials_[id].status = "not run (budget)";
  return false;
}

// The rung metrics of an array's running trials at `epoch`, recorded on
// the trials; NaN for one with no record (it diverged).
Status Sweep::RecordRung(const Array& a, int64_t epoch, const std::set<int64_t>& alive) {
  LOOM_ASSIGN_OR_RETURN(auto records, TestRecords(a));
  for (int64_t id : a.trials) {
    if (!alive.count(id)) continue;
    auto it = records.find({trials_[id].replica, epoch});
    trials_[id].rung_metric[epoch] = it == records.end() ? NAN : Metric(it->second, spec_.metric());
    trials_[id].status = "running";
  }
  state_.set_elapsed_s(Elapsed());
  start_ = Clock::now();
  return SaveState();
}

Status Sweep::RunAsha(size_t b) {
  const Bracket& br = brackets_[b];
  // Every rung's results so far, as scores (higher is better), over the
  // arrays already run: a trial goes on past a rung when its score is not
  // below the (1 - 1/eta) quantile of them (Ray Tune's ASHA rule).
  std::map<int64_t, std::vector<double>> recorded;
  for (const Array& a : arrays_[b]) {
    LOOM_ASSIGN_OR_RETURN(const bool begin, MayBegin(a));
    if (!begin) continue;
    std::set<int64_t> alive(a.trials.begin(), a.trials.end());
    for (size_t i = 0; i < br.rung_epochs.size() && !alive.empty(); ++i) {
      const int64_t epoch = br.rung_epochs[i];
      Say(StrCat("asha rung ", i, ": array ", a.name, ", ", alive.size(), alive.size() == 1 ? " trial" : " trials",
                 " to epoch ", epoch));
      LOOM_RETURN_IF_ERROR(Advance(a, epoch, alive));
      if (stop_signal_ != 0) return Status::Ok();
      LOOM_RETURN_IF_ERROR(RecordRung(a, epoch, alive));
      std::vector<double>& scores = recorded[epoch];
      for (int64_t id : alive) scores.push_back(Score(trials_[id].rung_metric[epoch], spec_.direction()));
      const bool last = i + 1 == br.rung_epochs.size();
      const double cutoff = Quantile(scores, 1.0 - 1.0 / static_cast<double>(spec_.eta()));
      for (auto it = alive.begin(); it != alive.end();) {
        TrialState& t = trials_[*it];
        if (std::isnan(t.rung_metric[epoch])) {
          t.status = StrCat("diverged (no result at epoch ", epoch, ")");
          it = alive.erase(it);
        } else if (last) {
          t.status = "finished";
          ++it;
        } else if (Score(t.rung_metric[epoch], spec_.direction()) < cutoff) {
          t.status = StrCat("stopped at rung ", i, " (epoch ", epoch, ")");
          it = alive.erase(it);
        } else {
          ++it;
        }
      }
      LOOM_RETURN_IF_ERROR(WriteRecords());
      Say(LeaderboardText());
    }
  }
  return Status::Ok();
}

Status Sweep::RunBracket(size_t b) {
  const Bracket& br = brackets_[b];
  if (spec_.algorithm() == "asha") return RunAsha(b);
  std::set<int64_t> alive;
  for (const Array& a : arrays_[b]) {
    LOOM_ASSIGN_OR_RETURN(const bool begin, MayBegin(a));
    if (begin)
      for (int64_t id : a.trials) alive.insert(id);
  }
  if (alive.empty()) return Status::Ok();
  for (size_t i = 0; i < br.rung_epochs.size(); ++i) {
    const int64_t epoch = br.rung_epochs[i];
    Say(StrCat("bracket ", b, " rung ", i, ": ", alive.size(), alive.size() == 1 ? " trial" : " trials", " to epoch ",
               epoch));
    for (const Array& a : arrays_[b]) {
      bool any = false;
      for (int64_t id : a.trials) any = any || alive.count(id);
      if (!any) continue;
      LOOM_RETURN_IF_ERROR(Advance(a, epoch, alive));
      if (stop_signal_ != 0) return Status::Ok();
      LOOM_RETURN_IF_ERROR(RecordRung(a, epoch, alive));
    }
    // The best floor(n / eta) go on (at least one); ties: the lower id.
    std::vector<int64_t> order(alive.begin(), alive.end());
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
      return Score(trials_[x].rung_metric[epoch], spec_.direction()) >
             Score(trials_[y].rung_metric[epoch], spec_.direction());
    });
    const bool last = i + 1 == br.rung_epochs.size();
    const size_t keep = last ? order.size() : std::max<size_t>(1, order.size() / static_cast<size_t>(spec_.eta()));
    for (size_t k = 0; k < order.size(); ++k) {
      TrialState& t = trials_[order[k]];
      if (std::isnan(t.rung_metric[epoch])) {
        t.status = StrCat("diverged (no result at epoch ", epoch, ")");
        alive.erase(order[k]);
      } else if (last) {
        t.status = "finished";
      } else if (k >= keep) {
        t.status = StrCat("stopped at rung ", i, " (epoch ", epoch, ")");
        alive.erase(order[k]);
      }
    }
    LOOM_RETURN_IF_ERROR(WriteRecords());
    Say(LeaderboardText());
  }
  return Status::Ok();
}

Status Sweep::SaveState() {
  std::string text;
  google::protobuf::TextFormat::PrintToString(state_, &text);
  return WriteFileAtomically((fs::path(opt_.out_dir) / "sweep_state.pbtxt").string(), text);
}

std::vector<TrialResult> Sweep::Leaderboard() const {
  std::vector<TrialResult> rows;
  for (const TrialState& t : trials_) {
    if (t.rung_metric.empty()) continue;
    TrialResult r;
    r.id = t.trial.id;
    r.label = t.trial.label;
    r.epochs = t.rung_metric.rbegin()->first;
    r.metric = t.rung_metric.rbegin()->second;
    r.status = t.status;
    rows.push_back(r);
  }
  // Best metric first; among equals, more epochs, then the lower id.
  std::stable_sort(rows.begin(), rows.end(), [&](const TrialResult& x, const TrialResult& y) {
    const double sx = Score(x.metric, spec_.direction()), sy = Score(y.metric, spec_.direction());
    if (sx != sy) return sx > sy;
    return x.epochs > y.epochs;
  });
  return rows;
}

std::string Sweep::LeaderboardText() const {
  const std::vector<TrialResult> rows = Leaderboard();
  int64_t done = 0;
  for (const TrialState& t : trials_) done += !t.rung_metric.empty();
  std::string out = StrCat("leaderboard (", spec_.metric(), ", ", spec_.direction() == "max" ? "higher" : "lower",
                           " is better; ", done, " of ", trials_.size(), " trials reported):\n");
  char line[512];
  std::snprintf(line, sizeof line, "%5s  %-8s %6s  %13s  %-28s  %s\n", "rank", "array", "epochs", spec_.metric().c_str(),
                "status", "trial");
  out += line;
  for (size_t i = 0; i < rows.size(); ++i) {
    const TrialResult& r = rows[i];
    std::snprintf(line, sizeof line, "%5zu  %-8s %6lld  %13.4f  %-28s  %s\n", i + 1, trials_[r.id].array.c_str(),
                  static_cast<long long>(r.epochs), r.metric, r.status.c_str(), r.label.c_str());
    out += line;
  }
  return out;
}

Status Sweep::WriteHParams(const TrialState& t) {
  const Array* array = nullptr;
  for (const auto& arrays : arrays_)
    for (const Array& a : arrays)
      if (a.name == t.array) array = &a;
  if (array == nullptr || !array->config.tensorboard()) return Status::Ok();
  const std::string dir = array->fused() ? metrics::ReplicaEventDir(array->folder, t.replica) : array->folder;
  // One file per trial under a fixed name, written once: a resumed sweep
  // does not add a second session.
  const fs::path path = fs::path(dir) / "events.out.tfevents.0000000000.hparams";
  if (fs::exists(path)) return Status::Ok();
  metrics::tb::hparams::HParamsPluginData data;
  metrics::tb::hparams::SessionStartInfo* session = data.mutable_session_start_info();
  session->set_start_time_secs(metrics::WallTimeNow());
  for (int j = 0; j < spec_.param_size(); ++j) {
    const std::string& text = t.trial.values[j];
    metrics::tb::hparams::Value& v = (*session->mutable_hparams())[spec_.param(j).field()];
    char* end = nullptr;
    const double number = std::strtod(text.c_str(), &end);
    if (!text.empty() && end != nullptr && *end == '\0') {
      v.set_number_value(number);
    } else if (text == "true" || text == "false") {
      v.set_bool_value(text == "true");
    } else {
      v.set_string_value(text);
    }
  }
  metrics::tb::Event version;
  version.set_wall_time(metrics::WallTimeNow());
  version.set_file_version(metrics::kEventFileVersion);
  metrics::tb::Event event;
  event.set_wall_time(metrics::WallTimeNow());
  metrics::tb::Summary::Value* value = event.mutable_summary()->add_value();
  value->set_tag("_hparams_/session_start_info");
  value->mutable_metadata()->mutable_plugin_data()->set_plugin_name("hparams");
  value->mutable_metadata()->mutable_plugin_data()->set_content(data.SerializeAsString());
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Internal("cannot create ", dir, ": ", ec.message());
  return WriteFileAtomically(path.string(), metrics::FrameRecord(version.SerializeAsString()) +
                                                metrics::FrameRecord(event.SerializeAsString()));
}

// trials.jsonl, leaderboard.txt and each trial's folder, each written
// atomically; all of it is a function of the arrays' records.
Status Sweep::WriteRecords() {
  std::string jsonl;
  for (const TrialState& t : trials_) {
    if (t.bracket < 0) continue;
    const fs::path dir = fs::path(opt_.out_dir) / "trials" / StrCat("t", t.trial.id);
    const fs::path array = fs::path(opt_.out_dir) / "arrays" / t.array;
    std::string params = "{";
    for (int j = 0; j < spec_.param_size(); ++j)
      params += StrCat(j ? ", " : "", JsonQuoted(spec_.param(j).field()), ": ", JsonQuoted(t.trial.values[j]));
    params += "}";
    std::string rungs = "{";
    for (const auto& [epoch, m] : t.rung_metric) rungs += StrCat(rungs.size() > 1 ? ", " : "", "\"", epoch, "\": ", JsonNumber(m));
    rungs += "}";
    std::string checkpoint;
    if (fs::exists(array)) {
      LOOM_ASSIGN_OR_RETURN(const std::vector<CheckpointFile> files, ListCheckpoints(array.string()));
      if (!files.empty()) checkpoint = files.back().path;
    }
    const bool fused = trials_.size() > 0 && [&] {
      for (const auto& arrays : arrays_)
        for (const Array& a : arrays)
          if (a.name == t.array) return a.fused();
      return false;
    }();
    std::string exported;
    if (!checkpoint.empty())
      exported = fused ? StrCat("loom export --checkpoint ", checkpoint, " --replica ", t.replica, " --out t", t.trial.id, ".loom")
                       : checkpoint;
    jsonl += StrCat("{\"trial\": ", t.trial.id, ", \"label\": ", JsonQuoted(t.trial.label), ", \"params\": ", params,
                    ", \"bracket\": ", t.bracket, ", \"array\": ", JsonQuoted(t.array), ", \"replica\": ", t.replica,
                    ", \"max_epochs\": ", t.epochs, ", \"rungs\": ", rungs, ", \"status\": ", JsonQuoted(t.status),
                    ", \"checkpoint\": ", JsonQuoted(exported), "}\n");
    // The trial alone: `loom train --config trials/t<id>/config.pbtxt`
    // trains it as the array did (the fused == separate test does).
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return Internal("cannot create ", dir.string(), ": ", ec.message());
    proto::TrainConfig alone = t.trial.config;
    alone.set_epochs(t.epochs);
    alone.clear_out_dir();
    LOOM_RETURN_IF_ERROR(WriteFileAtomically((dir / "config.pbtxt").string(), TrainConfigToText(alone)));
    std::string lines;
    const fs::path metrics_path = array / "metrics.jsonl";
    if (fs::exists(metrics_path)) {
      std::ifstream in(metrics_path);
      const std::string prefix = StrCat("{\"replica\":", t.replica, ",");
      for (std::string line; std::getline(in, line);)
        if (line.rfind(prefix, 0) == 0) lines += line + "\n";
    }
    LOOM_RETURN_IF_ERROR(WriteFileAtomically((dir / "metrics.jsonl").string(), lines));
    if (!t.rung_metric.empty()) LOOM_RETURN_IF_ERROR(WriteHParams(t));
  }
  LOOM_RETURN_IF_ERROR(WriteFileAtomically((fs::path(opt_.out_dir) / "trials.jsonl").string(), jsonl));
  return WriteFileAtomically((fs::path(opt_.out_dir) / "leaderboard.txt").string(), LeaderboardText());
}

StatusOr<SweepResult> Sweep::Run() {
  const Clock::time_point began = Clock::now();
  LOOM_RETURN_IF_ERROR(Prepare());
  size_t arrays = 0;
  for (const auto& a : arrays_) arrays += a.size();
  Say(StrCat("sweep ", opt_.out_dir, ": ", spec_.algorithm(), ", ", trials_.size(), " trials in ", brackets_.size(),
             brackets_.size() == 1 ? " bracket" : " brackets", ", ", arrays, arrays == 1 ? " array" : " arrays",
             opt_.packing ? " (packed by the memory plan)" : " (one trial per array: --no-packing)",
             opt_.resume ? ", resumed" : ""));
  for (size_t b = 0; b < brackets_.size(); ++b) {
    std::string shape;
    for (int64_t e : brackets_[b].rung_epochs) shape += StrCat(shape.empty() ? "" : ", ", e);
    std::string sizes;
    for (const Array& a : arrays_[b]) sizes += StrCat(sizes.empty() ? "" : " ", a.trials.size());
    Say(StrCat("  bracket ", b, ": trials ", brackets_[b].first_trial, "-", brackets_[b].first_trial + brackets_[b].n - 1,
               ", rungs at epochs ", shape, "; arrays of ", sizes));
  }
  train::StopSignals signals;
  for (size_t b = 0; b < brackets_.size() && stop_signal_ == 0; ++b) LOOM_RETURN_IF_ERROR(RunBracket(b));
  state_.set_elapsed_s(Elapsed());
  start_ = Clock::now();
  LOOM_RETURN_IF_ERROR(SaveState());
  SweepResult result;
  if (stop_signal_ != 0) {
    result.stop_signal = stop_signal_;
    Say(StrCat("stopped by ", train::StopSignals::Name(stop_signal_),
               "; the array in progress is checkpointed: resume with loom sweep --resume ", opt_.out_dir));
    return result;
  }
  LOOM_RETURN_IF_ERROR(WriteRecords());
  result.leaderboard = Leaderboard();
  result.seconds = std::chrono::duration<double>(Clock::now() - began).count();
  Say(StrCat("sweep done in ", metrics::FormatDuration(result.seconds), " (", metrics::FormatDuration(state_.elapsed_s()),
             " over all its processes)"));
  if (!result.leaderboard.empty()) {
    const TrialResult& best = result.leaderboard.front();
    Say(StrCat("best: ", best.label, ": ", spec_.metric(), " ", best.metric, " after ", best.epochs, " epochs (",
               (fs::path(opt_.out_dir) / "trials" / StrCat("t", best.id)).string(), ")"));
  }
  return result;
}

}  // namespace

StatusOr<SweepResult> RunSweep(const SweepOptions& options) {
  Sweep sweep(options);
  return sweep.Run();
}

}  // namespace loom::sweep
