#include "simulator/profile.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <type_traits>

#include "core/text_proto.h"

namespace loom {

std::string TaskSignature(const TaskGraph& graph, const Task& task) {
  if (task.kind != TaskKind::kCompute) {
    const Piece& p = graph.pieces[static_cast<size_t>(task.outputs[0])];
    const std::string what = StrCat(p.region.shape().ToString(), " ", DTypeName(graph.graph.type(p.value).dtype));
    if (task.kind == TaskKind::kTransfer) return "transfer " + what;
    return StrCat(TaskKindName(task.kind), " of ", task.group.size(), " ", what);
  }
  const Node& n = graph.graph.node(task.node);
  std::string s = n.op + " " + task.attrs->ToString() + " (";
  for (size_t i = 0; i < task.inputs.size(); ++i)
    s += StrCat(i ? ", " : "", task.inputs[i].region.shape().ToString(), " ",
                DTypeName(graph.graph.type(task.inputs[i].value).dtype));
  s += ") -> (";
  for (size_t i = 0; i < task.outputs.size(); ++i) {
    const Piece& p = graph.pieces[static_cast<size_t>(task.outputs[i])];
    s += StrCat(i ? ", " : "", p.region.shape().ToString(), " ", DTypeName(graph.graph.type(p.value).dtype));
  }
  return s + ")";
}

StatusOr<Profile> Profile::Load(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path, "profile"));
  return Parse(text, path);
}

StatusOr<Profile> Profile::Parse(const std::string& text, const std::string& origin) {
  Profile p;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> fields;
    for (size_t start = 0;;) {
      const size_t tab = line.find('\t', start);
      fields.push_back(line.substr(start, tab == std::string::npos ? tab : tab - start));
      if (tab == std::string::npos) break;
      start = tab + 1;
    }
    if (fields.size() != 3 && fields.size() != 6)
      return InvalidArgument(origin, ":", number,
                             ": expected SECONDS<TAB>SAMPLES<TAB>SIGNATURE[<TAB>FLOPS<TAB>BYTES<TAB>DTYPE], got '", line,
                             "'");
    auto number_in = [](const std::string& field, auto* value) {
      try {
        size_t used = 0;
        if constexpr (std::is_same_v<std::remove_pointer_t<decltype(value)>, double>) {
          *value = std::stod(field, &used);
        } else {
          *value = std::stoll(field, &used);
        }
        return used == field.size();
      } catch (const std::exception&) {
        return false;
      }
    };
    double seconds = 0;
    int64_t samples = 0;
    if (!number_in(fields[0], &seconds) || !number_in(fields[1], &samples))
      return InvalidArgument(origin, ":", number, ": SECONDS and SAMPLES must be numbers, got '", line, "'");
    if (!(seconds >= 0) || !std::isfinite(seconds) || samples < 1)
      return InvalidArgument(origin, ":", number, ": seconds must be finite and >= 0 and samples >= 1, got '", line,
                             "'");
    const std::string& signature = fields[2];
    if (p.samples_.count(signature)) return InvalidArgument(origin, ":", number, ": a second line for '", signature, "'");
    if (fields.size() == 6) {
      TaskWork w;
      StatusOr<DType> dtype = ParseDType(fields[5]);
      if (!number_in(fields[3], &w.flops) || !number_in(fields[4], &w.bytes) || !(w.flops >= 0) || !(w.bytes >= 0) ||
          !dtype.ok())
        return InvalidArgument(origin, ":", number, ": FLOPS and BYTES must be numbers >= 0 and DTYPE a type, got '",
                               line, "'");
      w.dtype = *dtype;
      p.work_[signature] = w;
    }
    p.samples_[signature] = {seconds};
    p.counts_[signature] = samples;
  }
  return p;
}

std::string Profile::ToText() const {
  std::ostringstream s;
  s.precision(9);
  s << "# loom profile: mean seconds, samples, task signature[, its FLOPs, bytes and element type] "
       "(simulator/profile.h)\n";
  for (const auto& [signature, times] : samples_) {
    auto count = counts_.find(signature);
    s << *Seconds(signature) << "\t" << (count != counts_.end() ? count->second : static_cast<int64_t>(times.size()))
      << "\t" << signature;
    auto work = work_.find(signature);
    if (work != work_.end())
      s << "\t" << work->second.flops << "\t" << work->second.bytes << "\t" << DTypeName(work->second.dtype);
    s << "\n";
  }
  return s.str();
}

void Profile::Add(const std::string& signature, double seconds, const std::optional<TaskWork>& work) {
  samples_[signature].push_back(seconds);
  counts_.erase(signature);  // measured here: its own samples count
  if (work) work_[signature] = *work;
}

void Profile::AddTask(const TaskGraph& graph, const Task& task, double seconds) {
  Add(TaskSignature(graph, task), seconds,
      task.kind == TaskKind::kCompute ? std::optional<TaskWork>(WorkOf(task)) : std::nullopt);
}

void Profile::Add(const Profile& other) {
  for (const auto& [signature, times] : other.samples_) {
    std::vector<double>& mine = samples_[signature];
    mine.insert(mine.end(), times.begin(), times.end());
    counts_.erase(signature);
  }
  for (const auto& [signature, work] : other.work_) work_[signature] = work;
}

std::vector<WorkSample> Profile::WorkSamples() const {
  std::vector<WorkSample> out;
  for (const auto& [signature, work] : work_)
    out.push_back({signature.substr(0, signature.find(' ')), work, *Seconds(signature)});
  return out;
}

std::optional<double> Profile::Seconds(const std::string& signature) const {
  auto it = samples_.find(signature);
  if (it == samples_.end() || it->second.empty()) return std::nullopt;
  // A step is a sum of task times, and a sum of right-skewed times is
  // predicted by their means, not their medians (which fall short of it);
  // samples over 3x the median are interruptions, not the kernel, and are
  // left out.
  std::vector<double> t = it->second;
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  const double median = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
  double sum = 0;
  size_t kept = 0;
  for (double x : t)
    if (x <= 3 * median) sum += x, ++kept;
  return sum / static_cast<double>(kept);
}

std::optional<double> ProfiledCostModel::CommunicationSeconds(const TaskGraph& graph, const Task& task) const {
  return profile_.Seconds(TaskSignature(graph, task));
}

double ProfiledCostModel::ComputeSeconds(const TaskGraph& graph, const Task& task) const {
  if (std::optional<double> s = profile_.Seconds(TaskSignature(graph, task))) {
    ++hits_;
    return *s;
  }
  ++misses_;
  return fallback_.ComputeSeconds(graph, task);
}

}  // namespace loom
