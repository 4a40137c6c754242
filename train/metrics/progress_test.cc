#include "train/metrics/progress.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace loom::metrics {
namespace {

// A temporary file standing in for the terminal or the log.
class Capture {
 public:
  Capture() : file_(std::tmpfile(), &std::fclose) { REQUIRE(file_ != nullptr); }
  FILE* get() { return file_.get(); }
  std::string Text() {
    std::fflush(file_.get());
    const long end = std::ftell(file_.get());
    std::string text(static_cast<size_t>(end), '\0');
    std::rewind(file_.get());
    REQUIRE(std::fread(text.data(), 1, text.size(), file_.get()) == text.size());
    return text;
  }

 private:
  std::unique_ptr<FILE, int (*)(FILE*)> file_;
};

struct FakeClock {
  double now = 0;
  std::function<double()> fn() {
    return [this] { return now; };
  }
};

std::vector<std::string> Split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, sep);) parts.push_back(part);
  return parts;
}

size_t Count(const std::string& text, char c) { return static_cast<size_t>(std::count(text.begin(), text.end(), c)); }

ProgressOptions Options(FakeClock& clock, bool tty, int64_t total) {
  ProgressOptions o;
  o.total_steps = total;
  o.tty = tty;
  o.clock = clock.fn();
  o.columns = 120;
  return o;
}

TEST_CASE("FormatDuration") {
  CHECK(FormatDuration(0) == "0:00");
  CHECK(FormatDuration(59.6) == "1:00");
  CHECK(FormatDuration(3599) == "59:59");
  CHECK(FormatDuration(3600) == "1:00:00");
  CHECK(FormatDuration(90061) == "25:01:01");
  CHECK(FormatDuration(-1) == "?");
  CHECK(FormatDuration(std::nan("")) == "?");
}

TEST_CASE("not a terminal: plain lines at a fixed step interval, no control characters") {
  Capture out;
  FakeClock clock;
  ProgressOptions o = Options(clock, /*tty=*/false, /*total=*/1000);
  o.line_every_steps = 100;
  {
    ProgressBar bar(out.get(), o);
    CHECK_FALSE(bar.tty());
    bar.SetLabel("epoch 1/3");
    for (int64_t step = 10; step <= 1000; step += 10) {
      clock.now += 1;  // 0.1 s per step
      bar.Update(step, 0.5, 2000);
    }
  }
  const std::string text = out.Text();
  for (char c : text) CHECK((c == '\n' || (c >= 0x20 && c < 0x7f)));
  std::vector<std::string> lines = Split(text, '\n');
  REQUIRE(lines.size() == 10);
  CHECK(lines[0] == "epoch 1/3 step 100/1000 (10%) | loss 0.5000 | 2000 samples/s | 0:10 elapsed, 1:30 left");
  CHECK(lines[9] == "epoch 1/3 step 1000/1000 (100%) | loss 0.5000 | 2000 samples/s | 1:40 elapsed, 0:00 left");
}

TEST_CASE("not a terminal: uneven reports still give a line per interval, and the last step") {
  Capture out;
  FakeClock clock;
  ProgressOptions o = Options(clock, /*tty=*/false, /*total=*/0);  // total unknown
  o.line_every_steps = 100;
  ProgressBar bar(out.get(), o);
  for (int64_t step = 30; step <= 330; step += 30) bar.Update(step, 1.25, 10);
  bar.Finish();
  bar.Finish();  // idempotent
  std::vector<std::string> lines = Split(out.Text(), '\n');
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == "step 120 | loss 1.2500 | 10 samples/s | 0:00 elapsed");  // no total: no estimate
  CHECK(lines[1].rfind("step 240 |", 0) == 0);
  CHECK(lines[2].rfind("step 330 |", 0) == 0);  // the last update, printed by Finish
}

TEST_CASE("terminal: redrawn in place with '\\r', at most every redraw interval") {
  Capture out;
  FakeClock clock;
  ProgressOptions o = Options(clock, /*tty=*/true, /*total=*/100);
  o.redraw_interval_s = 0.25;
  ProgressBar bar(out.get(), o);
  for (int64_t step = 1; step <= 100; ++step) {
    clock.now += 0.0625;  // exact in binary: the count below does not hinge on rounding
    bar.Update(step, 0.5, 100);
  }
  std::string text = out.Text();
  CHECK(Count(text, '\n') == 0);  // still on the bar's line
  // Drawn at the first update, then every fourth (0.25 s): steps 1, 5, ..., 97,
  // and at the last step.
  CHECK(Count(text, '\r') == 26);
  bar.Finish();
  text = out.Text();
  CHECK(text.back() == '\n');
  CHECK(Count(text, '\r') == 26);  // the last step was already shown
  const std::vector<std::string> draws = Split(text.substr(1), '\r');
  CHECK(draws[1].find("step 5/100 (5%)") != std::string::npos);
  CHECK(
      draws.back() ==
      "[==============================] step 100/100 (100%) | loss 0.5000 | 100 samples/s | 0:06 elapsed, 0:00 left\n");
}

TEST_CASE("terminal: Finish shows a throttled last update") {
  Capture out;
  FakeClock clock;
  ProgressBar bar(out.get(), Options(clock, /*tty=*/true, /*total=*/100));
  bar.Update(10, 0.5, 100);
  clock.now += 0.01;
  bar.Update(20, 0.25, 100);  // too soon to draw
  CHECK(out.Text().find("step 20/") == std::string::npos);
  bar.Finish();
  CHECK(out.Text().find("step 20/100 (20%) | loss 0.2500") != std::string::npos);
}

TEST_CASE("terminal: the bar fits the width and shows the fraction done") {
  Capture out;
  FakeClock clock;
  ProgressOptions o = Options(clock, /*tty=*/true, /*total=*/200);
  o.columns = 100;
  ProgressBar bar(out.get(), o);
  clock.now = 10;
  bar.Update(50, 0.5, 1000);
  const std::string text = out.Text();
  REQUIRE(text[0] == '\r');
  const std::string line = text.substr(1);
  CHECK(line.size() <= 99);
  // 25% of the 22 cells that fit.
  CHECK(line == "[=====>                ] step 50/200 (25%) | loss 0.5000 | 1000 samples/s | 0:10 elapsed, 0:30 left");

  Capture narrow;
  o.columns = 40;
  ProgressBar small(narrow.get(), o);
  small.Update(50, 0.5, 1000);
  CHECK(narrow.Text() == "\r[==>       ] step 50/200 (25%) | loss 0");  // cut at 39 columns
}

TEST_CASE("terminal: a shorter redraw blanks what is left of the longer one") {
  Capture out;
  FakeClock clock;
  ProgressBar bar(out.get(), Options(clock, /*tty=*/true, /*total=*/10));
  bar.Update(1, 12345.678, 1000000);
  const size_t first = out.Text().size() - 1;
  clock.now = 1;
  bar.Update(2, 0.5, 1);
  const std::string text = out.Text();
  const std::string second = text.substr(first + 2);  // after the second '\r'
  CHECK(second.size() == first);
  CHECK(second.find("loss 0.5000 | 1 samples/s") != std::string::npos);
  CHECK(second.back() == ' ');
}

TEST_CASE("terminal: PrintLine writes above the bar and redraws it") {
  Capture out;
  FakeClock clock;
  ProgressBar bar(out.get(), Options(clock, /*tty=*/true, /*total=*/4));
  bar.SetLabel("epoch 1/2");
  bar.Update(2, 0.5, 10);
  const std::string drawn = out.Text();
  const std::string bar_text = drawn.substr(1);
  bar.PrintLine("epoch 1: test accuracy 0.8800");
  const std::string blank = "\r" + std::string(bar_text.size(), ' ') + "\r";
  CHECK(out.Text() == drawn + blank + "epoch 1: test accuracy 0.8800\n" + "\r" + bar_text);
  bar.Finish();
  bar.PrintLine("done\n");  // no bar shown: the line alone, its newline not doubled
  CHECK(out.Text() == drawn + blank + "epoch 1: test accuracy 0.8800\n\r" + bar_text + "\ndone\n");
}

TEST_CASE("not a terminal: PrintLine is a plain line") {
  Capture out;
  FakeClock clock;
  ProgressBar bar(out.get(), Options(clock, /*tty=*/false, /*total=*/4));
  bar.Update(1, 0.5, 10);
  bar.PrintLine("hello");
  bar.Finish();
  const std::vector<std::string> lines = Split(out.Text(), '\n');
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == "hello");
  CHECK(lines[1].rfind("step 1/4 (25%)", 0) == 0);
}

TEST_CASE("a resumed run estimates time left from the steps of this process") {
  Capture out;
  FakeClock clock;
  ProgressOptions o = Options(clock, /*tty=*/false, /*total=*/1000);
  o.first_step = 500;
  o.line_every_steps = 100;
  ProgressBar bar(out.get(), o);
  clock.now = 10;
  bar.Update(600, 0.5, 10);  // 100 steps in 10 s, 400 to go
  CHECK(out.Text() == "step 600/1000 (60%) | loss 0.5000 | 10 samples/s | 0:10 elapsed, 0:40 left\n");
}

}  // namespace
}  // namespace loom::metrics
