// Dead code elimination: drops nodes whose results reach none of the graph's
// roots (named outputs, state updates, gradients).
#pragma once

#include <string>

#include "graph/pass.h"

namespace loom {

struct DceOptions {
  // Input, Parameter and Buffer nodes define the graph's interface (what is
  // fed, what is trained and checkpointed), so they stay by default even
  // when unused. A source that a state update or gradient names always stays.
  bool remove_unused_sources = false;
};

class DeadCodeElimination : public Pass {
 public:
  explicit DeadCodeElimination(DceOptions options = {}) : options_(options) {}
  std::string name() const override { return "dce"; }
  StatusOr<bool> Run(Graph* graph) override;

 private:
  DceOptions options_;
};

}  // namespace loom
