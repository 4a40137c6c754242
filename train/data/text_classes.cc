#include "train/data/text_classes.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "train/data/file_io.h"

namespace loom {

TextClassDataset::TextClassDataset(Vocabulary vocab, std::vector<int32_t> tokens, std::vector<int64_t> class_sizes,
                                   int64_t seq_len)
    : vocab_(std::move(vocab)), tokens_(std::move(tokens)), class_sizes_(std::move(class_sizes)), seq_len_(seq_len) {
  class_first_window_.push_back(0);
  for (int64_t n : class_sizes_) class_first_window_.push_back(class_first_window_.back() + n);
}

StatusOr<std::shared_ptr<TextClassDataset>> TextClassDataset::FromFiles(const std::vector<std::string>& paths,
                                                                         const TextClassOptions& o) {
  if (paths.size() < 2)
    return InvalidArgument("text classes: need at least 2 files (one class per file), got ", paths.size());
  if (o.seq_len < 1) return InvalidArgument("text classes: seq_len must be >= 1, got ", o.seq_len);
  if (!(o.begin_fraction >= 0 && o.begin_fraction < o.end_fraction && o.end_fraction <= 1))
    return InvalidArgument("text classes: need 0 <= begin_fraction < end_fraction <= 1, got [", o.begin_fraction,
                           ", ", o.end_fraction, ")");
  std::set<std::string> seen_paths;
  for (const std::string& path : paths)
    if (!seen_paths.insert(path).second)
      return InvalidArgument("text classes: ", path, " is listed twice (each file is one class)");

  // Whole files first: the vocabulary is the union over all of them.
  std::vector<std::string> texts;
  texts.reserve(paths.size());
  std::vector<char32_t> symbols;
  for (const std::string& path : paths) {
    LOOM_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path));
    if (bytes.empty()) return DataLoss(path, ": empty file");
    texts.emplace_back(bytes.begin(), bytes.end());
    if (o.level == TextLevel::kChar) {
      StatusOr<std::vector<char32_t>> cps = DecodeUtf8(texts.back());
      if (!cps.ok()) return DataLoss(path, ": ", cps.status().message(), " (TextLevel::kByte reads any file)");
      // Keep only the distinct ones so the union stays small.
      std::vector<char32_t> distinct = std::move(cps).value();
      std::sort(distinct.begin(), distinct.end());
      distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
      symbols.insert(symbols.end(), distinct.begin(), distinct.end());
    }
  }
  Vocabulary vocab = o.level == TextLevel::kChar ? Vocabulary::Characters(std::move(symbols)) : Vocabulary::Bytes();

  // Then each file's part, cut into whole windows.
  std::vector<int32_t> tokens;
  std::vector<int64_t> class_sizes;
  for (size_t c = 0; c < paths.size(); ++c) {
    LOOM_ASSIGN_OR_RETURN(std::vector<int64_t> ids, vocab.Encode(texts[c]));
    std::string().swap(texts[c]);
    const int64_t total = static_cast<int64_t>(ids.size());
    const auto begin = static_cast<int64_t>(std::floor(o.begin_fraction * static_cast<double>(total)));
    const auto end = static_cast<int64_t>(std::floor(o.end_fraction * static_cast<double>(total)));
    const int64_t windows = (end - begin) / o.seq_len;
    if (windows < 1)
      return InvalidArgument(paths[c], ": tokens [", begin, ", ", end, ") of ", total, " (fractions [",
                             o.begin_fraction, ", ", o.end_fraction, ")) are ", end - begin,
                             ", too few for one window of seq_len ", o.seq_len);
    tokens.insert(tokens.end(), ids.begin() + begin, ids.begin() + begin + windows * o.seq_len);
    class_sizes.push_back(windows);
  }
  return std::shared_ptr<TextClassDataset>(
      new TextClassDataset(std::move(vocab), std::move(tokens), std::move(class_sizes), o.seq_len));
}

int64_t TextClassDataset::label(int64_t index) const {
  // The last class whose first window is at or before `index`.
  auto it = std::upper_bound(class_first_window_.begin(), class_first_window_.end(), index);
  return static_cast<int64_t>(it - class_first_window_.begin()) - 1;
}

void TextClassDataset::Get(int64_t index, void* input, int64_t* target) const {
  const int32_t* window = tokens_.data() + index * seq_len_;
  int64_t* in = static_cast<int64_t*>(input);
  for (int64_t t = 0; t < seq_len_; ++t) in[t] = window[t];
  *target = label(index);
}

}  // namespace loom
