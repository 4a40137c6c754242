#include "train/metrics/metrics_jsonl.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <csignal>
#include <fstream>
#include <limits>

#include "train/metrics/test_dir.h"

namespace loom::metrics {
namespace {

MetricsRecord TestRecord() {
  MetricsRecord r;
  r.replica = 1;
  r.epoch = 2;
  r.step = 300;
  r.split = Split::kTest;
  r.loss = 0.25;
  r.accuracy = 0.875;
  r.samples_per_s = 1234.5;
  r.time_s = 12.5;
  r.extra = {{"lr", 0.05}, {"perplexity", 1.284}};
  return r;
}

std::string Line(const MetricsRecord& r) {
  auto line = FormatMetricsLine(r);
  REQUIRE(line.ok());
  return *line;
}

MetricsRecord Parse(const std::string& line) {
  auto r = ParseMetricsLine(line);
  INFO(line << " -> " << r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}

std::string ParseError(const std::string& line) {
  auto r = ParseMetricsLine(line);
  INFO(line);
  REQUIRE_FALSE(r.ok());
  return r.status().message();
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

TEST_CASE("a record is one JSON object with the fixed fields, then the extra ones") {
  CHECK(Line(TestRecord()) == R"({"replica":1,"epoch":2,"step":300,"split":"test","loss":0.25,"accuracy":0.875,)"
                              R"("samples_per_s":1234.5,"time_s":12.5,"lr":0.05,"perplexity":1.284})");
  CHECK(Parse(Line(TestRecord())) == TestRecord());
}

TEST_CASE("accuracy is omitted when the task has none") {
  MetricsRecord r = TestRecord();
  r.accuracy.reset();
  r.split = Split::kTrain;
  r.extra.clear();
  const std::string line = Line(r);
  CHECK(line ==
        R"({"replica":1,"epoch":2,"step":300,"split":"train","loss":0.25,"samples_per_s":1234.5,"time_s":12.5})");
  MetricsRecord back = Parse(line);
  CHECK_FALSE(back.accuracy.has_value());
  CHECK(back == r);
}

TEST_CASE("numbers are written in the shortest form that reads back exactly") {
  MetricsRecord r = TestRecord();
  r.loss = 0.1;
  r.samples_per_s = 1e-7;
  r.time_s = 1.0 / 3.0;
  r.extra = {{"big", 1e300}, {"neg_zero", -0.0}, {"tiny", 5e-324}, {"int", 42}};
  const std::string line = Line(r);
  CHECK(line.find(R"("loss":0.1,)") != std::string::npos);
  CHECK(line.find(R"("samples_per_s":1e-07,)") != std::string::npos);
  CHECK(line.find(R"("big":1e+300,)") != std::string::npos);
  CHECK(line.find(R"("neg_zero":-0,)") != std::string::npos);
  CHECK(line.find(R"("int":42})") != std::string::npos);
  MetricsRecord back = Parse(line);
  CHECK(back == r);
  CHECK(std::signbit(back.extra[1].second));
}

TEST_CASE("NaN and infinities are written as null and read back as NaN") {
  MetricsRecord r = TestRecord();
  r.loss = std::numeric_limits<double>::quiet_NaN();
  r.accuracy = std::numeric_limits<double>::infinity();
  r.extra = {{"lr", -std::numeric_limits<double>::infinity()}};
  const std::string line = Line(r);
  CHECK(line.find("nan") == std::string::npos);
  CHECK(line.find("inf") == std::string::npos);
  CHECK(line.find(R"("loss":null,"accuracy":null,)") != std::string::npos);
  CHECK(line.find(R"("lr":null})") != std::string::npos);
  MetricsRecord back = Parse(line);
  CHECK(std::isnan(back.loss));
  REQUIRE(back.accuracy.has_value());
  CHECK(std::isnan(*back.accuracy));
  CHECK(std::isnan(back.extra.at(0).second));
}

TEST_CASE("field names are JSON-escaped and read back unchanged") {
  MetricsRecord r = TestRecord();
  const std::string name =
      "a\"b\\c\nd\te\x01"
      "f/\xc3\xa9";  // split: \x01f would be one escape
  r.extra = {{name, 1.5}};
  const std::string line = Line(r);
  CHECK(line.find(R"("a\"b\\c\nd\te\u0001f/)"
                  "\xc3\xa9"
                  R"(":1.5})") != std::string::npos);
  CHECK(line.find('\n') == std::string::npos);
  MetricsRecord back = Parse(line);
  REQUIRE(back.extra.size() == 1);
  CHECK(back.extra[0].first == name);
}

TEST_CASE("extra field names must be non-empty, unique and not a fixed field's") {
  MetricsRecord r = TestRecord();
  r.extra = {{"", 1}};
  CHECK(FormatMetricsLine(r).status().message().find("empty name") != std::string::npos);
  r.extra = {{"lr", 1}, {"lr", 2}};
  CHECK(FormatMetricsLine(r).status().message().find("\"lr\" appears twice") != std::string::npos);
  r.extra = {{"loss", 1}};
  CHECK(FormatMetricsLine(r).status().message().find("\"loss\" clashes") != std::string::npos);
}

TEST_CASE("the reader accepts JSON whitespace and escapes") {
  MetricsRecord r = Parse(
      " { \"replica\" : 0 , \"epoch\":1,\"step\":-5,\"split\":\"tr\\u0061in\",\"loss\":1E2,"
      "\"samples_per_s\":2.5e+1,\"time_s\":0,\"\\ud83d\\ude00\\/x\":-1.25 } ");
  CHECK(r.split == Split::kTrain);
  CHECK(r.step == -5);
  CHECK(r.loss == 100);
  CHECK(r.samples_per_s == 25);
  REQUIRE(r.extra.size() == 1);
  CHECK(r.extra[0].first == "\xf0\x9f\x98\x80/x");  // U+1F600 from a surrogate pair
  CHECK(r.extra[0].second == -1.25);
}

TEST_CASE("the reader rejects what the format does not allow") {
  const std::string ok_tail = R"("split":"train","loss":1,"samples_per_s":1,"time_s":1})";
  CHECK(ParseError(R"({"replica":0,"epoch":1,"split":"train","loss":1,"samples_per_s":1,"time_s":1})") ==
        "missing field \"step\"");
  CHECK(ParseError(R"({"replica":0,"epoch":1,"step":1.5,)" + ok_tail) == "\"step\" must be an integer, got 1.5");
  CHECK(ParseError(R"({"replica":0,"epoch":1,"step":99999999999999999999,)" + ok_tail).find("64 bits") !=
        std::string::npos);
  CHECK(ParseError(R"({"replica":0,"epoch":1,"step":1,"step":2,)" + ok_tail) == "field \"step\" appears twice");
  CHECK(ParseError(R"({"replica":0,"epoch":1,"step":1,"split":"val","loss":1,"samples_per_s":1,"time_s":1})")
            .find("unknown split \"val\"") != std::string::npos);
  CHECK(ParseError(R"({"replica":0,"epoch":1,"step":1,"split":"train","loss":"low","samples_per_s":1,"time_s":1})") ==
        "\"loss\" must be a number, got a string");
  CHECK(ParseError(R"({"replica":0,"epoch":1,"step":01,)" + ok_tail).find("leading zero") != std::string::npos);
  CHECK(ParseError(R"({"replica":0,"epoch":1,"step":1,"x":[1],)" + ok_tail).find("not a number, string or null") !=
        std::string::npos);
  CHECK(ParseError(R"({"replica":0,"epoch":1,"step":1,"x":1.,)" + ok_tail).find("no digits after '.'") !=
        std::string::npos);
  CHECK(ParseError(R"({"replica":0,"epoch":1,"step":1,"x":1e,)" + ok_tail).find("exponent") != std::string::npos);
  CHECK(ParseError(R"({"replica":0,"epoch":1,"step":1,"x":NaN,)" + ok_tail).find("not a number") != std::string::npos);
  CHECK(ParseError(R"({"replica":0,"epoch":1,"step":1,"x":1e999,)" + ok_tail).find("out of range") !=
        std::string::npos);
  CHECK(ParseError(R"({"replica":0,"epoch":1,"step":1,)" + ok_tail + "x").find("after the object") !=
        std::string::npos);
  CHECK(ParseError(R"({"replica":0,"epoch":1,"step":1,"split":"train")").find("expected ',' or '}'") !=
        std::string::npos);
  CHECK(ParseError(R"({"a\ud800":1})").find("surrogate") != std::string::npos);
  CHECK(ParseError("{\"a\tb\":1}").find("control character") != std::string::npos);
}

TEST_CASE("the writer appends one line per record and every line is on disk at once") {
  const std::string path = testing::FreshTestDir("jsonl_append") + "/run/metrics.jsonl";  // run/ is created
  MetricsRecord r = TestRecord();
  {
    auto writer = MetricsWriter::Open(path);
    REQUIRE(writer.ok());
    for (int64_t step = 1; step <= 3; ++step) {
      r.step = step;
      REQUIRE(writer->Write(r).ok());
      // Read while the writer is still open: nothing waits in a buffer.
      auto records = ReadMetricsFile(path);
      REQUIRE(records.ok());
      REQUIRE(records->size() == static_cast<size_t>(step));
      CHECK(records->back().step == step);
    }
  }
  SECTION("kAppend continues the file") {
    auto writer = MetricsWriter::Open(path, AppendFile::Mode::kAppend);
    REQUIRE(writer.ok());
    r.step = 4;
    REQUIRE(writer->Write(r).ok());
    auto records = ReadMetricsFile(path);
    REQUIRE(records.ok());
    REQUIRE(records->size() == 4);
    CHECK((*records)[3].step == 4);
  }
  SECTION("kTruncate starts it afresh") {
    auto writer = MetricsWriter::Open(path, AppendFile::Mode::kTruncate);
    REQUIRE(writer.ok());
    r.step = 7;
    REQUIRE(writer->Write(r).ok());
    auto records = ReadMetricsFile(path);
    REQUIRE(records.ok());
    REQUIRE(records->size() == 1);
    CHECK((*records)[0].step == 7);
  }
}

TEST_CASE("a killed run keeps every line it finished") {
  const std::string path = testing::FreshTestDir("jsonl_killed") + "/metrics.jsonl";
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto writer = MetricsWriter::Open(path);
    if (!writer.ok()) _exit(1);
    MetricsRecord r = TestRecord();
    for (r.step = 1; r.step <= 3; ++r.step)
      if (!writer->Write(r).ok()) _exit(1);
    std::raise(SIGKILL);  // no destructors, no exit handlers
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFSIGNALED(status));
  auto records = ReadMetricsFile(path);
  REQUIRE(records.ok());
  CHECK(records->size() == 3);
}

TEST_CASE("reading a file skips blank lines and names the file and line of a bad one") {
  const std::string dir = testing::FreshTestDir("jsonl_read");
  const std::string good = Line(TestRecord());
  WriteText(dir + "/ok.jsonl", good + "\n\n" + good);  // the last line has no newline
  auto records = ReadMetricsFile(dir + "/ok.jsonl");
  REQUIRE(records.ok());
  CHECK(records->size() == 2);

  WriteText(dir + "/bad.jsonl", good + "\n" + good.substr(0, good.size() / 2) + "\n" + good + "\n");
  auto bad = ReadMetricsFile(dir + "/bad.jsonl");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kDataLoss);
  CHECK(bad.status().message().rfind(dir + "/bad.jsonl:2: column ", 0) == 0);

  auto missing = ReadMetricsFile(dir + "/missing.jsonl");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK(missing.status().message().find(dir + "/missing.jsonl") != std::string::npos);
}

TEST_CASE("RecordScalars names metrics <split>/<field>") {
  MetricsRecord r = TestRecord();
  std::vector<std::pair<std::string, double>> want = {{"test/loss", 0.25},
                                                      {"test/accuracy", 0.875},
                                                      {"test/samples_per_s", 1234.5},
                                                      {"test/lr", 0.05},
                                                      {"test/perplexity", 1.284}};
  CHECK(RecordScalars(r) == want);
  r.accuracy.reset();
  r.split = Split::kTrain;
  r.extra.clear();
  want = {{"train/loss", 0.25}, {"train/samples_per_s", 1234.5}};
  CHECK(RecordScalars(r) == want);
}

}  // namespace
}  // namespace loom::metrics
