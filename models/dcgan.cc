#include "models/dcgan.h"

#include <optional>

namespace loom::models {
namespace {

// log2(image_size / 4): the stride-2 layers of each network; 0 if invalid.
int64_t UpsamplingLayers(int64_t image_size) {
  int64_t k = 0;
  for (int64_t s = 4; s < image_size; s *= 2) ++k;
  return (image_size >= 8 && (int64_t{4} << k) == image_size) ? k : 0;
}

// The example's weights_init: N(0, 0.02) for every conv weight.
Sym ConvWeight(Model& m, const std::string& layer, std::vector<int64_t> shape) {
  return m.parameter(layer + "/weight", Shape(shape), InitNormal(0.0, 0.02));
}

// ...and N(1, 0.02) for BatchNorm weights (biases 0).
Sym BatchNorm(Model& m, Sym x, const std::string& layer) {
  BatchNormOptions o;
  o.weight_init = InitNormal(1.0, 0.02);
  return m.batch_norm(x, o, layer);
}

Sym Conv(Model& m, const std::string& op, Sym x, Sym w, int64_t stride, int64_t pad, const std::string& layer) {
  AttrMap a{{"stride", std::vector<int64_t>{stride, stride}},
            {"padding", std::vector<int64_t>{pad, pad}},
            {"dilation", std::vector<int64_t>{1, 1}},
            {"groups", int64_t{1}}};
  return m.op1(op, {x, w}, a, layer);
}

std::string Layer(int64_t index) { return "main/" + std::to_string(index); }

}  // namespace

Status CheckDcganOptions(const DcganOptions& o) {
  if (o.nz < 1) return InvalidArgument("dcgan: nz must be >= 1, got ", o.nz);
  if (o.ngf < 1) return InvalidArgument("dcgan: ngf must be >= 1, got ", o.ngf);
  if (o.ndf < 1) return InvalidArgument("dcgan: ndf must be >= 1, got ", o.ndf);
  if (o.channels < 1) return InvalidArgument("dcgan: channels must be >= 1, got ", o.channels);
  if (UpsamplingLayers(o.image_size) == 0)
    return InvalidArgument("dcgan: image_size must be 4 * 2^k with k >= 1 (8, 16, 32, 64, ...), got ", o.image_size);
  return Status::Ok();
}

Sym DcganGenerator(Model& m, Sym z, const DcganOptions& o, const std::string& name) {
  if (!m.status().ok() || !z.valid()) return {};
  auto scope = m.scope(name);
  const int64_t k = UpsamplingLayers(o.image_size);
  const int64_t batch = m.shape(z)[0];
  Sym h = m.reshape(z, {batch, o.nz, 1, 1});
  int64_t in = o.nz;
  // Layer j (main/3j): to ngf * 2^(k-1-j) channels; the last to the image.
  for (int64_t j = 0; j <= k; ++j) {
    const bool last = j == k;
    const int64_t out = last ? o.channels : o.ngf << (k - 1 - j);
    const std::string layer = Layer(3 * j);
    Sym w = ConvWeight(m, layer, {in, out, 4, 4});  // ConvTranspose2d weight: [in, out, kh, kw]
    h = Conv(m, "ConvTranspose2d", h, w, j == 0 ? 1 : 2, j == 0 ? 0 : 1, layer);
    h = last ? m.tanh(h) : m.relu(BatchNorm(m, h, Layer(3 * j + 1)));
    in = out;
  }
  return h;
}

DcganDiscriminator::DcganDiscriminator(Model& m, const DcganOptions& o, const std::string& name)
    : m_(m), o_(o), name_(name) {
  auto scope = m.scope(name);
  const int64_t k = UpsamplingLayers(o.image_size);
  // main/<i>: k stride-2 convs to ndf * 2^j channels, each followed by
  // LeakyReLU, with a BatchNorm between them from the second on; the output conv.
  int64_t in = o.channels, index = 0;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t out = o.ndf << j;
    conv_layers_.push_back(Layer(index));
    conv_weights_.push_back(ConvWeight(m, conv_layers_.back(), {out, in, 4, 4}));
    ++index;
    if (j > 0) {
      Norm n;
      n.layer = Layer(index++);
      n.weight = m.parameter(n.layer + "/weight", {out}, InitNormal(1.0, 0.02));
      n.bias = m.parameter(n.layer + "/bias", {out}, InitZeros());
      n.running_mean = m.buffer(n.layer + "/running_mean", {out}, InitZeros());
      n.running_var = m.buffer(n.layer + "/running_var", {out}, InitOnes());
      norms_.push_back(n);
    }
    ++index;  // the LeakyReLU
    in = out;
  }
  conv_layers_.push_back(Layer(index));
  conv_weights_.push_back(ConvWeight(m, conv_layers_.back(), {1, in, 4, 4}));
}

Sym DcganDiscriminator::operator()(Sym x) {
  if (!m_.status().ok() || !x.valid()) return {};
  auto scope = m_.scope(name_);
  const int64_t batch = m_.shape(x)[0];
  const size_t k = conv_weights_.size() - 1;
  Sym h = x;
  for (size_t j = 0; j < k; ++j) {
    h = Conv(m_, "Conv2d", h, conv_weights_[j], 2, 1, conv_layers_[j]);
    if (j > 0) {
      // The running statistics this application reads are the previous
      // application's results: the updates happen in order.
      Norm& n = norms_[j - 1];
      AttrMap a{{"training", m_.training()}, {"momentum", 0.1}, {"eps", 1e-5}};
      std::vector<Sym> outs = m_.op("BatchNorm", {h, n.weight, n.bias, n.running_mean, n.running_var}, a, n.layer);
      if (outs.size() < 3) return {};
      h = outs[0];
      if (m_.training()) {
        n.running_mean = outs[1];
        n.running_var = outs[2];
      }
    }
    h = m_.leaky_relu(h, 0.2);
  }
  h = Conv(m_, "Conv2d", h, conv_weights_[k], 1, 0, conv_layers_[k]);  // [B, 1, 1, 1]
  return m_.reshape(h, {batch});
}

void DcganDiscriminator::Finish() {
  if (!m_.training()) return;
  const Graph& g = m_.graph();
  for (const Norm& n : norms_) {
    for (const char* stat : {"running_mean", "running_var"}) {
      const Sym latest = std::string(stat) == "running_mean" ? n.running_mean : n.running_var;
      // The Buffer node this statistic started from.
      auto id = g.FindNode(name_ + "/" + n.layer + "/" + stat);
      if (!id) continue;
      const Sym buffer{g.node(*id).outputs[0]};
      if (latest.id != buffer.id) m_.update_state(buffer, latest);
    }
  }
}

}  // namespace loom::models
