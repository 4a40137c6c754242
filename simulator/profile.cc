#include "simulator/profile.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/text_proto.h"

namespace loom {

std::string TaskSignature(const TaskGraph& graph, const Task& task) {
  if (task.kind != TaskKind::kCompute) {
    const Piece& p = graph.pieces[static_cast<size_t>(task.outputs[0])];
    const std::string what = StrCat(p.region.shape().ToString(), " ", DTypeName(graph.graph.type(p.value).dtype));
    return task.kind == TaskKind::kTransfer ? "transfer " + what : StrCat("all-reduce of ", task.group.size(), " ", what);
  }
  const Node& n = graph.graph.node(task.node);
  std::string s = n.op + " " + task.attrs.ToString() + " (";
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
    const size_t tab1 = line.find('\t'), tab2 = tab1 == std::string::npos ? tab1 : line.find('\t', tab1 + 1);
    if (tab2 == std::string::npos)
      return InvalidArgument(origin, ":", number, ": expected SECONDS<TAB>SAMPLES<TAB>SIGNATURE, got '", line, "'");
    double seconds = 0;
    int64_t samples = 0;
    try {
      size_t used = 0;
      seconds = std::stod(line.substr(0, tab1), &used);
      if (used != tab1) throw std::invalid_argument("trailing");
      samples = std::stoll(line.substr(tab1 + 1, tab2 - tab1 - 1), &used);
      if (used != tab2 - tab1 - 1) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      return InvalidArgument(origin, ":", number, ": SECONDS and SAMPLES must be numbers, got '", line, "'");
    }
    if (!(seconds >= 0) || !std::isfinite(seconds) || samples < 1)
      return InvalidArgument(origin, ":", number, ": seconds must be finite and >= 0 and samples >= 1, got '", line,
                             "'");
    const std::string signature = line.substr(tab2 + 1);
    if (p.samples_.count(signature)) return InvalidArgument(origin, ":", number, ": a second line for '", signature, "'");
    p.samples_[signature] = {seconds};
    p.counts_[signature] = samples;
  }
  return p;
}

std::string Profile::ToText() const {
  std::ostringstream s;
  s.precision(9);
  s << "# loom profile: median seconds, samples, task signature (simulator/profile.h)\n";
  for (const auto& [signature, times] : samples_) {
    auto count = counts_.find(signature);
    s << *Seconds(signature) << "\t" << (count != counts_.end() ? count->second : static_cast<int64_t>(times.size()))
      << "\t" << signature << "\n";
  }
  return s.str();
}

void Profile::Add(const std::string& signature, double seconds) {
  samples_[signature].push_back(seconds);
  counts_.erase(signature);  // measured here: its own samples count
}

std::optional<double> Profile::Seconds(const std::string& signature) const {
  auto it = samples_.find(signature);
  if (it == samples_.end() || it->second.empty()) return std::nullopt;
  std::vector<double> t = it->second;
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
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
