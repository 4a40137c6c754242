// The end-of-run summary: a table of final metrics. One row prints as a
// two-column "metric value" list; several rows (replicas) print as one table,
// ranked by a chosen column when one is given:
//
//   replicas ranked by test/accuracy, highest first
//   rank  replica  step  train/loss  test/loss  test/accuracy
//      1        2  9380      0.2811     0.3301         0.8842
//      2        0  9380      0.2904     0.3350         0.8801
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "train/metrics/metrics_jsonl.h"

namespace loom::metrics {

struct SummaryRow {
  std::string name;                                    // shown in the first column, e.g. the replica index
  std::vector<std::pair<std::string, double>> values;  // a column a row lacks shows "-"
};

struct SummaryOptions {
  std::string name_header = "replica";  // header of the name column
  std::vector<std::string> columns;     // which columns, in this order; empty: all, in first-seen order
  std::string rank_by;                  // a column to sort by; empty: rows in the given order
  bool descending = true;               // highest first (accuracy); false for lowest first (loss)
  int precision = 4;                    // decimals of non-integer columns
};

// Errors: no rows, or a column or rank_by that no row has (the message lists
// the columns there are). Rows lacking the rank_by value, or holding NaN
// there, rank last; equal values keep their order.
StatusOr<std::string> FormatSummaryTable(const std::vector<SummaryRow>& rows, const SummaryOptions& options = {});

// One row per replica (ascending), named by its index: "step" (the last step
// reported), then RecordScalars of the replica's last record of each split
// (train/..., test/...). "Last" is the largest step, the later line on ties.
std::vector<SummaryRow> FinalMetrics(const std::vector<MetricsRecord>& records);

}  // namespace loom::metrics
