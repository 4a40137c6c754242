// `loom train` for a zoo GAN (dcgan): PyTorch's examples/dcgan loop. Each
// iteration draws a noise batch z and runs
//   1. a discriminator step: loss BCE(D(x), 1) + BCE(D(G(z)), 0), updating
//      only netD with the discriminator's optimizer;
//   2. a generator step on the same z: loss BCE(D(G(z)), 1) through the
//      updated netD, updating only netG with the generator's optimizer.
// The two steps are two executors; after each step the tensors they share
// (both networks' parameters and BatchNorm statistics) are copied to the
// other, so every update sees the latest values, as in the example.
// Fused runs (replicas or a sweep) fuse both step graphs (graph/fusion.h):
// R GANs train in one pass with per-replica learning rates and seeds, on
// the same real batches and noise.
//
// The run folder holds config.pbtxt, metrics.jsonl (train lines: loss = the
// discriminator's, loss_g, d_real = mean D(x), d_fake = mean D(G(z))),
// TensorBoard events, checkpoints at each epoch's end and
// samples/epoch_<n>[_r<replica>].pgm (.ppm for colour): an 8x8 grid of G's
// images for a fixed noise batch, BatchNorm in evaluation mode.
#pragma once

#include <string>

#include "train/training_run.h"

namespace loom::train {

// Called by RunTraining for GAN models, once `out_dir` is settled and checked.
StatusOr<RunResult> RunGanTraining(const RunOptions& options, const std::string& out_dir);

}  // namespace loom::train
