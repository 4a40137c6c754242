#include "train/metrics/summary_table.h"

#include <catch2/catch.hpp>
#include <cmath>

namespace loom::metrics {
namespace {

std::string Table(const std::vector<SummaryRow>& rows, const SummaryOptions& options = {}) {
  auto table = FormatSummaryTable(rows, options);
  INFO(table.status().ToString());
  REQUIRE(table.ok());
  return *table;
}

std::vector<SummaryRow> ThreeReplicas() {
  return {
      {"0", {{"step", 9380}, {"train/loss", 0.29041}, {"test/accuracy", 0.8801}}},
      {"1", {{"step", 9380}, {"train/loss", std::nan("")}, {"test/accuracy", std::nan("")}}},
      {"2", {{"step", 9380}, {"train/loss", 0.28113}, {"test/accuracy", 0.8842}}},
  };
}

TEST_CASE("replicas ranked by a metric, highest first, NaN last") {
  SummaryOptions options;
  options.rank_by = "test/accuracy";
  CHECK(Table(ThreeReplicas(), options) ==
        "ranked by test/accuracy, highest first\n"
        "rank  replica  step  train/loss  test/accuracy\n"
        "----  -------  ----  ----------  -------------\n"
        "   1  2        9380      0.2811         0.8842\n"
        "   2  0        9380      0.2904         0.8801\n"
        "   3  1        9380         nan            nan\n");
}

TEST_CASE("ranked lowest first, with chosen columns") {
  SummaryOptions options;
  options.rank_by = "train/loss";
  options.descending = false;
  options.columns = {"train/loss"};
  options.name_header = "trial";
  options.precision = 2;
  CHECK(Table(ThreeReplicas(), options) ==
        "ranked by train/loss, lowest first\n"
        "rank  trial  train/loss\n"
        "----  -----  ----------\n"
        "   1  2            0.28\n"
        "   2  0            0.29\n"
        "   3  1             nan\n");
}

TEST_CASE("unranked rows keep their order; missing values show '-'; equal values keep order") {
  std::vector<SummaryRow> rows = {
      {"a", {{"loss", 1.0}}},
      {"b", {{"loss", 2.0}, {"lr", 1e-5}}},
      {"c", {{"loss", 1.0}, {"lr", 0.1}}},
  };
  CHECK(Table(rows) ==
        "final metrics\n"
        "replica  loss         lr\n"
        "-------  ----  ---------\n"
        "a           1          -\n"
        "b           2  1.000e-05\n"
        "c           1  1.000e-01\n");
  SummaryOptions options;
  options.rank_by = "loss";
  options.descending = false;
  const std::string ranked = Table(rows, options);
  CHECK(ranked.find("   1  a") < ranked.find("   2  c"));  // a tie keeps the given order
  CHECK(ranked.find("   2  c") < ranked.find("   3  b"));
  options.rank_by = "lr";
  const std::string by_lr = Table(rows, options);
  CHECK(by_lr.find("   3  a") != std::string::npos);  // a row without the value ranks last
}

TEST_CASE("a single run is a metric/value list") {
  std::vector<SummaryRow> rows = {{"0", {{"step", 9380}, {"test/loss", 0.33}, {"test/accuracy", 1.0}, {"lr", 2e-4}}}};
  CHECK(Table(rows) ==
        "final metrics (replica 0)\n"
        "metric             value\n"
        "-------------  ---------\n"
        "step                9380\n"
        "test/loss         0.3300\n"
        "test/accuracy          1\n"
        "lr             2.000e-04\n");
}

TEST_CASE("column formats: integers, fixed decimals, scientific, infinities") {
  std::vector<SummaryRow> rows = {
      {"0", {{"acc", 1.0}, {"n", 3}, {"big", 2.5e9}, {"x", INFINITY}}},
      {"1", {{"acc", 0.875}, {"n", 12}, {"big", 1.5}, {"x", -INFINITY}}},
  };
  CHECK(Table(rows) ==
        "final metrics\n"
        "replica     acc   n        big     x\n"
        "-------  ------  --  ---------  ----\n"
        "0        1.0000   3  2.500e+09   inf\n"
        "1        0.8750  12  1.500e+00  -inf\n");
}

TEST_CASE("errors name the missing column and the ones there are") {
  auto no_rows = FormatSummaryTable({});
  CHECK(no_rows.status().message() == "summary table: no rows");
  SummaryOptions options;
  options.rank_by = "test/acc";
  CHECK(FormatSummaryTable(ThreeReplicas(), options).status().message() ==
        "summary table: no rank_by column \"test/acc\" in any row (columns: step, train/loss, test/accuracy)");
  options.rank_by.clear();
  options.columns = {"step", "lr"};
  CHECK(FormatSummaryTable(ThreeReplicas(), options).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("FinalMetrics takes each replica's last record of each split") {
  auto record = [](int64_t replica, int64_t step, Split split, double loss, std::optional<double> accuracy) {
    MetricsRecord r;
    r.replica = replica;
    r.step = step;
    r.split = split;
    r.loss = loss;
    r.accuracy = accuracy;
    r.samples_per_s = 100;
    return r;
  };
  const std::vector<MetricsRecord> records = {
      record(1, 100, Split::kTrain, 0.9, std::nullopt),
      record(0, 100, Split::kTrain, 0.8, std::nullopt),
      record(0, 100, Split::kTest, 0.7, 0.6),
      record(0, 200, Split::kTrain, 0.5, std::nullopt),
      record(0, 200, Split::kTest, 0.4, 0.8),
      record(0, 200, Split::kTest, 0.3, 0.85),  // same step, later line: wins
      record(1, 200, Split::kTrain, 0.6, std::nullopt),
  };
  std::vector<SummaryRow> rows = FinalMetrics(records);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].name == "0");
  std::vector<std::pair<std::string, double>> want0 = {
      {"step", 200},      {"train/loss", 0.5},     {"train/samples_per_s", 100},
      {"test/loss", 0.3}, {"test/accuracy", 0.85}, {"test/samples_per_s", 100}};
  CHECK(rows[0].values == want0);
  std::vector<std::pair<std::string, double>> want1 = {
      {"step", 200}, {"train/loss", 0.6}, {"train/samples_per_s", 100}};
  CHECK(rows[1].values == want1);

  SummaryOptions options;
  options.rank_by = "test/accuracy";
  options.columns = {"step", "train/loss", "test/accuracy"};
  CHECK(Table(rows, options) ==
        "ranked by test/accuracy, highest first\n"
        "rank  replica  step  train/loss  test/accuracy\n"
        "----  -------  ----  ----------  -------------\n"
        "   1  0         200      0.5000         0.8500\n"
        "   2  1         200      0.6000              -\n");
}

}  // namespace
}  // namespace loom::metrics
