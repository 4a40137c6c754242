// Language-model data from a text file: a character- or byte-level
// vocabulary and the file's token stream cut into windows of T tokens whose
// targets are the next tokens (input t[s..s+T), target t[s+1..s+T+1)).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "train/data/dataset.h"

namespace loom {

enum class TextLevel {
  kChar,  // Unicode code points of UTF-8 text; the vocabulary is those the file uses
  kByte,  // raw bytes, any file; the vocabulary is all 256 byte values
};

// Token ids <-> symbols (code points or bytes). Ids of a character
// vocabulary follow code point order, so one file always gives the same ids.
class Vocabulary {
 public:
  static Vocabulary Bytes();
  // `symbols` is the set of code points (any order, duplicates ignored).
  static Vocabulary Characters(std::vector<char32_t> symbols);

  TextLevel level() const { return level_; }
  int64_t size() const { return level_ == TextLevel::kByte ? 256 : static_cast<int64_t>(symbols_.size()); }
  // The code point (or byte value) of token `id`.
  char32_t symbol(int64_t id) const { return level_ == TextLevel::kByte ? static_cast<char32_t>(id) : symbols_[id]; }

  // Errors name the byte offset of invalid UTF-8 or of a character that is
  // not in the vocabulary.
  StatusOr<std::vector<int64_t>> Encode(const std::string& text) const;
  // Errors name the first id outside [0, size()).
  StatusOr<std::string> Decode(const std::vector<int64_t>& ids) const;

 private:
  TextLevel level_ = TextLevel::kByte;
  std::vector<char32_t> symbols_;              // id -> code point (characters only)
  std::unordered_map<char32_t, int64_t> ids_;  // code point -> id (characters only)
};

// The code points of UTF-8 `text`, in order. Errors name the byte offset of
// invalid UTF-8 (overlong forms, surrogates and values above U+10FFFF are
// invalid too). Shared by the text datasets to build character vocabularies.
StatusOr<std::vector<char32_t>> DecodeUtf8(const std::string& text);

struct TextDatasetOptions {
  int64_t seq_len = 128;  // T, tokens per example
  int64_t stride = 0;     // window k starts at token k * stride; 0 means seq_len (no overlap)
  TextLevel level = TextLevel::kChar;
  // The part of the token stream this dataset covers, [begin, end) as
  // fractions of the file's tokens. The vocabulary always comes from the
  // whole file, so a {0, 0.9} training and a {0.9, 1} validation split of
  // one file share token ids.
  double begin_fraction = 0, end_fraction = 1;
};

class TokenStreamDataset : public Dataset {
 public:
  // Reads `path` (gzip is unpacked). Errors name the file: missing, empty,
  // invalid UTF-8 (at a byte offset) for kChar, or too few tokens in the
  // chosen part for one window of seq_len + 1 tokens.
  static StatusOr<std::shared_ptr<TokenStreamDataset>> FromFile(const std::string& path,
                                                                const TextDatasetOptions& options);

  int64_t size() const override { return windows_; }
  ExampleSpec input_spec() const override { return {Shape{seq_len_}, DType::kI64}; }
  ExampleSpec target_spec() const override { return {Shape{seq_len_}, DType::kI64}; }
  int64_t num_classes() const override { return vocab_.size(); }
  int64_t input_vocabulary() const override { return vocab_.size(); }
  void Get(int64_t index, void* input, int64_t* target) const override;

  const Vocabulary& vocabulary() const { return vocab_; }
  // The tokens of this dataset's part of the file, in order.
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  TokenStreamDataset(Vocabulary vocab, std::vector<int32_t> tokens, int64_t seq_len, int64_t stride);

  Vocabulary vocab_;
  std::vector<int32_t> tokens_;
  int64_t seq_len_, stride_, windows_;
};

}  // namespace loom

namespace loom {

// Masked-language-model examples from a token dataset, as BERT's pre-training
// makes them: each position is selected with probability `fraction`; a
// selected token is replaced by the mask token (80%), a random token (10%)
// or kept (10%), and its target is the original token; targets of the other
// positions are -100 (not scored). The mask token is the id
// base->num_classes(), so num_classes() is one more than the base's. The
// choice is a function of (seed, example index): the same example is masked
// the same way in every epoch (BERT's static masking).
class MaskedTokenDataset : public Dataset {
 public:
  static StatusOr<std::shared_ptr<MaskedTokenDataset>> Create(std::shared_ptr<const Dataset> base, double fraction,
                                                              uint64_t seed);

  int64_t size() const override { return base_->size(); }
  ExampleSpec input_spec() const override { return base_->input_spec(); }
  ExampleSpec target_spec() const override { return base_->input_spec(); }
  int64_t num_classes() const override { return base_->num_classes() + 1; }
  int64_t input_vocabulary() const override { return base_->input_vocabulary() + 1; }
  void Get(int64_t index, void* input, int64_t* target) const override;

  int64_t mask_token() const { return base_->num_classes(); }

 private:
  MaskedTokenDataset(std::shared_ptr<const Dataset> base, double fraction, uint64_t seed)
      : base_(std::move(base)), fraction_(fraction), seed_(seed) {}
  std::shared_ptr<const Dataset> base_;
  double fraction_;
  uint64_t seed_;
};

// Sequence-to-sequence examples from a token dataset: the target is the input
// window reversed. A translation task whose answer is known, for the
// encoder-decoder models where no parallel corpus is at hand.
class ReversedTokenDataset : public Dataset {
 public:
  static StatusOr<std::shared_ptr<ReversedTokenDataset>> Create(std::shared_ptr<const Dataset> base);

  int64_t size() const override { return base_->size(); }
  ExampleSpec input_spec() const override { return base_->input_spec(); }
  ExampleSpec target_spec() const override { return base_->input_spec(); }
  int64_t num_classes() const override { return base_->num_classes(); }
  int64_t input_vocabulary() const override { return base_->input_vocabulary(); }
  void Get(int64_t index, void* input, int64_t* target) const override;

 private:
  explicit ReversedTokenDataset(std::shared_ptr<const Dataset> base) : base_(std::move(base)) {}
  std::shared_ptr<const Dataset> base_;
};

}  // namespace loom
