#include "train/sweep/sweep_space.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "train/sweep/sweep.h"

namespace loom::sweep {
namespace {

// A sweep over an inline base config (no file to find).
const char kBase[] = R"(train {
  model { name: "mlp" args { key: "hidden" value: "32" } }
  data { dataset: "fashion_mnist" batch_size: 64 }
  optimizer { type: "sgd" lr: 0.05 momentum: 0.9 }
  epochs: 9
  seed: 100
}
algorithm: "hyperband"
)";

std::string Error(const std::string& params) {
  auto s = ParseSweep(std::string(kBase) + params, "sweep.pbtxt", "");
  REQUIRE_FALSE(s.ok());
  return s.status().message();
}

TEST_CASE("bad space definitions name the file, the line and the param") {
  // kBase has 8 lines; the param block is line 9.
  CHECK(Error("param { field: \"optimizer.lr\" min: 0.5 max: 0.1 }") ==
        "sweep.pbtxt:9: field param[0].max: empty range: [0.5, 0.1) holds nothing");
  CHECK(Error("param { field: \"optimizer.lr\" distribution: \"log_uniform\" min: -1 max: 1 }") ==
        "sweep.pbtxt:9: field param[0].min: log_uniform needs min > 0 (the log of a non-positive bound), got -1");
  CHECK(Error("param { field: \"optimizer.lrr\" min: 0.1 max: 1 }").rfind(
            "sweep.pbtxt:9: field param[0].field: 'optimizer.lrr' is not a field of the train config", 0) == 0);
  CHECK(Error("param { field: \"data.batch_size\" strings: [\"large\"] }").rfind(
            "sweep.pbtxt:9: field param[0].strings: 'data.batch_size' is a number", 0) == 0);
  CHECK(Error("param { field: \"data.batch_size\" values: [32.5] }") ==
        "sweep.pbtxt:9: field param[0].values: 'data.batch_size' takes integers, got 32.5");
  CHECK(Error("param { field: \"data.shuffle\" strings: [\"maybe\"] }") ==
        "sweep.pbtxt:9: field param[0].strings: 'data.shuffle' is a bool: true or false, got 'maybe'");
  CHECK(Error("param { field: \"data.batch_size\" distribution: \"int\" min: 8 max: 4 }") ==
        "sweep.pbtxt:9: field param[0].max: empty range: min 8 > max 4");
  CHECK(Error("param { field: \"data.batch_size\" values: [] }") ==
        "sweep.pbtxt:9: field param[0].min: a uniform range needs min and max");
  // A value the train config refuses (a batch of 0) names the param's line.
  CHECK(Error("param { field: \"data.batch_size\" distribution: \"int\" min: 0 max: 4 }") ==
        "sweep.pbtxt:9: field param[0] (data.batch_size): must be >= 1, got 0");
  CHECK(Error("param { field: \"optimizer.lr\" min: 0.1 max: 1 }\nparam { field: \"optimizer.lr\" values: [1] }") ==
        "sweep.pbtxt:10: field param[1].field: 'optimizer.lr' is already param[0]");
  // A syntax error is the parser's FILE:LINE:COL.
  CHECK(Error("param { feld: \"x\" }").rfind("sweep.pbtxt:9:", 0) == 0);
  // The algorithm.
  auto bogus = ParseSweep(std::string(kBase).replace(std::string(kBase).find("hyperband"), 9, "bohb") +
                              "param { field: \"optimizer.lr\" min: 0.1 max: 1 }",
                          "sweep.pbtxt", "");
  REQUIRE_FALSE(bogus.ok());
  CHECK(bogus.status().message() ==
        "sweep.pbtxt:8: field algorithm: unknown value 'bohb' (expected one of: random, hyperband, asha)");
}

TEST_CASE("trials are a function of the seed and id; non-fusible values split the packing") {
  auto in = ParseSweep(std::string(kBase) + R"(
param { field: "optimizer.lr" distribution: "log_uniform" min: 0.001 max: 0.1 }
param { field: "data.batch_size" values: [32, 64] }
param { field: "model.args.hidden" distribution: "int" min: 16 max: 17 }
param { field: "optimizer.momentum" values: [0, 0.9] }
)", "sweep.pbtxt", "");
  REQUIRE(in.status().ToString() == "OK");
  std::set<std::string> keys;
  for (int64_t id = 0; id < 40; ++id) {
    auto a = DrawTrial(*in, id), b = DrawTrial(*in, id);
    REQUIRE(a.ok());
    CHECK(a->label == b->label);
    CHECK(a->config.seed() == 100 + static_cast<uint64_t>(id));
    CHECK(a->config.optimizer().lr() >= 0.001);
    CHECK(a->config.optimizer().lr() <= 0.1);
    const std::string hidden = a->config.model().args().at("hidden");
    CHECK((hidden == "16" || hidden == "17"));
    // The lr, momentum and seed do not split arrays; the batch and hidden do.
    keys.insert(a->packing_key);
  }
  CHECK(keys.size() == 4);
  // Another sweep seed draws other values.
  proto::SweepSpec other_seed = in->spec;
  other_seed.set_seed(5);
  SweepInput other = *in;
  other.spec = other_seed;
  CHECK(DrawTrial(other, 0)->label != DrawTrial(*in, 0)->label);
}

TEST_CASE("Hyperband's brackets") {
  proto::SweepSpec s;
  s.set_algorithm("hyperband");
  s.set_max_resource(27);
  s.set_min_resource(1);
  s.set_eta(3);
  // One iteration: s = 3, 2, 1, 0 (Li et al.'s table for R = 27 epochs).
  std::vector<Bracket> b = PlanBrackets(s);
  REQUIRE(b.size() == 4);
  CHECK(b[0].n == 27);
  CHECK(b[0].rung_epochs == std::vector<int64_t>{1, 3, 9, 27});
  CHECK(b[1].n == 12);
  CHECK(b[1].rung_epochs == std::vector<int64_t>{3, 9, 27});
  CHECK(b[2].n == 6);
  CHECK(b[2].rung_epochs == std::vector<int64_t>{9, 27});
  CHECK(b[3].n == 4);
  CHECK(b[3].rung_epochs == std::vector<int64_t>{27});
  CHECK(b[3].first_trial == 27 + 12 + 6);
  // --trials 30: the first bracket, then 3 of the second.
  s.set_trials(30);
  b = PlanBrackets(s);
  REQUIRE(b.size() == 2);
  CHECK(b[1].n == 3);
  CHECK(b[1].first_trial == 27);
  // ASHA: one bracket, rungs at 1, 3, 9 and 27 (and R when not a power).
  s.set_algorithm("asha");
  s.set_trials(20);
  b = PlanBrackets(s);
  REQUIRE(b.size() == 1);
  CHECK(b[0].n == 20);
  CHECK(b[0].rung_epochs == std::vector<int64_t>{1, 3, 9, 27});
  s.set_max_resource(20);
  CHECK(PlanBrackets(s)[0].rung_epochs == std::vector<int64_t>{1, 3, 9, 20});
  s.set_max_resource(27);
  // Random search: one bracket of one rung.
  s.set_algorithm("random");
  s.set_trials(5);
  b = PlanBrackets(s);
  REQUIRE(b.size() == 1);
  CHECK(b[0].n == 5);
  CHECK(b[0].rung_epochs == std::vector<int64_t>{27});
}

TEST_CASE("ASHA's cut-off: a quantile of the finite scores") {
  CHECK(Quantile({1, 2, 3, 4, 5}, 0.5) == 3);
  CHECK(Quantile({5, 1, 3}, 1.0 - 1.0 / 3) == Approx(11.0 / 3));  // 3 + (5 - 3) * (2/3 * 2 - 1)
  CHECK(Quantile({2, -INFINITY, NAN}, 0.9) == 2);
  CHECK(Quantile({-INFINITY}, 0.5) == -INFINITY);
}

}  // namespace
}  // namespace loom::sweep
