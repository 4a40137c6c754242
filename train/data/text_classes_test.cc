// TextClassDataset on small files the tests write: windows, labels, the
// per-file split, errors and determinism.
#include "train/data/text_classes.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "train/data/test_files.h"

namespace loom {
namespace {

using Catch::Matchers::Contains;
using testing::ErrorOf;
using testing::TempPath;
using testing::WriteFile;

void WriteText(const std::string& path, const std::string& text, bool gzip = false) {
  WriteFile(path, std::vector<uint8_t>(text.begin(), text.end()), gzip);
}

// Every example of `ds` as (target, decoded window).
std::vector<std::pair<int64_t, std::string>> Examples(const TextClassDataset& ds) {
  std::vector<std::pair<int64_t, std::string>> out;
  const int64_t t_len = ds.input_spec().shape.numel();
  std::vector<int64_t> in(t_len);
  for (int64_t i = 0; i < ds.size(); ++i) {
    int64_t target = -1;
    ds.Get(i, in.data(), &target);
    out.emplace_back(target, ds.vocabulary().Decode(in).value());
  }
  return out;
}

TEST_CASE("Text classes: windows, labels and the joint vocabulary") {
  const std::string a = TempPath("tc_a.txt"), b = TempPath("tc_b.txt"), c = TempPath("tc_c.txt.gz");
  WriteText(a, "abcdefghij");          // 10 characters: 2 windows of 4, "ij" dropped
  WriteText(b, "x\xc3\xb6yz\xc3\xb6");  // "xöyzö", 5 characters (ö is two bytes): 1 window
  WriteText(c, "0123456789AB", /*gzip=*/true);  // 12 characters: 3 windows
  TextClassOptions o;
  o.seq_len = 4;
  auto ds = TextClassDataset::FromFiles({a, b, c}, o);
  REQUIRE(ds.status().ToString() == "OK");
  CHECK((*ds)->num_classes() == 3);
  CHECK((*ds)->class_sizes() == std::vector<int64_t>{2, 1, 3});
  CHECK((*ds)->size() == 6);
  CHECK((*ds)->input_spec() == ExampleSpec{Shape{4}, DType::kI64});
  CHECK((*ds)->target_spec() == ExampleSpec{Shape{}, DType::kI64});

  // The vocabulary is every file's characters in code point order: 0-9, A, B,
  // a-j, x, y, z, ö.
  const Vocabulary& vocab = (*ds)->vocabulary();
  CHECK(vocab.level() == TextLevel::kChar);
  CHECK(vocab.size() == 26);
  CHECK((*ds)->input_vocabulary() == 26);
  CHECK(vocab.Encode("0Aax\xc3\xb6").value() == std::vector<int64_t>{0, 10, 12, 22, 25});

  const std::vector<std::pair<int64_t, std::string>> expected = {
      {0, "abcd"}, {0, "efgh"}, {1, "x\xc3\xb6yz"}, {2, "0123"}, {2, "4567"}, {2, "89AB"}};
  CHECK(Examples(**ds) == expected);
  std::vector<int64_t> in(4);
  int64_t target = -1;
  (*ds)->Get(2, in.data(), &target);
  CHECK(in == std::vector<int64_t>{22, 25, 23, 24});
  CHECK(target == 1);
  for (int64_t i = 0; i < (*ds)->size(); ++i) CHECK((*ds)->label(i) == expected[i].first);

  // Byte level: ids are bytes, ö counts as two tokens.
  o.level = TextLevel::kByte;
  o.seq_len = 3;
  auto bytes = TextClassDataset::FromFiles({b, a}, o).value();
  CHECK(bytes->vocabulary().size() == 256);
  CHECK(bytes->input_vocabulary() == 256);
  CHECK(bytes->class_sizes() == std::vector<int64_t>{2, 3});
  bytes->Get(0, in.data(), &target);
  CHECK(std::vector<int64_t>(in.begin(), in.begin() + 3) == std::vector<int64_t>{'x', 0xc3, 0xb6});
  CHECK(target == 0);
  bytes->Get(4, in.data(), &target);
  CHECK(std::vector<int64_t>(in.begin(), in.begin() + 3) == std::vector<int64_t>{'g', 'h', 'i'});
  CHECK(target == 1);
  for (const std::string& p : {a, b, c}) std::remove(p.c_str());
}

TEST_CASE("Text classes: a split by fraction is disjoint and shares ids") {
  const std::string a = TempPath("split_a.txt"), b = TempPath("split_b.txt");
  WriteText(a, "abcdefghijklmnopqrst");  // 20 characters
  WriteText(b, "01234567!9");            // 10 characters, '!' only in the tail
  TextClassOptions o;
  o.seq_len = 2;
  o.end_fraction = 0.5;
  auto train = TextClassDataset::FromFiles({a, b}, o).value();
  o.begin_fraction = 0.5;
  o.end_fraction = 1;
  auto test = TextClassDataset::FromFiles({a, b}, o).value();

  // Each file is split at its own middle: a at 10, b at 5 (b's odd 5 tokens
  // leave one over on each side).
  CHECK(train->class_sizes() == std::vector<int64_t>{5, 2});
  CHECK(test->class_sizes() == std::vector<int64_t>{5, 2});
  const std::vector<std::pair<int64_t, std::string>> train_expected = {
      {0, "ab"}, {0, "cd"}, {0, "ef"}, {0, "gh"}, {0, "ij"}, {1, "01"}, {1, "23"}};
  const std::vector<std::pair<int64_t, std::string>> test_expected = {
      {0, "kl"}, {0, "mn"}, {0, "op"}, {0, "qr"}, {0, "st"}, {1, "56"}, {1, "7!"}};
  CHECK(Examples(*train) == train_expected);
  CHECK(Examples(*test) == test_expected);

  // Disjoint: no window text (every character occurs once per file) is in both.
  std::set<std::pair<int64_t, std::string>> seen;
  for (const auto& e : Examples(*train)) seen.insert(e);
  for (const auto& e : Examples(*test)) CHECK(seen.count(e) == 0);

  // Shared ids: both vocabularies come from the whole files, '!' included.
  REQUIRE(train->vocabulary().size() == 30);
  REQUIRE(test->vocabulary().size() == 30);
  for (int64_t id = 0; id < 30; ++id) CHECK(train->vocabulary().symbol(id) == test->vocabulary().symbol(id));
  CHECK(train->vocabulary().Encode("!").value() == std::vector<int64_t>{0});

  // A {0, 0.9} / {0.9, 1} split of a 20-token file cuts at token 18.
  o.begin_fraction = 0.9;
  o.seq_len = 1;
  auto tail = TextClassDataset::FromFiles({a, b}, o).value();
  CHECK(tail->class_sizes() == std::vector<int64_t>{2, 1});
  CHECK(Examples(*tail) == std::vector<std::pair<int64_t, std::string>>{{0, "s"}, {0, "t"}, {1, "9"}});
  for (const std::string& p : {a, b}) std::remove(p.c_str());
}

TEST_CASE("Text classes: errors name the file") {
  const std::string a = TempPath("err_a.txt"), b = TempPath("err_b.txt");
  WriteText(a, "abcdefgh");
  WriteText(b, "0123456789");
  TextClassOptions o;
  o.seq_len = 4;
  REQUIRE(TextClassDataset::FromFiles({a, b}, o).ok());

  CHECK_THAT(ErrorOf(TextClassDataset::FromFiles({a}, o)),
             Contains("need at least 2 files (one class per file), got 1"));
  CHECK_THAT(ErrorOf(TextClassDataset::FromFiles({}, o)), Contains("need at least 2 files (one class per file), got 0"));
  CHECK_THAT(ErrorOf(TextClassDataset::FromFiles({a, b + ".none"}, o)), Contains(b + ".none: no such file"));
  CHECK_THAT(ErrorOf(TextClassDataset::FromFiles({a, a}, o)), Contains(a + " is listed twice"));

  // Too short: a's second half is 4 tokens, not enough for a window of 5.
  o.seq_len = 5;
  o.begin_fraction = 0.5;
  CHECK_THAT(ErrorOf(TextClassDataset::FromFiles({b, a}, o)),
             Contains(a + ": tokens [4, 8) of 8 (fractions [0.5, 1)) are 4, too few for one window of seq_len 5"));
  o.begin_fraction = 0;
  o.seq_len = 0;
  CHECK_THAT(ErrorOf(TextClassDataset::FromFiles({a, b}, o)), Contains("seq_len must be >= 1, got 0"));
  o.seq_len = 4;
  o.begin_fraction = 0.5;
  o.end_fraction = 0.5;
  CHECK_THAT(ErrorOf(TextClassDataset::FromFiles({a, b}, o)),
             Contains("need 0 <= begin_fraction < end_fraction <= 1"));
  o.begin_fraction = 0;
  o.end_fraction = 1;

  // Invalid UTF-8 names the file and the byte offset; byte level reads it.
  WriteFile(b, {'0', '1', '2', 0xff, '4', '5', '6', '7'});
  CHECK_THAT(ErrorOf(TextClassDataset::FromFiles({a, b}, o)),
             Contains(b + ": invalid UTF-8 at byte offset 3 (TextLevel::kByte reads any file)"));
  o.level = TextLevel::kByte;
  auto bytes = TextClassDataset::FromFiles({a, b}, o);
  REQUIRE(bytes.ok());
  CHECK((*bytes)->class_sizes() == std::vector<int64_t>{2, 2});
  o.level = TextLevel::kChar;

  WriteFile(b, {});
  CHECK_THAT(ErrorOf(TextClassDataset::FromFiles({a, b}, o)), Contains(b + ": empty file"));
  for (const std::string& p : {a, b}) std::remove(p.c_str());
}

TEST_CASE("Text classes: the same files give the same dataset") {
  const std::string a = TempPath("det_a.txt"), b = TempPath("det_b.txt"), c = TempPath("det_c.txt");
  std::string ta, tb, tc;
  for (int i = 0; i < 50; ++i) {
    ta += "the cat sat on the mat " + std::to_string(i) + "\n";
    tb += "caf\xc3\xa9 cr\xc3\xa8me br\xc3\xbbl\xc3\xa9e " + std::to_string(i * 7) + "\n";
    tc += "\xce\xb1\xce\xb2\xce\xb3 " + std::to_string(i * 13) + "\n";
  }
  WriteText(a, ta);
  WriteText(b, tb);
  WriteText(c, tc);
  TextClassOptions o;
  o.seq_len = 16;
  o.end_fraction = 0.8;
  auto first = TextClassDataset::FromFiles({a, b, c}, o).value();
  auto second = TextClassDataset::FromFiles({a, b, c}, o).value();
  CHECK(first->class_sizes() == second->class_sizes());
  CHECK(first->vocabulary().size() == second->vocabulary().size());
  const auto examples = Examples(*first);
  CHECK(examples == Examples(*second));
  CHECK(examples == Examples(*first));  // Get is a pure function of the index

  // The order of the files sets the labels, not the vocabulary.
  auto swapped = TextClassDataset::FromFiles({c, a, b}, o).value();
  CHECK(swapped->vocabulary().size() == first->vocabulary().size());
  for (int64_t id = 0; id < first->vocabulary().size(); ++id)
    CHECK(swapped->vocabulary().symbol(id) == first->vocabulary().symbol(id));
  CHECK(swapped->class_sizes() ==
        std::vector<int64_t>{first->class_sizes()[2], first->class_sizes()[0], first->class_sizes()[1]});
  std::vector<std::pair<int64_t, std::string>> relabelled;
  for (auto e : Examples(*swapped)) {
    e.first = (e.first + 2) % 3;  // swapped class 0 is c (first's 2), 1 is a (0), 2 is b (1)
    relabelled.push_back(e);
  }
  std::multiset<std::pair<int64_t, std::string>> x(examples.begin(), examples.end()), y(relabelled.begin(),
                                                                                           relabelled.end());
  CHECK(x == y);
  for (const std::string& p : {a, b, c}) std::remove(p.c_str());
}

}  // namespace
}  // namespace loom
