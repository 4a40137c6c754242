// Measured kernel times (a profile) and the cost model that reads them
// (docs/simulator.md). A profile maps a compute task's signature (its op,
// attributes and the part's input and output types: what decides its
// kernel's time on a device) to the times measured for it; `loom profile`
// measures one from the task runtime's trace. Files are lines
//   SECONDS <TAB> SAMPLES <TAB> SIGNATURE [<TAB> FLOPS <TAB> BYTES <TAB> DTYPE]
// (the mean of the samples; a compute task's work, which calibrates the
// roofline), with # comments.
#pragma once

#include <atomic>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "simulator/cost_model.h"

namespace loom {

// "Conv2d {kernel=[3, 3], ...} ([8, 1, 28, 28] f32, [4, 1, 3, 3] f32) -> ([8, 4, 28, 28] f32)";
// "transfer [8, 4, 28, 28] f32"; "all-reduce of 2 [64, 16] f32"; "all-gather of
// 8 [512, 256] f32".
std::string TaskSignature(const TaskGraph& graph, const Task& task);

class Profile {
 public:
  // Errors name FILE:LINE.
  static StatusOr<Profile> Load(const std::string& path);
  static StatusOr<Profile> Parse(const std::string& text, const std::string& origin);
  // The file's text: one line per signature, its mean and sample count.
  std::string ToText() const;

  // `work`: a compute task's (WorkOf), so the profile can calibrate.
  void Add(const std::string& signature, double seconds, const std::optional<TaskWork>& work = std::nullopt);
  // A task's measured time, by its signature (with its work when compute).
  void AddTask(const TaskGraph& graph, const Task& task, double seconds);
  // Every sample of `other` too.
  void Add(const Profile& other);
  // The mean of the signature's samples but those over 3x their median
  // (interruptions), or nothing when it has none.
  std::optional<double> Seconds(const std::string& signature) const;
  size_t size() const { return samples_.size(); }
  // The compute signatures with their work: each its op, work and median.
  std::vector<WorkSample> WorkSamples() const;

 private:
  std::map<std::string, std::vector<double>> samples_;
  std::map<std::string, int64_t> counts_;  // a loaded line's sample count
  std::map<std::string, TaskWork> work_;
};

// The profile's time where it has the task's signature, else the fallback
// model's; counts how often each was used (compute tasks).
class ProfiledCostModel final : public CostModel {
 public:
  ProfiledCostModel(const Profile& profile, const CostModel& fallback) : profile_(profile), fallback_(fallback) {}
  double ComputeSeconds(const TaskGraph& graph, const Task& task) const override;
  std::optional<double> CommunicationSeconds(const TaskGraph& graph, const Task& task) const override;
  int64_t hits() const { return hits_.load(); }
  int64_t misses() const { return misses_.load(); }

 private:
  const Profile& profile_;
  const CostModel& fallback_;
  mutable std::atomic<int64_t> hits_{0}, misses_{0};
};

}  // namespace loom
