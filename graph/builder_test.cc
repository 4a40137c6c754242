#include "graph/builder.h"

#include <catch2/catch.hpp>

#include <set>

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
  CHECK(mistyped.status().message().find("attribute 'groups' must be of type int") != std::string::npos);
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

namespace loom {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("a misspelled attribute is an error naming the node, op and attribute, listing the declared ones") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape{1, 4, 8, 8}, DType::kF32});
  ValueId w = b.Input("w", {Shape{4, 2, 3, 3}, DType::kF32});
  auto r = b.Add("Conv2d", {x, w}, AttrMap{{"grups", int64_t{2}}}, "conv");
  REQUIRE_FALSE(r.ok());
  const std::string m = r.status().message();
  INFO(m);
  CHECK(m.find("node 'conv' (Conv2d)") == 0);
  CHECK_THAT(m, Contains("unknown attribute 'grups'") && Contains("groups: int = 1") &&
                    Contains("stride: int or int list = 1"));
  CHECK(g.num_nodes() == 2);  // nothing was added
}

TEST_CASE("an attribute of the wrong type or a missing required one is an error") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape{2, 3}, DType::kF32});
  auto mistyped = b.Add("LayerNorm", {x}, AttrMap{{"normalized_shape", std::vector<int64_t>{3}}, {"eps", "small"}}, "ln");
  REQUIRE_FALSE(mistyped.ok());
  INFO(mistyped.status().message());
  CHECK_THAT(mistyped.status().message(),
             Contains("node 'ln' (LayerNorm)") && Contains("attribute 'eps' must be of type float, got \"small\""));
  auto missing = b.Add("LayerNorm", {x}, {}, "ln");
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.status().message(), Contains("missing required attribute 'normalized_shape'"));
  // An int is a float (eps=1 is 1.0).
  CHECK(b.Add("LayerNorm", {x}, AttrMap{{"normalized_shape", std::vector<int64_t>{3}}, {"eps", 1}}, "ln").ok());
}

TEST_CASE("built nodes hold every declared attribute that has a default") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape{1, 4, 8, 8}, DType::kF32});
  ValueId w = b.Input("w", {Shape{4, 4, 3, 3}, DType::kF32});
  ValueId y = b.Add1("Conv2d", {x, w}, AttrMap{{"padding", int64_t{1}}}, "conv").value();
  const AttrMap& a = g.node(g.value(y).producer).attrs;
  CHECK(a == AttrMap{{"stride", int64_t{1}}, {"padding", int64_t{1}}, {"dilation", int64_t{1}}, {"groups", int64_t{1}}});
  // Sources too: dtype is filled in.
  CHECK(g.node(g.value(x).producer).attrs.Str("dtype") == "f32");
  ValueId loss = b.Add1("CrossEntropy", {b.Input("logits", {Shape{2, 3}, DType::kF32}),
                                         b.Input("labels", {Shape{2}, DType::kI64})},
                        {}, "loss")
                     .value();
  CHECK(g.node(g.value(loss).producer).attrs.Int("ignore_index") == -100);
}

AttrValue SomeValueOf(AttrType type) {
  switch (type) {
    case AttrType::kInt:
    case AttrType::kIntOrInts: return int64_t{1};
    case AttrType::kFloat:
    case AttrType::kFloatOrFloats: return 1.0;
    case AttrType::kBool: return true;
    case AttrType::kString: return std::string("x");
    case AttrType::kInts: return std::vector<int64_t>{1};
    case AttrType::kFloats: return std::vector<double>{1.0};
  }
  return int64_t{0};
}

// Every op declares its attributes, and each default is of its type and
// canonicalizes to itself (so defaults survive a save and load unchanged).
TEST_CASE("every registered op declares its attributes") {
  const OpRegistry& registry = OpRegistry::Global();
  REQUIRE(registry.OpNames().size() > 50);
  for (const std::string& name : registry.OpNames()) {
    INFO(name);
    const AttrSchema* schema = registry.FindOp(name)->attr_schema();
    REQUIRE(schema != nullptr);
    AttrMap defaults;
    std::set<std::string> names;
    for (const AttrDecl& d : schema->decls()) {
      CHECK(names.insert(d.name).second);
      CHECK_FALSE(d.doc.empty());
      CHECK_FALSE((d.required && d.default_value));
      if (d.default_value) defaults.Set(d.name, *d.default_value);
    }
    AttrMap canonical;
    for (const AttrDecl& d : schema->decls())
      if (d.required) canonical.Set(d.name, SomeValueOf(d.type));
    AttrMap given = canonical;
    CHECK(schema->Canonicalize(&canonical).ok());
    for (const auto& [attr, value] : defaults.values()) CHECK(canonical.values().at(attr) == value);
    CHECK(canonical.values().size() == given.values().size() + defaults.values().size());
  }
}

// An op that reads an attribute it does not declare: type inference of a
// node of it fails in the builder, so every op test catches such a read.
class ReadsUndeclaredOp : public OpDef {
 public:
  ReadsUndeclaredOp() { DeclareAttrs().Default("alpha", 1.0, "a declared attribute"); }
  std::string name() const override { return "TestReadsUndeclared"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    if (attrs.Float("alpha") > 0 && attrs.Int("beta") == 0) return in;
    return in;
  }
};
LOOM_REGISTER_OP(ReadsUndeclaredOp);

TEST_CASE("type inference reading an undeclared attribute is an error naming it") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape{2}, DType::kF32});
  auto r = b.Add("TestReadsUndeclared", {x}, {}, "bad");
  REQUIRE_FALSE(r.ok());
  INFO(r.status().message());
  CHECK_THAT(r.status().message(), Contains("node 'bad' (TestReadsUndeclared)") &&
                                       Contains("read attribute 'beta', which is absent and has no default") &&
                                       Contains("alpha: float = 1"));
}

}  // namespace
}  // namespace loom
