#include "train/checkpoint/executor_state.h"

#include <map>
#include <optional>
#include <sstream>

namespace loom {

namespace {

// Tensor name -> "<dtype> <shape>", the unit that fingerprints and checks compare.
using SpecMap = std::map<std::string, std::string>;

std::string TypeString(DType dtype, const Shape& shape) { return StrCat(DTypeName(dtype), " ", shape.ToString()); }

SpecMap SpecsOf(const std::map<std::string, Tensor>& tensors) {
  SpecMap specs;
  for (const auto& [name, t] : tensors) specs[name] = TypeString(t.dtype(), t.shape());
  return specs;
}

SpecMap SpecsOf(const Graph& graph) {
  SpecMap specs;
  for (const Node& n : graph.nodes()) {
    if (!IsStateOp(n.op)) continue;
    const TensorType& t = graph.type(n.outputs[0]);
    specs[n.name] = TypeString(t.dtype, t.shape);
  }
  return specs;
}

// The inverse of ModelFingerprint; nullopt for text it did not write.
std::optional<SpecMap> ParseFingerprint(const std::string& text) {
  SpecMap specs;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    size_t tab = line.find('\t');
    if (tab == std::string::npos || tab == 0) return std::nullopt;
    if (!specs.emplace(line.substr(0, tab), line.substr(tab + 1)).second) return std::nullopt;
  }
  return specs;
}

std::string Describe(const Checkpoint& c) {
  return c.source.empty() ? std::string("the checkpoint") : "checkpoint '" + c.source + "'";
}

// The first difference in name order, or OK.
Status CompareSpecs(const SpecMap& saved, const SpecMap& model, const Checkpoint& c) {
  auto s = saved.begin();
  auto m = model.begin();
  while (s != saved.end() || m != model.end()) {
    if (m == model.end() || (s != saved.end() && s->first < m->first))
      return FailedPrecondition(Describe(c), " does not fit this model: tensor '", s->first, "' (", s->second,
                                ") is in the checkpoint but not in the model");
    if (s == saved.end() || m->first < s->first)
      return FailedPrecondition(Describe(c), " does not fit this model: tensor '", m->first, "' (", m->second,
                                ") of the model is missing from the checkpoint");
    if (s->second != m->second)
      return FailedPrecondition(Describe(c), " does not fit this model: tensor '", s->first, "' is ", s->second,
                                " in the checkpoint but ", m->second, " in the model");
    ++s;
    ++m;
  }
  return Status::Ok();
}

}  // namespace

std::string ModelFingerprint(const Graph& graph) {
  std::string text;
  for (const auto& [name, type] : SpecsOf(graph)) text += name + "\t" + type + "\n";
  return text;
}

StatusOr<Checkpoint> CaptureExecutorState(const StepRunner& executor) {
  Checkpoint c;
  for (const std::string& name : executor.StateNames()) {
    // A copy even on the host: the executor overwrites its state every step.
    StatusOr<Tensor> t = executor.GetState(name);
    if (!t.ok()) return t.status().WithContext("capturing state '" + name + "'");
    StatusOr<Tensor> host = t->To(Device::Cpu());
    if (!host.ok()) return host.status().WithContext("capturing state '" + name + "'");
    c.tensors.emplace(name, *host);
  }
  c.position.executor_step = executor.step();
  c.model_fingerprint = ModelFingerprint(executor.graph());
  return c;
}

Status RestoreExecutorState(const Checkpoint& checkpoint, StepRunner* executor) {
  if (!checkpoint.model_fingerprint.empty()) {
    const std::string mine = ModelFingerprint(executor->graph());
    if (checkpoint.model_fingerprint != mine) {
      if (std::optional<SpecMap> saved = ParseFingerprint(checkpoint.model_fingerprint))
        LOOM_RETURN_IF_ERROR(CompareSpecs(*saved, SpecsOf(executor->graph()), checkpoint));
      return FailedPrecondition(Describe(checkpoint),
                                " does not fit this model: its model fingerprint differs from this model's");
    }
  }
  // The tensors are what gets copied, so they are checked even when the
  // fingerprints agree (a hand-built checkpoint may not match its own).
  LOOM_RETURN_IF_ERROR(CompareSpecs(SpecsOf(checkpoint.tensors), SpecsOf(executor->graph()), checkpoint));
  for (const auto& [name, t] : checkpoint.tensors) {
    Status s = executor->SetState(name, t);
    if (!s.ok()) return s.WithContext("restoring " + Describe(checkpoint));
  }
  executor->SetStep(checkpoint.position.executor_step);
  return Status::Ok();
}

}  // namespace loom
