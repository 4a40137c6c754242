#include "train/metrics/summary_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

namespace loom::metrics {

namespace {

std::optional<double> Find(const SummaryRow& row, const std::string& column) {
  for (const auto& [name, value] : row.values)
    if (name == column) return value;
  return std::nullopt;
}

// One format per column, so its numbers line up: integers when every value
// is one (steps, counts), scientific when some value would show fewer than
// two significant digits in `precision` fixed decimals or is very large,
// fixed decimals otherwise.
enum class NumberStyle { kInteger, kFixed, kScientific };

NumberStyle StyleOf(const std::vector<double>& values, int precision) {
  bool integral = true, scientific = false;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    if (v != std::trunc(v) || std::fabs(v) >= 1e15) integral = false;
    if (v != 0 && (std::fabs(v) < std::pow(10.0, 1 - precision) || std::fabs(v) >= 1e7)) scientific = true;
  }
  if (integral) return NumberStyle::kInteger;
  return scientific ? NumberStyle::kScientific : NumberStyle::kFixed;
}

std::string FormatNumber(std::optional<double> v, NumberStyle style, int precision) {
  if (!v) return "-";
  if (std::isnan(*v)) return "nan";
  if (std::isinf(*v)) return *v > 0 ? "inf" : "-inf";
  char buf[64];
  switch (style) {
    case NumberStyle::kInteger:
      std::snprintf(buf, sizeof(buf), "%.0f", *v);
      break;
    case NumberStyle::kFixed:
      std::snprintf(buf, sizeof(buf), "%.*f", precision, *v);
      break;
    case NumberStyle::kScientific:
      std::snprintf(buf, sizeof(buf), "%.*e", std::max(0, precision - 1), *v);
      break;
  }
  return buf;
}

// Lays out cells[row][column] with two spaces between columns and a rule
// under the header (row 0); columns listed in `left` are left-aligned.
std::string Layout(const std::vector<std::vector<std::string>>& cells, const std::vector<bool>& left) {
  std::vector<size_t> width(left.size(), 0);
  for (const auto& row : cells)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  std::string out;
  auto emit = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      if (c > 0) line += "  ";
      const std::string pad(width[c] - row[c].size(), ' ');
      line += left[c] ? row[c] + pad : pad + row[c];
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  };
  emit(cells[0]);
  std::vector<std::string> rule;
  for (size_t w : width) rule.emplace_back(w, '-');
  emit(rule);
  for (size_t r = 1; r < cells.size(); ++r) emit(cells[r]);
  return out;
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

StatusOr<std::string> FormatSummaryTable(const std::vector<SummaryRow>& rows, const SummaryOptions& options) {
  if (rows.empty()) return InvalidArgument("summary table: no rows");
  std::vector<std::string> all;
  for (const SummaryRow& row : rows)
    for (const auto& [name, value] : row.values)
      if (std::find(all.begin(), all.end(), name) == all.end()) all.push_back(name);
  auto check = [&](const std::string& column, const char* what) -> Status {
    if (std::find(all.begin(), all.end(), column) != all.end()) return Status::Ok();
    return InvalidArgument("summary table: no ", what, " \"", column, "\" in any row (columns: ", JoinNames(all), ")");
  };
  const std::vector<std::string>& columns = options.columns.empty() ? all : options.columns;
  for (const std::string& c : columns) LOOM_RETURN_IF_ERROR(check(c, "column"));
  if (!options.rank_by.empty()) LOOM_RETURN_IF_ERROR(check(options.rank_by, "rank_by column"));

  std::vector<size_t> order(rows.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (!options.rank_by.empty()) {
    auto key = [&](size_t i) { return Find(rows[i], options.rank_by); };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const std::optional<double> ka = key(a), kb = key(b);
      const bool va = ka && !std::isnan(*ka), vb = kb && !std::isnan(*kb);
      if (va != vb) return va;  // missing and NaN values last
      if (!va) return false;
      return options.descending ? *ka > *kb : *ka < *kb;
    });
  }

  std::vector<NumberStyle> styles;
  for (const std::string& c : columns) {
    std::vector<double> values;
    for (const SummaryRow& row : rows)
      if (auto v = Find(row, c)) values.push_back(*v);
    styles.push_back(StyleOf(values, options.precision));
  }

  if (rows.size() == 1) {
    std::vector<std::vector<std::string>> cells = {{"metric", "value"}};
    for (size_t c = 0; c < columns.size(); ++c)
      cells.push_back({columns[c], FormatNumber(Find(rows[0], columns[c]), styles[c], options.precision)});
    return StrCat("final metrics (", options.name_header, " ", rows[0].name, ")\n", Layout(cells, {true, false}));
  }

  const bool ranked = !options.rank_by.empty();
  std::vector<std::vector<std::string>> cells(1);
  std::vector<bool> left;
  if (ranked) {
    cells[0].push_back("rank");
    left.push_back(false);
  }
  cells[0].push_back(options.name_header);
  left.push_back(true);
  for (const std::string& c : columns) {
    cells[0].push_back(c);
    left.push_back(false);
  }
  for (size_t r = 0; r < order.size(); ++r) {
    const SummaryRow& row = rows[order[r]];
    std::vector<std::string> line;
    if (ranked) line.push_back(std::to_string(r + 1));
    line.push_back(row.name);
    for (size_t c = 0; c < columns.size(); ++c)
      line.push_back(FormatNumber(Find(row, columns[c]), styles[c], options.precision));
    cells.push_back(std::move(line));
  }
  const std::string title =
      ranked ? StrCat("ranked by ", options.rank_by, ", ", options.descending ? "highest" : "lowest", " first")
             : std::string("final metrics");
  return title + "\n" + Layout(cells, left);
}

std::vector<SummaryRow> FinalMetrics(const std::vector<MetricsRecord>& records) {
  struct Last {
    int64_t step = 0;
    std::optional<MetricsRecord> train, test;
  };
  std::map<int64_t, Last> by_replica;
  for (const MetricsRecord& r : records) {
    Last& last = by_replica[r.replica];
    last.step = std::max(last.step, r.step);
    std::optional<MetricsRecord>& slot = r.split == Split::kTrain ? last.train : last.test;
    if (!slot || r.step >= slot->step) slot = r;
  }
  std::vector<SummaryRow> rows;
  for (const auto& [replica, last] : by_replica) {
    SummaryRow row{std::to_string(replica), {{"step", static_cast<double>(last.step)}}};
    for (const auto* record : {&last.train, &last.test})
      if (*record)
        for (auto& scalar : RecordScalars(**record)) row.values.push_back(std::move(scalar));
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace loom::metrics
