#include "train/metrics/event_writer.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "train/metrics/masked_crc.h"
#include "train/metrics/run_logger.h"
#include "train/metrics/test_dir.h"

namespace loom::metrics {
namespace {

namespace fs = std::filesystem;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::vector<tb::Event> ReadOk(const std::string& path) {
  auto events = ReadEventFile(path);
  INFO(events.status().ToString());
  REQUIRE(events.ok());
  return *events;
}

// Two records written by TensorBoard's own Python RecordWriter:
//   Event{wall_time: 1700000000.5, file_version: "brain.Event:2"}
//   Event{wall_time: 1700000001.25, step: 42, summary {value {tag: "train/loss" simple_value: 0.5}
//                                                      value {tag: "test/accuracy" simple_value: 0}}}
const unsigned char kTensorBoardRecords[] = {
    0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xa3, 0x7f, 0x4b, 0x22, 0x09, 0x00, 0x00, 0x20, 0x40, 0xfc, 0x54,
    0xd9, 0x41, 0x1a, 0x0d, 0x62, 0x72, 0x61, 0x69, 0x6e, 0x2e, 0x45, 0x76, 0x65, 0x6e, 0x74, 0x3a, 0x32, 0x2b, 0x35,
    0x31, 0x10, 0x36, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x4f, 0x57, 0x8c, 0xef, 0x09, 0x00, 0x00, 0x50, 0x40,
    0xfc, 0x54, 0xd9, 0x41, 0x10, 0x2a, 0x2a, 0x29, 0x0a, 0x11, 0x0a, 0x0a, 0x74, 0x72, 0x61, 0x69, 0x6e, 0x2f, 0x6c,
    0x6f, 0x73, 0x73, 0x15, 0x00, 0x00, 0x00, 0x3f, 0x0a, 0x14, 0x0a, 0x0d, 0x74, 0x65, 0x73, 0x74, 0x2f, 0x61, 0x63,
    0x63, 0x75, 0x72, 0x61, 0x63, 0x79, 0x15, 0x00, 0x00, 0x00, 0x00, 0xca, 0xe3, 0x3a, 0xb8,
};

TEST_CASE("records and events are byte for byte what TensorBoard writes") {
  tb::Event first;
  first.set_wall_time(1700000000.5);
  first.set_file_version(kEventFileVersion);
  tb::Event scalars;
  scalars.set_wall_time(1700000001.25);
  scalars.set_step(42);
  auto* loss = scalars.mutable_summary()->add_value();
  loss->set_tag("train/loss");
  loss->set_simple_value(0.5f);
  auto* accuracy = scalars.mutable_summary()->add_value();
  accuracy->set_tag("test/accuracy");
  accuracy->set_simple_value(0.0f);  // a zero must still be written
  const std::string ours = FrameRecord(first.SerializeAsString()) + FrameRecord(scalars.SerializeAsString());
  const std::string theirs(reinterpret_cast<const char*>(kTensorBoardRecords), sizeof(kTensorBoardRecords));
  CHECK(ours == theirs);

  // And the writer produces the same scalar record.
  const std::string dir = testing::FreshTestDir("event_golden");
  auto writer = EventWriter::Create(dir);
  REQUIRE(writer.ok());
  REQUIRE(writer->AddScalars(42, {{"train/loss", 0.5}, {"test/accuracy", 0.0}}, 1700000001.25).ok());
  const std::string file = ReadBytes(writer->path());
  const std::string second_record = theirs.substr(12 + 0x18 + 4);
  REQUIRE(file.size() > second_record.size());
  CHECK(file.substr(file.size() - second_record.size()) == second_record);
}

TEST_CASE("an event file is named for TensorBoard and starts with the file version") {
  const std::string dir = testing::FreshTestDir("event_name") + "/run";  // created by the writer
  const double before = std::floor(WallTimeNow());
  auto writer = EventWriter::Create(dir);
  REQUIRE(writer.ok());
  const double after = WallTimeNow();
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof(host) - 1) == 0);
  std::smatch m;
  const std::string name = fs::path(writer->path()).filename().string();
  REQUIRE(std::regex_match(name, m, std::regex(R"(events\.out\.tfevents\.(\d{10})\.(.+))")));
  const double stamp = std::stod(m[1].str());
  CHECK(stamp >= before);
  CHECK(stamp <= after);
  CHECK(m[2].str() == host);
  CHECK(fs::path(writer->path()).parent_path() == fs::path(dir));

  std::vector<tb::Event> events = ReadOk(writer->path());
  REQUIRE(events.size() == 1);
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[0].wall_time() >= before);
  CHECK(events[0].wall_time() <= after);
}

TEST_CASE("scalars read back with their tags, steps and values, zero included") {
  const std::string dir = testing::FreshTestDir("event_scalars");
  auto writer = EventWriter::Create(dir);
  REQUIRE(writer.ok());
  REQUIRE(writer->AddScalar("train/loss", 0, 2.5).ok());
  REQUIRE(writer->AddScalars(100, {{"train/loss", 0.0}, {"train/lr", 0.05}}, 1234.5).ok());
  REQUIRE(writer->AddScalar("train/loss", 200, std::nan("")).ok());
  CHECK_FALSE(writer->AddScalar("", 300, 1).ok());

  std::vector<tb::Event> events = ReadOk(writer->path());
  REQUIRE(events.size() == 4);
  CHECK(events[1].step() == 0);
  REQUIRE(events[1].summary().value_size() == 1);
  CHECK(events[1].summary().value(0).tag() == "train/loss");
  CHECK(events[1].summary().value(0).simple_value() == 2.5f);
  CHECK(events[2].step() == 100);
  CHECK(events[2].wall_time() == 1234.5);
  REQUIRE(events[2].summary().value_size() == 2);
  CHECK(events[2].summary().value(0).value_case() == tb::Summary::Value::kSimpleValue);
  CHECK(events[2].summary().value(0).simple_value() == 0.0f);
  CHECK(events[2].summary().value(1).tag() == "train/lr");
  CHECK(events[2].summary().value(1).simple_value() == 0.05f);
  CHECK(std::isnan(events[3].summary().value(0).simple_value()));
}

TEST_CASE("the reader detects any corrupted byte and a truncated record") {
  const std::string dir = testing::FreshTestDir("event_corrupt");
  auto writer = EventWriter::Create(dir);
  REQUIRE(writer.ok());
  REQUIRE(writer->AddScalar("train/loss", 7, 0.75).ok());
  const std::string path = writer->path();
  const std::string good = ReadBytes(path);

  // A flipped bit anywhere is caught: in the length by the length CRC, in
  // the data by the data CRC, in either CRC by the CRC no longer matching.
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    WriteBytes(path, bad);
    auto events = ReadEventFile(path);
    INFO("byte " << i);
    REQUIRE_FALSE(events.ok());
    CHECK(events.status().code() == StatusCode::kDataLoss);
    CHECK(events.status().message().rfind(path + ": record ", 0) == 0);
    CHECK(events.status().message().find("CRC mismatch") != std::string::npos);
  }

  // The message names the record and what failed.
  WriteBytes(path, good);
  std::vector<tb::Event> events = ReadOk(path);
  REQUIRE(events.size() == 2);
  const size_t second = good.size() - FrameRecord(events[1].SerializeAsString()).size();
  std::string bad = good;
  bad[second + 12] = static_cast<char>(bad[second + 12] ^ 1);  // first data byte of record 1
  WriteBytes(path, bad);
  auto data_crc = ReadEventFile(path);
  CHECK(data_crc.status().message().rfind(path + ": record 1 at byte " + std::to_string(second) + ": data CRC mismatch",
                                          0) == 0);

  WriteBytes(path, good.substr(0, good.size() - 1));
  auto truncated = ReadEventFile(path);
  REQUIRE_FALSE(truncated.ok());
  CHECK(truncated.status().message().find("record 1 at byte " + std::to_string(second) + ": truncated") !=
        std::string::npos);
  WriteBytes(path, good.substr(0, second + 5));
  CHECK(ReadEventFile(path).status().message().find("truncated header (5 of 12 bytes)") != std::string::npos);

  // A record whose CRCs hold but whose data is not an Event.
  WriteBytes(path, good.substr(0, second) + FrameRecord("\xff\xff\xff"));
  CHECK(ReadEventFile(path).status().message().find("record 1 at byte " + std::to_string(second) +
                                                    ": data is not an Event message") != std::string::npos);
}

TEST_CASE("two writers in one directory never share a file") {
  const std::string dir = testing::FreshTestDir("event_two");
  auto a = EventWriter::Create(dir);
  auto b = EventWriter::Create(dir);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->path() != b->path());
  REQUIRE(a->AddScalar("x", 1, 1).ok());
  REQUIRE(b->AddScalar("x", 1, 2).ok());
  auto files = FindEventFiles(dir);
  REQUIRE(files.ok());
  CHECK(files->size() == 2);
  for (const std::string& f : *files) CHECK(ReadOk(f).size() == 2);
}

TEST_CASE("replica writers live in replica_<r>/, one TensorBoard run each") {
  const std::string dir = testing::FreshTestDir("event_replicas");
  for (int64_t r = 0; r < 3; ++r) {
    CHECK(ReplicaEventDir(dir, r) == dir + "/replica_" + std::to_string(r));
    auto writer = EventWriter::Create(ReplicaEventDir(dir, r));
    REQUIRE(writer.ok());
    REQUIRE(writer->AddScalar("train/loss", 10, static_cast<double>(r)).ok());
  }
  for (int64_t r = 0; r < 3; ++r) {
    auto files = FindEventFiles(dir + "/replica_" + std::to_string(r));
    REQUIRE(files.ok());
    REQUIRE(files->size() == 1);
    std::vector<tb::Event> events = ReadOk(files->front());
    REQUIRE(events.size() == 2);
    CHECK(events[1].summary().value(0).simple_value() == static_cast<float>(r));
  }
  CHECK(FindEventFiles(dir)->empty());  // nothing directly in the run directory
  auto missing = FindEventFiles(dir + "/nope");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find(dir + "/nope") != std::string::npos);
}

TEST_CASE("the run logger writes metrics.jsonl and each replica's event file") {
  const std::string dir = testing::FreshTestDir("run_logger");
  RunLoggerOptions options;
  options.replicas = 2;
  auto logger = RunLogger::Create(dir, options);
  REQUIRE(logger.ok());
  MetricsRecord r;
  r.replica = 1;
  r.epoch = 1;
  r.step = 50;
  r.loss = 0.5;
  r.samples_per_s = 1000;
  r.extra = {{"lr", 0.1}};
  REQUIRE(logger->Log(r).ok());
  r.replica = 0;
  r.split = Split::kTest;
  r.accuracy = 0.75;
  r.extra.clear();
  REQUIRE(logger->Log(r).ok());
  r.replica = 2;
  auto bad = logger->Log(r);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.message().find("replica 2, but the run has 2 replica(s)") != std::string::npos);

  auto records = ReadMetricsFile(dir + "/metrics.jsonl");
  REQUIRE(records.ok());
  REQUIRE(records->size() == 2);
  CHECK((*records)[0].replica == 1);
  CHECK((*records)[1].accuracy == 0.75);

  REQUIRE(logger->event_paths().size() == 2);
  std::vector<tb::Event> replica1 = ReadOk(logger->event_paths()[1]);
  REQUIRE(replica1.size() == 2);
  CHECK(replica1[1].step() == 50);
  REQUIRE(replica1[1].summary().value_size() == 3);
  CHECK(replica1[1].summary().value(0).tag() == "train/loss");
  CHECK(replica1[1].summary().value(1).tag() == "train/samples_per_s");
  CHECK(replica1[1].summary().value(2).tag() == "train/lr");
  std::vector<tb::Event> replica0 = ReadOk(logger->event_paths()[0]);
  REQUIRE(replica0.size() == 2);
  CHECK(replica0[1].summary().value(1).tag() == "test/accuracy");
  CHECK(fs::path(logger->event_paths()[0]).parent_path() == fs::path(dir) / "replica_0");

  SECTION("one replica writes its events in the run directory; resume appends") {
    const std::string single = testing::FreshTestDir("run_logger_single");
    for (int run = 0; run < 2; ++run) {
      RunLoggerOptions one;
      if (run == 1) one.resume_step = 0;
      auto l = RunLogger::Create(single, one);
      REQUIRE(l.ok());
      REQUIRE(l->Log(MetricsRecord()).ok());
      CHECK(fs::path(l->event_paths().at(0)).parent_path() == fs::path(single));
    }
    CHECK(ReadMetricsFile(single + "/metrics.jsonl")->size() == 2);
    CHECK(FindEventFiles(single)->size() == 2);
  }
  SECTION("a resume that logs nothing adds no event file") {
    RunLoggerOptions resumed;
    resumed.replicas = 2;
    resumed.resume_step = 50;
    auto l = RunLogger::Create(dir, resumed);
    REQUIRE(l.ok());
    CHECK(l->event_paths().empty());
    CHECK(FindEventFiles(dir + "/replica_0")->size() == 1);
    CHECK(ReadMetricsFile(dir + "/metrics.jsonl")->size() == 2);
  }
  SECTION("tensorboard off writes no event files; a fresh run empties metrics.jsonl") {
    RunLoggerOptions off;
    off.tensorboard = false;
    auto l = RunLogger::Create(dir, off);
    REQUIRE(l.ok());
    CHECK(l->event_paths().empty());
    CHECK(ReadMetricsFile(dir + "/metrics.jsonl")->empty());
    CHECK(FindEventFiles(dir)->empty());
  }
}

TEST_CASE("a resume keeps metrics.jsonl up to its checkpoint's step and drops an unfinished line") {
  const std::string dir = testing::FreshTestDir("run_logger_resume");
  const std::string path = dir + "/metrics.jsonl";
  {
    auto l = RunLogger::Create(dir, RunLoggerOptions());
    REQUIRE(l.ok());
    for (int64_t step : {50, 100, 150, 200}) {
      MetricsRecord r;
      r.step = step;
      r.loss = 1.0 / static_cast<double>(step);
      REQUIRE(l->Log(r).ok());
    }
  }
  {  // a kill in the middle of a write
    auto f = AppendFile::Open(path, AppendFile::Mode::kAppend);
    REQUIRE(f.ok());
    REQUIRE(f->Append("{\"replica\": 0, \"epo").ok());
  }
  RunLoggerOptions resumed;
  resumed.resume_step = 100;
  auto l = RunLogger::Create(dir, resumed);
  REQUIRE(l.ok());
  CHECK(l->resume_note().find("dropped 2 record(s) of later steps") != std::string::npos);
  CHECK(l->resume_note().find("unfinished last line") != std::string::npos);
  MetricsRecord again;
  again.step = 150;
  again.loss = 1.0 / 150;
  REQUIRE(l->Log(again).ok());
  auto records = ReadMetricsFile(path);
  REQUIRE(records.ok());
  REQUIRE(records->size() == 3);
  CHECK((*records)[0].step == 50);
  CHECK((*records)[1].step == 100);
  CHECK((*records)[2].step == 150);  // once, not twice, and not glued to the cut line

  SECTION("a file with nothing to drop is left as it is") {
    auto note = TruncateMetricsAfter(path, 150);
    REQUIRE(note.ok());
    CHECK(note->empty());
    CHECK(TruncateMetricsAfter(dir + "/absent.jsonl", 0).ok());
  }
}

}  // namespace
}  // namespace loom::metrics
