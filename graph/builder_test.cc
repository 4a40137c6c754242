#include "graph/builder.h"

#include <catch2/catch.hpp>

namespace loom {
namespace {

TEST_CASE("the builder names the node, the op and the input types in errors") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape{2, 3, 8, 8}, DType::kF32});
  ValueId w = b.Input("w", {Shape{4, 3, 3, 3}, DType::kF32});

  auto unknown = b.Add("Conv2D", {x, w}, {}, "conv");
  REQUIRE_FALSE(unknown.ok());
  INFO(unknown.status().message());
  CHECK(unknown.status().message().find("node 'conv' (Conv2D): unknown op 'Conv2D' (did you mean Conv2d, Conv1d") == 0);

  // A mistyped attribute is an error (not an abort), naming the node.
  auto mistyped = b.Add("Conv2d", {x, w}, AttrMap{{"groups", std::string("two")}}, "conv");
  REQUIRE_FALSE(mistyped.ok());
  INFO(mistyped.status().message());
  CHECK(mistyped.status().message().find("node 'conv' (Conv2d)") == 0);
  CHECK(mistyped.status().message().find("attribute 'groups' must be an int") != std::string::npos);
  // Ops that read attributes without their own type checks are covered by
  // the builder's AttrTypeErrors scope.
  auto mistyped_pool = b.Add("AdaptiveAvgPool2d", {x}, AttrMap{{"output_size", 2.5}}, "pool");
  REQUIRE_FALSE(mistyped_pool.ok());
  INFO(mistyped_pool.status().message());
  CHECK(mistyped_pool.status().message().find("node 'pool' (AdaptiveAvgPool2d)") == 0);

  auto ok = b.Add("Conv2d", {x, w}, AttrMap{{"padding", std::vector<int64_t>{1, 1}}}, "conv");
  REQUIRE(ok.ok());
  CHECK(g.type((*ok)[0]).shape == Shape({2, 4, 8, 8}));
  CHECK(g.node(g.value((*ok)[0]).producer).name == "conv");

  // Scopes prefix names; duplicates are made unique.
  b.PushScope("block");
  auto n1 = b.Add1("Neg", {x}, {}, "neg");
  auto n2 = b.Add1("Neg", {x}, {}, "neg");
  b.PopScope();
  CHECK(g.value(*n1).name == "block/neg");
  CHECK(g.value(*n2).name == "block/neg_1");
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

TEST_CASE("value types stay valid while nodes are appended (gradient rules rely on it)") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape{3, 5}, DType::kF32});
  const TensorType& t = g.type(x);
  const Shape* address = &t.shape;
  for (int i = 0; i < 2000; ++i) REQUIRE(b.Add1("Neg", {x}, {}, "neg").ok());
  CHECK(&g.type(x).shape == address);
  CHECK(t.shape == Shape({3, 5}));
}

}  // namespace
}  // namespace loom
