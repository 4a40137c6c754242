// DCGAN (Radford et al. 2016) as PyTorch's examples/dcgan builds it: the
// same layers, names (netG/main/<i>, netD/main/<i>), parameter shapes and
// initialisation (weights_init: conv weights N(0, 0.02), BatchNorm weight
// N(1, 0.02) and bias 0), so the counts match the example's models:
// 3,576,704 (generator) and 2,765,568 (discriminator) for nz 100, ngf = ndf
// = 64, 3 channels, 64x64 images.
//
//   Model m;
//   Sym z = m.input("noise", {B, 100, 1, 1});
//   Sym fake = DcganGenerator(m, z, o);           // [B, C, 64, 64] in [-1, 1]
//   DcganDiscriminator netD(m, o);
//   Sym logits = netD(fake);  // [B]: real vs fake, before the sigmoid
//   netD.Finish();
//
// Generator: ConvTranspose2d(nz, ngf*8, 4, 1, 0) to 4x4, then stride-2
// ConvTranspose2d(4, 2, 1) layers halving the channels and doubling the size
// up to image_size, each with BatchNorm + ReLU, the last to `channels` with
// Tanh. Discriminator: the mirror image, Conv2d(4, 2, 1) + LeakyReLU(0.2)
// (BatchNorm from the second layer on) down to 4x4, then Conv2d(ndf*8, 1, 4,
// 1, 0). The example ends with a Sigmoid and nn.BCELoss; here the
// discriminator returns the logit and the loss is BCEWithLogits (the same
// value, computed stably). No convolution has a bias. image_size must be
// 4 * 2^k with k >= 1 (32 for padded Fashion-MNIST; the example's 64 has
// k = 4); ngf * 2^(k-1) and ndf * 2^(k-1) are the widest layers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/model.h"

namespace loom::models {

struct DcganOptions {
  int64_t nz = 100;          // latent size
  int64_t ngf = 64;          // generator width (its last hidden layer)
  int64_t ndf = 64;          // discriminator width (its first layer)
  int64_t channels = 3;      // image channels
  int64_t image_size = 64;   // 4 * 2^k
};

// Checks the options; errors name the bad one.
Status CheckDcganOptions(const DcganOptions& o);

// z [B, nz, 1, 1] (or [B, nz]) -> images [B, channels, image_size, image_size].
Sym DcganGenerator(Model& m, Sym z, const DcganOptions& o, const std::string& name = "netG");
// The discriminator: its parameters are made once and shared by every
// application (a GAN step runs it on real and on generated images). Each
// application normalises with its own batch's statistics, and the BatchNorm
// running statistics are updated once per application in order, as
// PyTorch's modules do; Finish() records the final values as the state
// updates.
class DcganDiscriminator {
 public:
  DcganDiscriminator(Model& m, const DcganOptions& o, const std::string& name = "netD");
  // images [B, channels, image_size, image_size] -> logits [B].
  Sym operator()(Sym x);
  void Finish();

 private:
  struct Norm {
    std::string layer;
    Sym weight, bias, running_mean, running_var;
  };
  Model& m_;
  DcganOptions o_;
  std::string name_;
  std::vector<Sym> conv_weights_;  // k stride-2 convs, then the 4x4 output conv
  std::vector<Norm> norms_;        // before the second..k-th LeakyReLU
  std::vector<std::string> conv_layers_;
};

}  // namespace loom::models
