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

TEST_CASE("a schema checks names, types and required attributes, and fills defaults") {
  AttrSchema s;
  s.Default("groups", 1, "channel groups")
      .Default("eps", 1e-5, "added to the variance")
      .Default("stride", AttrType::kIntOrInts, int64_t{1}, "one or per dim")
      .Required("shape", AttrType::kInts, "the shape")
      .Optional("scale", AttrType::kFloat, "absent: derived");
  CHECK(s.ToString() ==
        "groups: int = 1, eps: float = 1e-05, stride: int or int list = 1, shape: int list (required), scale: float");

  AttrMap a{{"shape", std::vector<int64_t>{2}}, {"eps", 1}, {"stride", std::vector<int64_t>{2, 1}}};
  REQUIRE(s.Canonicalize(&a).ok());
  CHECK(a.Int("groups") == 1);
  CHECK(a.Float("eps") == 1.0);  // an int is a float
  CHECK_FALSE(a.Has("scale"));   // optional: no default

  CHECK(s.Check(AttrMap{{"shape", std::vector<int64_t>{}}, {"grups", 2}}).message() ==
        "unknown attribute 'grups' (declared: " + s.ToString() + ")");
  CHECK(s.Check(AttrMap{{"shape", std::vector<int64_t>{}}, {"groups", 2.0}}).message().find(
            "attribute 'groups' must be of type int, got 2 (declared: ") == 0);
  CHECK(s.Check(AttrMap{}).message() == "missing required attribute 'shape' (int list: the shape)");
  // An empty list parses as an int list; it is an empty float list too.
  CHECK(AttrTypeAccepts(AttrType::kFloats, std::vector<int64_t>{}));
  CHECK_FALSE(AttrTypeAccepts(AttrType::kFloats, std::vector<int64_t>{1}));
  CHECK(AttrTypeAccepts(AttrType::kFloatOrFloats, std::vector<double>{0.1, 0.2}));
}

TEST_CASE("reads of absent attributes without a default are recorded") {
  AttrMap a{{"present", int64_t{1}}};
  AttrMissingReads missing;
  CHECK(a.Int("present") == 1);
  CHECK(a.Int("absent", 5) == 5);  // a default: not recorded
  CHECK(missing.first().empty());
  CHECK(a.Float("undeclared") == 0);
  CHECK(missing.first() == "undeclared");
}

}  // namespace loom
