#include "models/mlp.h"

#include <string>

namespace loom::models {

Sym Mlp(Model& m, Sym images, const MlpOptions& opts) {
  Sym h = m.flatten(images);
  for (size_t i = 0; i < opts.hidden.size(); ++i) {
    h = m.relu(m.linear(h, opts.hidden[i], {}, "fc" + std::to_string(i + 1)));
    if (opts.dropout > 0) h = m.dropout(h, opts.dropout);
  }
  return m.linear(h, opts.num_classes, {}, "classifier");
}

}  // namespace loom::models
