// The data file readers: raw or gzip bytes, IDX images and labels, the
// text dataset (char and byte level) and the text-classes dataset (the
// input's halves as two class files). Any file is refused with a Status or
// read into consistent sizes; nothing may read out of bounds.
#include <vector>

#include "train/data/file_io.h"
#include "train/data/idx.h"
#include "train/data/text.h"
#include "train/data/text_classes.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using loom::fuzz::Require;
  const std::string& path = loom::fuzz::AsFile(data, size);
  (void)loom::ReadFileBytes(path);
  if (auto images = loom::ReadIdxImages(path); images.ok()) {
    Require(images->shape().rank() == 3, "IDX images are not [N, rows, cols]");
    for (float v : images->ToDoubleVector()) Require(v >= 0 && v <= 1, "an IDX pixel is outside [0, 1]");
  }
  if (auto labels = loom::ReadIdxLabels(path); labels.ok()) Require(labels->shape().rank() == 1, "IDX labels are not [N]");
  for (loom::TextLevel level : {loom::TextLevel::kChar, loom::TextLevel::kByte}) {
    loom::TextDatasetOptions o;
    o.seq_len = 4;
    o.level = level;
    auto text = loom::TokenStreamDataset::FromFile(path, o);
    if (!text.ok()) continue;
    std::vector<int64_t> input(4), target(4);
    for (int64_t i = 0; i < (*text)->size() && i < 64; ++i) {
      (*text)->Get(i, input.data(), target.data());
      for (int64_t t : input) Require(t >= 0 && t < (*text)->input_vocabulary(), "a token id outside the vocabulary");
    }
  }
  loom::TextClassOptions tc;
  tc.seq_len = 4;
  if (auto classes = loom::TextClassDataset::FromFiles(loom::fuzz::AsTwoFiles(data, size), tc); classes.ok()) {
    std::vector<int64_t> input(4);
    int64_t label = -1;
    for (int64_t i = 0; i < (*classes)->size() && i < 64; ++i) {
      (*classes)->Get(i, input.data(), &label);
      Require(label == 0 || label == 1, "a text class outside the two files");
      for (int64_t t : input) Require(t >= 0 && t < (*classes)->input_vocabulary(), "a token id outside the vocabulary");
    }
  }
  return 0;
}
