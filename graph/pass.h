// Graph passes (XLA's HloPassInterface / HloPassPipeline): a pass rewrites a
// graph in place and says whether it changed anything; a pipeline runs
// passes in order with the verifier before the first and after each one, so
// a broken invariant is blamed on the pass that broke it.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "graph/ir.h"

namespace loom {

class Pass {
 public:
  virtual ~Pass() = default;
  // Short, stable identifier: used to disable the pass and to name dumps.
  virtual std::string name() const = 0;
  // Rewrites `graph` in place; true when anything changed.
  virtual StatusOr<bool> Run(Graph* graph) = 0;
};

// What a dump receives after a pass ran.
struct PassDump {
  std::string pipeline;
  std::string pass;
  int index = 0;  // 1-based position of the pass in the pipeline
  bool changed = false;
  const Graph* graph = nullptr;
};

struct PassPipelineOptions {
  // Passes with these names are skipped (every pass of that name).
  std::set<std::string> disabled_passes;
  // When set, Graph::ToString() is written after each pass that ran to
  // "<dir>/<pipeline>.<NN>.<pass>.txt" (the directory is created).
  std::string dump_dir;
  // When set, called after each pass that ran.
  std::function<void(const PassDump&)> dump_callback;
};

// A pipeline is itself a pass, so pipelines nest.
class PassPipeline : public Pass {
 public:
  explicit PassPipeline(std::string name, PassPipelineOptions options = {})
      : name_(std::move(name)), options_(std::move(options)) {}

  template <typename T, typename... Args>
  T& AddPass(Args&&... args) {
    auto pass = std::make_unique<T>(std::forward<Args>(args)...);
    T& ref = *pass;
    passes_.push_back(std::move(pass));
    return ref;
  }
  void AddPass(std::unique_ptr<Pass> pass) { passes_.push_back(std::move(pass)); }

  std::string name() const override { return name_; }
  // Runs the enabled passes in order; true when any of them changed the
  // graph. Errors name the pipeline and the pass (or say that the graph was
  // invalid before any pass ran).
  StatusOr<bool> Run(Graph* graph) override;

  std::vector<std::string> PassNames() const;
  const PassPipelineOptions& options() const { return options_; }

 private:
  Status Dump(const PassDump& dump) const;

  std::string name_;
  PassPipelineOptions options_;
  std::vector<std::unique_ptr<Pass>> passes_;
};

}  // namespace loom
