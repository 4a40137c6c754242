#include "graph/attrs.h"

#include <catch2/catch.hpp>

namespace loom {

TEST_CASE("AttrMap::Set keeps each scalar's type") {
  AttrMap a;
  a.Set("momentum", 0.3).Set("training", true).Set("groups", 2).Set("big", int64_t{1} << 40).Set("mode", "tanh");
  CHECK(a.Float("momentum") == 0.3);
  CHECK(a.Bool("training"));
  CHECK(a.Int("groups") == 2);
  CHECK(a.Int("big") == (int64_t{1} << 40));
  CHECK(a.Str("mode") == "tanh");
  CHECK(a.Float("groups") == 2.0);  // ints read as floats
  CHECK(a.Int("absent", 7) == 7);
  // Floats print exactly (shortest round-trip form).
  CHECK(AttrMap{{"x", 0.1}}.ToString() == "{x=0.1}");
  CHECK(AttrMap{{"x", 0.30000000000000004}}.ToString() == "{x=0.30000000000000004}");
  CHECK(a.ToString() == "{big=1099511627776, groups=2, mode=\"tanh\", momentum=0.3, training=true}");
}

}  // namespace loom

namespace loom {

TEST_CASE("a wrongly typed attribute read inside type inference is an error, not a crash") {
  AttrMap a{{"groups", std::string("two")}};
  {
    AttrTypeErrors errors;
    CHECK(a.Int("groups", 1) == 1);
    CHECK(errors.first() == "attribute 'groups' is \"two\", of the wrong type");
  }
}

}  // namespace loom
