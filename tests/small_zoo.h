// The zoo's models at a reduced size, with a fixed batch: what the
// zoo-wide tests (fusion, parallel strategies) train.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "models/zoo.h"

namespace loom::testing {

struct SmallModel {
  std::string name;
  std::map<std::string, std::string> args;
  models::DataSpec data;  // per-example input and target; num_classes is kClasses
  double step_lr = 0.01;  // the SGD step that must lower the loss on ZooBatch
};

constexpr int64_t kZooBatch = 2, kClasses = 5;

// f32 examples of `shape` with one class each.
inline models::DataSpec Features(const Shape& shape) { return {shape, DType::kF32, Shape{}, kClasses}; }
// Token windows of length t whose targets are t tokens (vocabulary kClasses).
inline models::DataSpec Tokens(int64_t t) { return {Shape{t}, DType::kI64, Shape{t}, kClasses}; }

// Dropout off (where the model has it), so the loss is a function of the
// parameters and the batch only.
inline std::vector<SmallModel> SmallModels() {
  return {
      {"mlp", {{"hidden", "12"}}, Features({1, 6, 6})},
      {"cnn", {{"channels", "3,4"}, {"hidden", "8"}, {"dropout", "0"}}, Features({1, 8, 8})},
      {"resnet18", {{"stem", "cifar"}, {"width", "4"}}, Features({3, 8, 8})},
      {"resnet101", {{"stem", "cifar"}, {"width", "2"}}, Features({3, 8, 8})},
      // 1/8 of the channels and 16 hidden units (at full width their
      // classifiers hold 37M and 134M parameters whatever the input).
      {"alexnet", {{"width_mult", "0.125"}, {"hidden", "16"}, {"dropout", "0"}}, Features({3, 63, 63})},
      {"vgg16", {{"width_mult", "0.125"}, {"hidden", "16"}, {"dropout", "0"}}, Features({3, 32, 32})},
      {"mobilenet_v2", {{"width_mult", "0.25"}, {"dropout", "0"}}, Features({3, 16, 16})},
      {"mobilenet_v3_small", {{"width_mult", "0.25"}, {"dropout", "0"}}, Features({3, 16, 16})},
      {"mobilenet_v3_large", {{"width_mult", "0.25"}, {"dropout", "0"}}, Features({3, 16, 16})},
      // Its T-Nets' BatchNorm over 2 examples amplifies rounding: at lr 0.01
      // the step overshoots in f64 (17.39 -> 408) and the f32 result depends
      // on the build (-O3: down, the ASan build's -O1: 17.39 -> 203). At
      // 0.001 it goes down in f64 and f32 alike.
      {"pointnet_cls", {{"dropout", "0"}}, Features({3, 32}), 0.001},
      // 299x299: the smallest input with which the training-mode AuxLogits
      // head (and so its aux_loss) runs; at 1/16 width a step takes ~0.1 s.
      {"inception_v3", {{"width_mult", "0.0625"}, {"dropout", "0"}}, Features({3, 299, 299})},
      {"rnnlm", {{"embed", "4"}, {"hidden", "6"}, {"dropout", "0"}}, Tokens(6)},
      // One class per token window: tokens [6] -> class [].
      {"rnntc", {{"vocab", "5"}, {"embed", "4"}, {"hidden", "6"}, {"layers", "2"}, {"dropout", "0"}},
       models::DataSpec{Shape{6}, DType::kI64, Shape{}, kClasses}},
      {"nmt", {{"embed", "4"}, {"hidden", "6"}, {"dropout", "0"}}, Tokens(6)},
      {"transformer_lm",
       {{"width", "8"}, {"heads", "2"}, {"layers", "1"}, {"feedforward", "8"}, {"dropout", "0"}, {"max_len", "16"}},
       Tokens(6)},
      {"bert_medium",
       {{"layers", "1"}, {"hidden", "8"}, {"heads", "2"}, {"intermediate", "8"}, {"max_positions", "8"}, {"dropout", "0"}},
       Tokens(6)},
      {"pointnet_seg", {}, models::DataSpec{Shape{3, 32}, DType::kF32, Shape{32}, kClasses}},
      // A GAN: the test cases below check its two steps instead.
      {"dcgan", {{"nz", "4"}, {"ngf", "2"}, {"ndf", "2"}}, Features({1, 16, 16})},
  };
}

inline bool IsGan(const SmallModel& s) { return (*models::FindModel(s.name))->gan != nullptr; }

inline Shape Batched(const Shape& s, int64_t batch = kZooBatch) {
  std::vector<int64_t> dims = s.dims();
  dims.insert(dims.begin(), batch);
  return Shape(dims);
}

// Features uniform in [-1, 1) (or tokens uniform in the vocabulary) and
// targets i % kClasses.
inline std::map<std::string, Tensor> ZooBatch(const models::DataSpec& data, DType dtype, int64_t batch = kZooBatch) {
  Rng rng(3);
  Tensor input = Tensor::Zeros(Batched(data.input, batch), data.input_dtype == DType::kI64 ? DType::kI64 : DType::kF64);
  for (int64_t i = 0; i < input.numel(); ++i) {
    if (input.dtype() == DType::kI64) input.data<int64_t>()[i] = rng.UniformInt(kClasses);
    else input.data<double>()[i] = rng.Uniform(-1, 1);
  }
  if (input.dtype() == DType::kF64) input = *input.Cast(dtype);
  Tensor target = Tensor::Zeros(Batched(data.target, batch), DType::kI64);
  for (int64_t i = 0; i < target.numel(); ++i) target.data<int64_t>()[i] = i % kClasses;
  return {{"input", input}, {"target", target}};
}

}  // namespace loom::testing
