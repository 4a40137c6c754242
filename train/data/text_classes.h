// Text classification from files: one class per file (a topic), examples are
// windows of T tokens cut from the files, the target is the file's index.
// Real text for the zoo's RNN text classifier (rnntc) where no labelled
// corpus such as movie reviews is at hand.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "train/data/dataset.h"
#include "train/data/text.h"

namespace loom {

struct TextClassOptions {
  int64_t seq_len = 128;  // T characters (tokens) per example
  TextLevel level = TextLevel::kChar;
  // The part of EACH file this dataset covers, [begin, end) as fractions of
  // that file's tokens (so {0, 0.9} and {0.9, 1} split every class the same way).
  double begin_fraction = 0, end_fraction = 1;
};

class TextClassDataset : public Dataset {
 public:
  // One class per file, in the given order; the vocabulary comes from all the
  // files together (whole files, so the train and test parts share ids).
  // Each file's part is cut into non-overlapping windows of seq_len tokens
  // (a remainder shorter than seq_len is dropped); the example's target is
  // its file's index. Examples are ordered by class: class 0's windows in
  // file order, then class 1's, and so on (the loader shuffles). Files are
  // read as TokenStreamDataset reads them (gzip is unpacked). Errors name
  // the file (missing, empty, invalid UTF-8 at a byte offset, too few tokens
  // for one window, listed twice); fewer than 2 files is an error.
  static StatusOr<std::shared_ptr<TextClassDataset>> FromFiles(const std::vector<std::string>& paths,
                                                               const TextClassOptions& o);

  int64_t size() const override { return class_first_window_.back(); }
  ExampleSpec input_spec() const override { return {Shape{seq_len_}, DType::kI64}; }  // [seq_len] i64
  ExampleSpec target_spec() const override { return {Shape{}, DType::kI64}; }         // [] i64
  int64_t num_classes() const override { return static_cast<int64_t>(class_sizes_.size()); }  // the number of files
  int64_t input_vocabulary() const override { return vocab_.size(); }  // input ids are in [0, vocabulary size)
  void Get(int64_t index, void* input, int64_t* target) const override;

  const Vocabulary& vocabulary() const { return vocab_; }
  const std::vector<int64_t>& class_sizes() const { return class_sizes_; }  // windows per class

  // The class of example `index` (what Get writes as its target).
  int64_t label(int64_t index) const;

 private:
  TextClassDataset(Vocabulary vocab, std::vector<int32_t> tokens, std::vector<int64_t> class_sizes, int64_t seq_len);

  Vocabulary vocab_;
  std::vector<int32_t> tokens_;  // the windows of all classes back to back: window i is tokens_[i*T, (i+1)*T)
  std::vector<int64_t> class_sizes_;
  std::vector<int64_t> class_first_window_;  // class c's windows are [first[c], first[c+1])
  int64_t seq_len_;
};

}  // namespace loom
