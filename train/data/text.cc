#include "train/data/text.h"

#include "core/utf8.h"

#include <algorithm>
#include <cmath>

#include "core/rng.h"
#include "train/data/file_io.h"

namespace loom {

namespace {

bool IsContinuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Decodes the code point at s[0..n); returns its length in bytes, or 0 when
// the bytes there are not valid UTF-8 (overlong forms, surrogates and
// values above U+10FFFF are invalid too).
int DecodeOne(const uint8_t* s, size_t n, char32_t* cp) {
  const uint8_t b0 = s[0];
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  int len;
  char32_t min_second = 0x80, max_second = 0xBF;  // the allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) min_second = 0xA0;  // overlong
    if (b0 == 0xED) max_second = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) min_second = 0x90;  // overlong
    if (b0 == 0xF4) max_second = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (n < static_cast<size_t>(len) || s[1] < min_second || s[1] > max_second) return 0;
  char32_t value = b0 & (0xFF >> (len + 1));
  for (int i = 1; i < len; ++i) {
    if (!IsContinuation(s[i])) return 0;
    value = (value << 6) | (s[i] & 0x3F);
  }
  *cp = value;
  return len;
}


// Calls fn(code point, byte offset) for each character of `text`.
template <typename Fn>
Status ForEachCodePoint(const std::string& text, Fn fn) {
  const uint8_t* s = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t pos = 0; pos < text.size();) {
    char32_t cp = 0;
    const int len = DecodeOne(s + pos, text.size() - pos, &cp);
    if (len == 0) return InvalidArgument("invalid UTF-8 at byte offset ", pos);
    LOOM_RETURN_IF_ERROR(fn(cp, pos));
    pos += static_cast<size_t>(len);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<char32_t>> DecodeUtf8(const std::string& text) {
  std::vector<char32_t> cps;
  LOOM_RETURN_IF_ERROR(ForEachCodePoint(text, [&](char32_t cp, size_t) {
    cps.push_back(cp);
    return Status::Ok();
  }));
  return cps;
}

Vocabulary Vocabulary::Bytes() { return Vocabulary(); }

Vocabulary Vocabulary::Characters(std::vector<char32_t> symbols) {
  std::sort(symbols.begin(), symbols.end());
  symbols.erase(std::unique(symbols.begin(), symbols.end()), symbols.end());
  Vocabulary v;
  v.level_ = TextLevel::kChar;
  for (size_t i = 0; i < symbols.size(); ++i) v.ids_[symbols[i]] = static_cast<int64_t>(i);
  v.symbols_ = std::move(symbols);
  return v;
}

StatusOr<std::vector<int64_t>> Vocabulary::Encode(const std::string& text) const {
  std::vector<int64_t> ids;
  if (level_ == TextLevel::kByte) {
    for (char c : text) ids.push_back(static_cast<uint8_t>(c));
    return ids;
  }
  LOOM_RETURN_IF_ERROR(ForEachCodePoint(text, [&](char32_t cp, size_t pos) {
    auto it = ids_.find(cp);
    if (it == ids_.end())
      return InvalidArgument("character U+", std::hex, std::uppercase, static_cast<uint32_t>(cp), std::dec,
                             " at byte offset ", pos, " is not in the vocabulary");
    ids.push_back(it->second);
    return Status::Ok();
  }));
  return ids;
}

StatusOr<std::string> Vocabulary::Decode(const std::vector<int64_t>& ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= size())
      return InvalidArgument("token id ", ids[i], " at position ", i, " is not in the vocabulary [0, ", size(), ")");
    if (level_ == TextLevel::kByte)
      text.push_back(static_cast<char>(ids[i]));
    else
      AppendUtf8(symbols_[ids[i]], &text);
  }
  return text;
}

TokenStreamDataset::TokenStreamDataset(Vocabulary vocab, std::vector<int32_t> tokens, int64_t seq_len, int64_t stride)
    : vocab_(std::move(vocab)), tokens_(std::move(tokens)), seq_len_(seq_len), stride_(stride) {
  // Every window needs seq_len inputs plus the one token after them.
  windows_ = (static_cast<int64_t>(tokens_.size()) - seq_len_ - 1) / stride_ + 1;
}

StatusOr<std::shared_ptr<TokenStreamDataset>> TokenStreamDataset::FromFile(const std::string& path,
                                                                           const TextDatasetOptions& options) {
  if (options.seq_len < 1)
    return InvalidArgument("text dataset ", path, ": seq_len must be >= 1, got ", options.seq_len);
  if (options.stride < 0) return InvalidArgument("text dataset ", path, ": stride must be >= 0, got ", options.stride);
  if (!(options.begin_fraction >= 0 && options.begin_fraction < options.end_fraction && options.end_fraction <= 1))
    return InvalidArgument("text dataset ", path, ": need 0 <= begin_fraction < end_fraction <= 1, got [",
                           options.begin_fraction, ", ", options.end_fraction, ")");
  LOOM_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path));
  if (bytes.empty()) return DataLoss(path, ": empty file");
  const std::string text(bytes.begin(), bytes.end());

  Vocabulary vocab = Vocabulary::Bytes();
  if (options.level == TextLevel::kChar) {
    StatusOr<std::vector<char32_t>> seen = DecodeUtf8(text);
    if (!seen.ok()) return DataLoss(path, ": ", seen.status().message(), " (TextLevel::kByte reads any file)");
    vocab = Vocabulary::Characters(std::move(seen).value());
  }
  LOOM_ASSIGN_OR_RETURN(std::vector<int64_t> ids, vocab.Encode(text));

  const int64_t total = static_cast<int64_t>(ids.size());
  const auto begin = static_cast<int64_t>(std::floor(options.begin_fraction * static_cast<double>(total)));
  const auto end = static_cast<int64_t>(std::floor(options.end_fraction * static_cast<double>(total)));
  if (end - begin < options.seq_len + 1)
    return InvalidArgument(path, ": tokens [", begin, ", ", end, ") of ", total, " (fractions [",
                           options.begin_fraction, ", ", options.end_fraction, ")) are ", end - begin,
                           ", too few for one window of seq_len ", options.seq_len, " plus its next-token target");
  std::vector<int32_t> tokens(ids.begin() + begin, ids.begin() + end);
  return std::shared_ptr<TokenStreamDataset>(new TokenStreamDataset(
      std::move(vocab), std::move(tokens), options.seq_len, options.stride > 0 ? options.stride : options.seq_len));
}

void TokenStreamDataset::Get(int64_t index, void* input, int64_t* target) const {
  const int32_t* window = tokens_.data() + index * stride_;
  int64_t* in = static_cast<int64_t*>(input);
  for (int64_t t = 0; t < seq_len_; ++t) {
    in[t] = window[t];
    target[t] = window[t + 1];
  }
}

}  // namespace loom

namespace loom {
namespace {

Status CheckTokenBase(const std::shared_ptr<const Dataset>& base, const char* what) {
  if (!base) return InvalidArgument(what, ": no base dataset");
  const ExampleSpec in = base->input_spec();
  if (in.dtype != DType::kI64 || in.shape.rank() != 1)
    return InvalidArgument(what, ": needs token windows (i64 [T]) as inputs, got ", in.ToString());
  return Status::Ok();
}

}  // namespace

StatusOr<std::shared_ptr<MaskedTokenDataset>> MaskedTokenDataset::Create(std::shared_ptr<const Dataset> base,
                                                                         double fraction, uint64_t seed) {
  LOOM_RETURN_IF_ERROR(CheckTokenBase(base, "MaskedTokenDataset"));
  if (!(fraction > 0 && fraction <= 1))
    return InvalidArgument("MaskedTokenDataset: the mask fraction must be in (0, 1], got ", fraction);
  return std::shared_ptr<MaskedTokenDataset>(new MaskedTokenDataset(std::move(base), fraction, seed));
}

void MaskedTokenDataset::Get(int64_t index, void* input, int64_t* target) const {
  const int64_t t_len = base_->input_spec().shape.numel();
  std::vector<int64_t> next(t_len);  // the base's next-token targets, unused
  base_->Get(index, input, next.data());
  int64_t* tokens = static_cast<int64_t*>(input);
  Rng rng = Rng::Stream(seed_, static_cast<uint64_t>(index));
  const int64_t vocab = base_->num_classes();
  for (int64_t t = 0; t < t_len; ++t) {
    // Three draws per position whatever the outcome, so positions do not
    // shift each other's choices.
    const double select = rng.Uniform(), how = rng.Uniform();
    const int64_t random_token = rng.UniformInt(vocab);
    if (select >= fraction_) {
      target[t] = -100;
      continue;
    }
    target[t] = tokens[t];
    if (how < 0.8) tokens[t] = mask_token();
    else if (how < 0.9) tokens[t] = random_token;
  }
}

StatusOr<std::shared_ptr<ReversedTokenDataset>> ReversedTokenDataset::Create(std::shared_ptr<const Dataset> base) {
  LOOM_RETURN_IF_ERROR(CheckTokenBase(base, "ReversedTokenDataset"));
  return std::shared_ptr<ReversedTokenDataset>(new ReversedTokenDataset(std::move(base)));
}

void ReversedTokenDataset::Get(int64_t index, void* input, int64_t* target) const {
  const int64_t t_len = base_->input_spec().shape.numel();
  std::vector<int64_t> next(t_len);
  base_->Get(index, input, next.data());
  const int64_t* tokens = static_cast<const int64_t*>(input);
  for (int64_t t = 0; t < t_len; ++t) target[t] = tokens[t_len - 1 - t];
}

}  // namespace loom
