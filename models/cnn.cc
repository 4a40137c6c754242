#include "models/cnn.h"

#include <string>

namespace loom::models {

Sym Cnn(Model& m, Sym images, const CnnOptions& opts) {
  Sym h = images;
  for (size_t i = 0; i < opts.channels.size(); ++i) {
    auto stage = m.scope("stage" + std::to_string(i + 1));
    Conv2dOptions same;
    same.padding = {1, 1};
    same.bias = false;  // BatchNorm's shift makes a conv bias redundant
    h = m.batch_norm(m.conv2d(h, opts.channels[i], {3, 3}, same, "conv"), {}, "bn");
    h = m.max_pool2d(m.relu(h), {2, 2});
  }
  h = m.relu(m.linear(m.flatten(h), opts.hidden, {}, "fc"));
  if (opts.dropout > 0) h = m.dropout(h, opts.dropout);
  return m.linear(h, opts.num_classes, {}, "classifier");
}

}  // namespace loom::models
