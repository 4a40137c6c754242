#include "core/inline_vector.h"

#include <catch2/catch.hpp>
#include <utility>
#include <vector>

namespace loom {
namespace {

using Ints = InlineVector<int, 2>;

std::vector<int> Of(const Ints& v) { return v.ToVector(); }

TEST_CASE("an inline vector holds its first values in itself and moves to the heap beyond") {
  Ints v;
  CHECK(v.empty());
  CHECK(v.capacity() == 2);
  v.push_back(1);
  v.push_back(2);
  CHECK(v.capacity() == 2);
  v.push_back(3);  // spills: a heap block, the values kept
  CHECK(v.capacity() >= 3);
  CHECK(Of(v) == std::vector<int>{1, 2, 3});
  v.push_back(v[0]);  // a value of its own, read before it grows
  v.push_back(v[1]);
  CHECK(Of(v) == std::vector<int>{1, 2, 3, 1, 2});
  v.clear();
  CHECK(v.empty());
  CHECK(v.capacity() >= 5);  // kept, as std::vector keeps it
}

TEST_CASE("inline vectors copy, move and compare by their values, inline or on the heap") {
  for (const std::vector<int>& values : {std::vector<int>{}, std::vector<int>{7}, std::vector<int>{1, 2, 3, 4, 5}}) {
    Ints a(values);
    CHECK(Of(a) == values);
    Ints copy = a;
    CHECK(copy == a);
    Ints moved = std::move(copy);
    CHECK(Of(moved) == values);
    CHECK(copy.empty());  // NOLINT: a moved-from vector is empty and usable
    copy.push_back(9);
    CHECK(Of(copy) == std::vector<int>{9});
    Ints assigned{4};
    assigned = moved;
    CHECK(assigned == a);
    assigned = std::move(moved);
    CHECK(assigned == a);
  }
  CHECK(Ints{1, 2} < Ints{1, 3});
  CHECK(Ints{1, 2} < Ints{1, 2, 0});
  CHECK(!(Ints{1, 2, 0} < Ints{1, 2}));
  CHECK(Ints{1, 2, 3} != Ints{1, 2});
}

TEST_CASE("an inline vector erases, resizes and assigns like std::vector") {
  Ints v{1, 2, 3, 4, 5};
  v.erase(v.begin() + 1, v.begin() + 3);
  CHECK(Of(v) == std::vector<int>{1, 4, 5});
  v.erase(v.begin());
  CHECK(Of(v) == std::vector<int>{4, 5});
  v.resize(5, 8);
  CHECK(Of(v) == std::vector<int>{4, 5, 8, 8, 8});
  v.resize(1);
  CHECK(Of(v) == std::vector<int>{4});
  v.assign(3, 2);
  CHECK(Of(v) == std::vector<int>{2, 2, 2});
  v = std::vector<int>{9, 8};
  CHECK(Of(v) == std::vector<int>{9, 8});
  CHECK(v.front() == 9);
  CHECK(v.back() == 8);
}

}  // namespace
}  // namespace loom
