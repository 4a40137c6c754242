// A training progress display. On a terminal: one line redrawn in place with
// '\r' (at most every redraw_interval_s), e.g.
//   epoch 2/10 [=======>            ] 4200/9380  45% | loss 0.4123 | 12345 samples/s | 0:12 elapsed, 0:15 left
// Elsewhere (a log file, a pipe): a plain line every line_every_steps steps,
// with no control characters. Other output written while the bar is shown
// must go through PrintLine, which clears the bar, prints the line and
// redraws the bar under it. Not thread-safe: call from the training loop.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace loom::metrics {

struct ProgressOptions {
  int64_t total_steps = 0;          // 0: unknown, so no bar and no time left
  std::optional<bool> tty;          // unset: whether the output is a terminal (isatty)
  double redraw_interval_s = 0.25;  // terminal: at most four redraws a second
  int64_t line_every_steps = 100;   // not a terminal: one line per this many steps
  int columns = 0;                  // terminal width; 0: ask the terminal (80 if it will not say)
  int64_t first_step = 0;           // steps done before this process (a resumed run)
  std::function<double()> clock;    // seconds, monotonic; unset: steady_clock (tests pass a fake)
};

class ProgressBar {
 public:
  ProgressBar(FILE* out, ProgressOptions options);
  ~ProgressBar() { Finish(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Shown first on every line, e.g. "epoch 2/10".
  void SetLabel(std::string label) { label_ = std::move(label); }

  // `step` is the number of steps done (1 after the first step).
  void Update(int64_t step, double loss, double samples_per_s);

  // Writes `line` (a newline is added if missing) above the bar.
  void PrintLine(std::string_view line);

  // Shows the latest update if it was skipped and ends the bar's line (a
  // later Update draws the bar again below). Called by the destructor.
  void Finish();

  bool tty() const { return tty_; }

 private:
  double Now() const;
  int Columns() const;
  // The display line for the latest update: with a bar and at most `width`
  // characters on a terminal, unbounded and without a bar (width 0) elsewhere.
  std::string Render(int width) const;
  void Draw();
  void EmitLine();
  void ClearBar();

  FILE* out_;
  ProgressOptions options_;
  bool tty_;
  std::string label_;
  double start_;

  // The latest update.
  bool have_update_ = false;
  int64_t step_ = 0;
  double loss_ = 0;
  double samples_per_s_ = 0;
  double update_time_ = 0;

  bool bar_visible_ = false;  // terminal: the bar is on the current line
  size_t bar_length_ = 0;     // its length, to blank it out
  bool shown_latest_ = true;  // the latest update has been drawn or printed
  double last_draw_ = 0;
  int64_t last_line_step_ = 0;  // not a terminal: the step of the last line printed
};

// "m:ss" under an hour, "h:mm:ss" from an hour on; "?" for negative or non-finite seconds.
std::string FormatDuration(double seconds);

}  // namespace loom::metrics
