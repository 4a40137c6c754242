// loom's embedding API in one include: `#include <loom/loom.h>`.
//   loom::Trainer    train/trainer.h    a training run, step by step or whole
//   loom::Predictor  train/predictor.h  a trained model served from a checkpoint
//   loom::Model      graph/model.h      the C++ model API (for a NetworkBuilder)
//   loom::Status, loom::Tensor          core/status.h, core/tensor.h
// docs/embedding.md: the guide, a complete service, thread-safety and
// lifetime rules.
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "graph/model.h"
#include "train/predictor.h"
#include "train/trainer.h"
