#include "train/metrics/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/status.h"

namespace loom::metrics {

namespace {

constexpr int kMinBarCells = 10;
constexpr int kMaxBarCells = 30;

std::string Format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

}  // namespace

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto total = static_cast<long long>(std::llround(seconds));
  const long long h = total / 3600, m = total / 60 % 60, s = total % 60;
  char buf[48];
  if (h > 0)
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", h, m, s);
  else
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", m, s);
  return buf;
}

ProgressBar::ProgressBar(FILE* out, ProgressOptions options) : out_(out), options_(std::move(options)) {
  LOOM_CHECK(out_ != nullptr);
  tty_ = options_.tty ? *options_.tty : ::isatty(::fileno(out_)) == 1;
  start_ = Now();
  last_line_step_ = options_.first_step;
}

double ProgressBar::Now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Asked at every redraw, so a resized terminal gets a bar that fits.
int ProgressBar::Columns() const {
  if (options_.columns > 0) return options_.columns;
  winsize ws{};
  if (::ioctl(::fileno(out_), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

void ProgressBar::Update(int64_t step, double loss, double samples_per_s) {
  have_update_ = true;
  step_ = step;
  loss_ = loss;
  samples_per_s_ = samples_per_s;
  update_time_ = Now();
  shown_latest_ = false;
  const bool last = options_.total_steps > 0 && step >= options_.total_steps;
  if (tty_) {
    if (!bar_visible_ || last || update_time_ - last_draw_ >= options_.redraw_interval_s) Draw();
  } else if (last || step - last_line_step_ >= options_.line_every_steps) {
    EmitLine();
  }
}

void ProgressBar::PrintLine(std::string_view line) {
  const bool redraw = bar_visible_;
  ClearBar();
  std::string text(line);
  if (text.empty() || text.back() != '\n') text.push_back('\n');
  std::fputs(text.c_str(), out_);
  if (redraw) Draw();
  std::fflush(out_);
}

void ProgressBar::Finish() {
  if (have_update_ && !shown_latest_) {
    if (tty_)
      Draw();
    else
      EmitLine();
  }
  if (bar_visible_) {
    std::fputc('\n', out_);
    bar_visible_ = false;
  }
  std::fflush(out_);
}

void ProgressBar::Draw() {
  // The bar fits in one line less a column: writing the last column makes
  // some terminals wrap, and '\r' would then return to the wrong line.
  const std::string text = Render(std::max(1, Columns() - 1));
  std::string buf = "\r" + text;
  if (text.size() < bar_length_) buf.append(bar_length_ - text.size(), ' ');  // blank the longer old bar
  std::fputs(buf.c_str(), out_);
  std::fflush(out_);
  bar_visible_ = true;
  bar_length_ = text.size();
  shown_latest_ = true;
  last_draw_ = update_time_;
}

void ProgressBar::ClearBar() {
  if (!bar_visible_) return;
  std::fputs(("\r" + std::string(bar_length_, ' ') + "\r").c_str(), out_);
  bar_visible_ = false;
  bar_length_ = 0;
}

void ProgressBar::EmitLine() {
  std::fputs((Render(0) + "\n").c_str(), out_);
  std::fflush(out_);
  last_line_step_ = step_;
  shown_latest_ = true;
}

std::string ProgressBar::Render(int width) const {
  const int64_t total = options_.total_steps;
  const double fraction =
      total > 0 ? std::clamp(static_cast<double>(step_) / static_cast<double>(total), 0.0, 1.0) : 0.0;
  std::string count = "step " + std::to_string(step_);
  if (total > 0) {
    count += "/" + std::to_string(total) + " (" + Format("%.0f", std::floor(100 * fraction)) + "%)";
  }
  const double elapsed = update_time_ - start_;
  std::string times = FormatDuration(elapsed) + " elapsed";
  if (total > 0) {
    const int64_t done = step_ - options_.first_step;
    const double left =
        done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(std::max<int64_t>(0, total - step_)) : -1;
    times += ", " + FormatDuration(left) + " left";
  }
  const std::string stats =
      count + " | loss " + Format("%.4f", loss_) + " | " + Format("%.0f", samples_per_s_) + " samples/s | " + times;
  const std::string label = label_.empty() ? "" : label_ + " ";
  if (width <= 0) return label + stats;

  std::string line = label;
  if (total > 0) {
    const int rest = static_cast<int>(label.size() + stats.size()) + 3;  // "[", "] "
    const int cells = std::clamp(width - rest, kMinBarCells, kMaxBarCells);
    const int full = static_cast<int>(fraction * cells);
    std::string bar(static_cast<size_t>(full), '=');
    if (full < cells) bar += '>';
    bar.resize(static_cast<size_t>(cells), ' ');
    line += "[" + bar + "] ";
  }
  line += stats;
  if (line.size() > static_cast<size_t>(width)) line.resize(static_cast<size_t>(width));
  return line;
}

}  // namespace loom::metrics
