// A small command-line flag parser: --name value, --name=value, and boolean
// --name. Unknown flags and bad values are errors that name the flag.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/parse.h"
#include "core/status.h"

namespace loom::tools {

class Flags {
 public:
  // `spec`: flag name -> help text; names of boolean flags end with '?'.
  explicit Flags(std::map<std::string, std::string> spec) : spec_(std::move(spec)) {}
  Status Parse(const std::vector<std::string>& args);

  bool Has(const std::string& name) const { return values_.count(name) != 0; }
  std::string Str(const std::string& name, const std::string& def) const;
  // Int: a base-10 int64; Unsigned: a uint64, as a config's uint64 fields
  // take (a negative value is "must be >= 0, got -1"); Float: a finite
  // double. Values out of range are errors, not clamped.
  StatusOr<int64_t> Int(const std::string& name, int64_t def) const;
  StatusOr<uint64_t> Unsigned(const std::string& name, uint64_t def) const;
  StatusOr<double> Float(const std::string& name, double def) const;
  // A positive time in seconds: "500ms", "30s", "2m", "1.5h" or plain
  // seconds ("--budget '2x': expected a positive time such as ...").
  StatusOr<double> Seconds(const std::string& name, const std::string& def) const;
  // A comma-separated list of positive integers ("1,2,4"); errors name the
  // flag, the text and the bad item.
  StatusOr<std::vector<int64_t>> PositiveInts(const std::string& name, const std::vector<int64_t>& def) const;
  // The task runtime's devices: a count of CPU devices ("2") or a device
  // list (core/device.h ParseDevices: "cpu:2", "cuda:0x2", "cuda:0,1").
  StatusOr<std::vector<Device>> Devices(const std::string& name, int64_t default_count) const;
  // A comma-separated list of names; empty items are dropped.
  std::vector<std::string> List(const std::string& name, const std::vector<std::string>& def) const;
  bool Bool(const std::string& name) const { return values_.count(name) != 0; }
  int verbosity() const { return verbosity_; }
  bool help_requested() const { return help_; }
  std::string Help() const;

 private:
  std::map<std::string, std::string> spec_;
  std::map<std::string, std::string> values_;
  int verbosity_ = 0;
  bool help_ = false;
};

}  // namespace loom::tools
