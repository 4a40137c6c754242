#include "graph/strategy.h"

#include <catch2/catch.hpp>

#include <map>

#include "graph/fusion.h"
#include "graph/model.h"
#include "models/zoo.h"

namespace loom {
namespace {

using Catch::Contains;

std::string ErrorOf(const std::string& text) {
  auto s = Strategy::Parse(text, "s.pbtxt");
  REQUIRE(!s.ok());
  return s.status().message();
}

// The zoo CNN: two conv stages (8x8 images, 4 and 6 channels), fc 8, 4 classes.
Graph Cnn() {
  Model m;
  REQUIRE(models::BuildClassifier(m, "cnn", {{"channels", "4,6"}, {"hidden", "8"}}, {1, 8, 8}, 6, 4).ok());
  return m.graph();
}

std::map<std::string, LayerSplit> ByName(const Graph& g, const Strategy& s) {
  auto resolved = s.Resolve(g);
  if (!resolved.ok()) FAIL(resolved.status().ToString());
  std::map<std::string, LayerSplit> out;
  for (const auto& [id, split] : *resolved) out[g.node(id).name] = split;
  return out;
}

std::string ResolveError(const Graph& g, const std::string& text) {
  auto s = Strategy::Parse(text, "s.pbtxt");
  REQUIRE(s.ok());
  auto r = s->Resolve(g);
  REQUIRE(!r.ok());
  return r.status().message();
}

TEST_CASE("layer patterns: '*' any run, '?' one character") {
  CHECK(GlobMatch("fc", "fc"));
  CHECK(!GlobMatch("fc", "fc2"));
  CHECK(GlobMatch("fc*", "fc2"));
  CHECK(GlobMatch("*conv", "stage1/conv"));
  CHECK(GlobMatch("stage?/conv", "stage2/conv"));
  CHECK(!GlobMatch("stage?/conv", "stage12/conv"));
  CHECK(GlobMatch("*", ""));
  CHECK(GlobMatch("a*b*c", "aXbYbZc"));
  CHECK(!GlobMatch("a*b*c", "aXbYbZ"));
}

TEST_CASE("parts placed grouped by replica: a replica group's parts on adjacent devices") {
  LayerSplit s;
  s.degree = {2, 4, 1, 1};  // sample 2 x replica 4
  s.PlaceGroupedByReplica(0);
  CHECK(s.devices == std::vector<int64_t>{0, 2, 4, 6, 1, 3, 5, 7});
  s.degree = {2, 2, 1, 2};  // sample 2 x replica 2 x parameter 2, from device 8
  s.PlaceGroupedByReplica(8);
  CHECK(s.devices == std::vector<int64_t>{8, 9, 12, 13, 10, 11, 14, 15});
  s.degree = {2, 1, 2, 1};  // no replicas: the parts' order
  s.PlaceGroupedByReplica(4);
  CHECK(s.devices == std::vector<int64_t>{4, 5, 6, 7});
}

TEST_CASE("a strategy file's own errors name the file, the line and the field") {
  CHECK_THAT(ErrorOf("devices: 2\nlayer { layer: \"fc\" sample: 2\n"), Contains("s.pbtxt:3:1:"));
  CHECK(ErrorOf("devices: 0\n") == "s.pbtxt:1: field devices: must be >= 1, got 0");
  CHECK(ErrorOf("devices: 2\nlayer {\n  layer: \"fc\"\n  sample: -2\n}\n") ==
        "s.pbtxt:2: field layer[0].sample: must be >= 1 (0 or unset: 1), got -2");
  CHECK(ErrorOf("devices: 4\nlayer { layer: \"fc\" sample: 2 parameter: 2\n devices: [0, 1, 2] }\n") ==
        "s.pbtxt:3: field layer[0].devices: 3 device(s) for 4 part(s) (sample 2 x parameter 2 on devices 0,1,2): "
        "one device per part");
  CHECK(ErrorOf("devices: 2\nlayer { layer: \"fc\" devices: 2 }\n") ==
        "s.pbtxt:2: field layer[0].devices: device 2 is not one of the strategy's 2 (0 to 1)");
  CHECK(ErrorOf("devices: 2\nlayer { layer: \"fc\" sample: 2 devices: [1, 1] }\n") ==
        "s.pbtxt:2: field layer[0].devices: device 1 holds two parts of one layer (each part needs its own device)");
  CHECK(ErrorOf("devices: 2\ndefault_split { sample: 4 }\n") ==
        "s.pbtxt:2: field default_split: 4 parts need 4 devices, the strategy has 2");
  CHECK(ErrorOf("devices: 2\nlayer { sample: 2 }\n") ==
        "s.pbtxt:2: field layer[0].layer: is required (a layer's name or a pattern)");
  CHECK(ErrorOf("devices: 2\ndefault_split { layer: \"fc\" }\n") ==
        "s.pbtxt:2: field default_split.layer: the default applies to every layer no entry names; write a layer { } "
        "entry to name one");
  CHECK_THAT(ErrorOf("devices: 2\nlayers { }\n"), Contains("s.pbtxt:2:"));
  auto missing = Strategy::Load("/nonexistent/strategy.pbtxt");
  REQUIRE(!missing.ok());
  CHECK(missing.status().message() == "/nonexistent/strategy.pbtxt: cannot open the strategy file");
}

TEST_CASE("the default splits each layer along what it can split; entries apply as written, first match first") {
  const Graph g = Cnn();
  auto s = Strategy::Parse(R"(
devices: 4
default_split { sample: 2 devices: [2, 3] }
layer { layer: "stage1/conv" attribute: 2 }
layer { layer: "fc" parameter: 2 devices: [1, 3] }
layer { layer: "classifier" devices: 1 }
layer { layer: "stage?/conv" sample: 2 devices: [0, 1] }
)",
                           "s.pbtxt");
  if (!s.ok()) FAIL(s.status().ToString());
  const auto splits = ByName(g, *s);
  CHECK(splits.at("stage1/conv").ToString() == "attribute 2 on devices 0,1");
  CHECK(splits.at("stage2/conv").ToString() == "sample 2 on devices 0,1");  // the last entry, by its pattern
  CHECK(splits.at("fc").ToString() == "parameter 2 on devices 1,3");
  CHECK(splits.at("classifier").ToString() == "whole on device 1");
  // BatchNorm takes the default's sample split; it cannot split rows: an
  // attribute default leaves it whole on its first device.
  CHECK(splits.at("stage1/bn").ToString() == "sample 2 on devices 2,3");
  for (const auto& [name, split] : splits) {
    INFO(name);
    if (name.rfind("stage", 0) == 0 || name == "fc" || name == "classifier") continue;
    const Node& n = g.node(*g.FindNode(name));
    if (n.op == "ReLU") CHECK(split.ToString() == "sample 2 on devices 2,3");  // element-wise: the default
  }
}

TEST_CASE("splits a layer cannot take are errors naming the line, the layer and the dimension") {
  const Graph g = Cnn();
  CHECK(ResolveError(g, "devices: 3\nlayer { layer: \"stage1/conv\" attribute: 3 }\n") ==
        "s.pbtxt:2: layer 'stage1/conv' (Conv2d): attribute 3: its extent 8 (output 0 axis 2 of [6, 4, 8, 8]) is "
        "not divisible by 3");
  CHECK(ResolveError(g, "devices: 3\nlayer { layer: \"fc\" parameter: 3 }\n") ==
        "s.pbtxt:2: layer 'fc' (Linear): parameter 3: its extent 8 (output 0 axis 1 of [6, 8]) is not divisible by 3");
  CHECK(ResolveError(g, "devices: 2\nlayer { layer: \"fc\" replica: 2 }\n") ==
        "s.pbtxt:2: layer 'fc' (Linear): replica 2: its output has no replica axis (not a fused array's layer)");
  CHECK(ResolveError(g, "devices: 2\nlayer { layer: \"fc\" attribute: 2 }\n") ==
        "s.pbtxt:2: layer 'fc' (Linear): attribute 2: its op cannot be split along attribute");
  CHECK(ResolveError(g, "devices: 2\nlayer { layer: \"fc\" }\nlayer {\n  layer: \"conv9*\"\n}\n") ==
        "s.pbtxt:4: layer pattern 'conv9*' matches no layer of the model");
}

// An Embedding splits its parameter dimension along the embedding columns
// by default, or along its vocabulary when the entry names that variant.
TEST_CASE("parameter_split names one of an op's parameter splits; a name the op lacks is an error") {
  Model m;
  const Sym e = m.embedding(m.input("input", {4, 3}, DType::kI64), 12, 8, -1, "embed");
  m.set_output("loss", m.mean(m.linear(e, 6, {}, "fc"), {0, 1, 2}));
  REQUIRE(m.status().ok());
  const Graph& g = m.graph();
  auto s = Strategy::Parse("devices: 3\ndefault_split { parameter: 3 parameter_split: \"vocabulary\" }\n"
                           "layer { layer: \"fc\" parameter: 2 }\n",
                           "s.pbtxt");
  if (!s.ok()) FAIL(s.status().ToString());
  const auto splits = ByName(g, *s);
  CHECK(splits.at("embed").ToString() == "parameter 3 (vocabulary) on devices 0,1,2");
  CHECK(splits.at("fc").ToString() == "parameter 2 on devices 0,1");
  // A default's variant applies where a layer has it; the others stay whole.
  for (const auto& [name, split] : splits)
    if (name != "embed" && name != "fc") CHECK(split.ToString() == "whole on device 0");
  CHECK(ResolveError(g, "devices: 2\nlayer { layer: \"embed\" parameter: 2 parameter_split: \"vocab\" }\n") ==
        "s.pbtxt:2: layer 'embed' (Embedding): parameter 2: its op has no parameter split 'vocab' (its variants: "
        "'vocabulary')");
  CHECK(ResolveError(g, "devices: 3\nlayer { layer: \"embed\" parameter: 3 }\n") ==
        "s.pbtxt:2: layer 'embed' (Embedding): parameter 3: its extent 8 (output 0 axis 2 of [4, 3, 8]) is not "
        "divisible by 3");
  CHECK(ResolveError(g, "devices: 2\nlayer { layer: \"fc\" parameter: 2 parameter_split: \"vocabulary\" }\n") ==
        "s.pbtxt:2: layer 'fc' (Linear): parameter 2: its op has no parameter split 'vocabulary' (its variants: "
        "none)");
  CHECK(ErrorOf("devices: 2\nlayer { layer: \"embed\" parameter_split: \"vocabulary\" }\n") ==
        "s.pbtxt:2: field layer[0].parameter_split: 'vocabulary' names how to split along parameter, but parameter "
        "is 1");
}

TEST_CASE("pooling splits its channels and its output rows; adaptive windows only their channels") {
  auto s = Strategy::Parse("devices: 2\nlayer { layer: \"stage1/max_pool2d\" parameter: 2 }\n", "s.pbtxt");
  REQUIRE(s.ok());
  CHECK(ByName(Cnn(), *s).at("stage1/max_pool2d").ToString() == "parameter 2 on devices 0,1");
  auto rows = Strategy::Parse("devices: 2\nlayer { layer: \"stage1/max_pool2d\" attribute: 2 }\n", "s.pbtxt");
  REQUIRE(rows.ok());
  CHECK(ByName(Cnn(), *rows).at("stage1/max_pool2d").ToString() == "attribute 2 on devices 0,1");
  Model m;
  Sym x = m.input("x", {2, 3, 8, 8});
  m.set_output("y", m.avg_pool2d(x, {2, 2}, {}, "pool"));
  m.set_output("z", m.adaptive_avg_pool2d(x, {4, 4}, "adaptive"));
  REQUIRE(m.status().ok());
  // Adaptive windows depend on the extent a part would see.
  CHECK(ResolveError(m.graph(), "devices: 2\nlayer { layer: \"adaptive\" attribute: 2 }\n") ==
        "s.pbtxt:2: layer 'adaptive' (AdaptiveAvgPool2d): attribute 2: its op cannot be split along attribute");
  CHECK(ResolveError(m.graph(), "devices: 3\nlayer { layer: \"pool\" attribute: 3 }\n") ==
        "s.pbtxt:2: layer 'pool' (AvgPool2d): attribute 3: its extent 4 (output 0 axis 2 of [2, 3, 4, 4]) is "
        "not divisible by 3");
  auto two = Strategy::Parse("devices: 2\nlayer { layer: \"pool\" attribute: 2 }\n", "s.pbtxt");
  REQUIRE(two.ok());
  CHECK(ByName(m.graph(), *two).at("pool").ToString() == "attribute 2 on devices 0,1");
}

TEST_CASE("BatchNorm splits its channels and its batch; LayerNorm its rows") {
  auto s = Strategy::Parse("devices: 2\nlayer { layer: \"stage1/bn\" parameter: 2 }\n", "s.pbtxt");
  REQUIRE(s.ok());
  CHECK(ByName(Cnn(), *s).at("stage1/bn").ToString() == "parameter 2 on devices 0,1");
  auto batch = Strategy::Parse("devices: 2\nlayer { layer: \"stage1/bn\" sample: 2 }\n", "s.pbtxt");
  REQUIRE(batch.ok());
  CHECK(ByName(Cnn(), *batch).at("stage1/bn").ToString() == "sample 2 on devices 0,1");
  CHECK(ResolveError(Cnn(), "devices: 2\nlayer { layer: \"stage1/bn\" attribute: 2 }\n") ==
        "s.pbtxt:2: layer 'stage1/bn' (BatchNorm): attribute 2: its op cannot be split along attribute");
  Model m;
  Sym x = m.input("x", {4, 6});
  m.set_output("y", m.layer_norm(x, {6}, 1e-5, "ln"));
  REQUIRE(m.status().ok());
  auto t = Strategy::Parse("devices: 2\ndefault_split { sample: 2 }\n", "t.pbtxt");
  REQUIRE(t.ok());
  CHECK(ByName(m.graph(), *t).at("ln").ToString() == "sample 2 on devices 0,1");
}

TEST_CASE("the sample split follows the batch through a swap to time-major and back") {
  // rnnlm's shape: ids [B, T] -> [T, B] -> embedding -> LSTM -> [B, T, H].
  Model m;
  const Sym ids = m.input("ids", {4, 6}, DType::kI64);
  const Sym h = m.lstm(m.dropout(m.embedding(m.transpose(ids, {1, 0}), 9, 3, -1, "embed"), 0.5, "drop"), 5, {}, "lstm");
  const Sym y = m.transpose(h, {1, 0, 2});
  m.set_output("y", m.reshape(y, {24, 5}));
  REQUIRE(m.status().ok());
  const Graph& g = m.graph();
  const std::vector<int> axes = BatchAxes(g);
  auto axis = [&](Sym s) { return axes.at(static_cast<size_t>(s.id)); };
  CHECK(axis(ids) == 0);
  CHECK(axis(h) == 1);
  CHECK(axis(y) == 0);
  // Every layer splits the batch (4): time (6) is not divisible by 4, and
  // the labelled rules (axis 0 of each output) would split it.
  auto s = Strategy::Parse("devices: 4\ndefault_split { sample: 4 }\n", "s.pbtxt");
  REQUIRE(s.ok());
  for (const auto& [name, split] : ByName(g, *s)) {
    if (g.node(*g.FindNode(name)).op == "Fill") continue;  // the LSTM's zero states have no batch to follow
    INFO(name);
    CHECK(split.ToString() == "sample 4 on devices 0,1,2,3");
  }
}

// A reshape of a weight (what a fused array's stacked weights are) reads no
// samples: the default sample split replicates it on its devices instead of
// running it whole on device 0.
TEST_CASE("a layer that reads only parameters replicates under the default sample split") {
  Model m;
  const Sym x = m.input("x", {4, 6});
  const Sym w = m.parameter("w", {2, 3, 5}, AttrMap{{"init", "uniform"}, {"low", -0.5}, {"high", 0.5}});
  const Sym flat = m.op1("Reshape", {w}, AttrMap{{"shape", std::vector<int64_t>{6, 5}}}, "w_flat");
  m.set_output("y", m.op1("MatMul", {x, flat}, {}, "mm"));
  REQUIRE(m.status().ok());
  const std::vector<int> axes = BatchAxes(m.graph());
  CHECK(axes.at(static_cast<size_t>(w.id)) == kNoSamples);
  CHECK(axes.at(static_cast<size_t>(flat.id)) == kNoSamples);
  CHECK(axes.at(static_cast<size_t>(x.id)) == 0);
  auto s = Strategy::Parse("devices: 4\ndefault_split { sample: 4 }\n", "s.pbtxt");
  REQUIRE(s.ok());
  const auto splits = ByName(m.graph(), *s);
  CHECK(splits.at("w_flat").ToString() == "sample 4 on devices 0,1,2,3");
  CHECK(splits.at("mm").ToString() == "sample 4 on devices 0,1,2,3");
  auto rules = NodeSplitRules(m.graph(), m.graph().node(*m.graph().FindNode("w_flat")), axes);
  REQUIRE(rules.ok());
  REQUIRE(rules->sample);
  CHECK(rules->sample->Replicates());
}

// A training BatchNorm realises its sample split by its expansion; the
// batch still follows it. It did not: past the first BatchNorm no axis held
// a known batch, and a fused Linear's input transpose ([B, R, F] to
// [R, B, F], whose labelled sample rule would split the replicas) ran whole
// on device 0 under data parallelism.
TEST_CASE("the sample split follows the batch through a training BatchNorm into a fused Linear") {
  auto fused = FuseReplicas(Cnn(), FusionOptions{4, {1, 2, 3, 4}, {}, {}});
  REQUIRE(fused.ok());
  const std::vector<int> axes = BatchAxes(*fused);
  const Node& bn = fused->node(*fused->FindNode("stage1/bn"));
  CHECK(axes.at(static_cast<size_t>(bn.outputs[0])) == 0);
  auto s = Strategy::Parse("devices: 2\ndefault_split { sample: 2 }\n", "s.pbtxt");
  REQUIRE(s.ok());
  CHECK(ByName(*fused, *s).at("fc/x/move_replica_axis").ToString() == "sample 2 on devices 0,1");
}

TEST_CASE("replica splits follow the fused array's replica axis") {
  auto fused = FuseReplicas(Cnn(), FusionOptions{4, {1, 2, 3, 4}, {}, {}});
  REQUIRE(fused.ok());
  auto s = Strategy::Parse("devices: 2\ndefault_split { replica: 2 }\n", "s.pbtxt");
  REQUIRE(s.ok());
  const auto splits = ByName(*fused, *s);
  CHECK(splits.at("stage1/conv").ToString() == "replica 2 on devices 0,1");
  CHECK(splits.at("fc").ToString() == "replica 2 on devices 0,1");
  CHECK(ResolveError(*fused, "devices: 3\nlayer { layer: \"fc\" replica: 3 }\n") ==
        "s.pbtxt:2: layer 'fc' (Linear): replica 3: its 4 replicas are not divisible by 3");
}

TEST_CASE("strategies print as the text they parse from") {
  auto s = Strategy::Parse("devices: 2\ndefault_split { sample: 2 }\nlayer { layer: \"fc\" devices: 1 }\n", "s.pbtxt");
  REQUIRE(s.ok());
  auto again = Strategy::Parse(StrategyToText(s->proto()), "again.pbtxt");
  REQUIRE(again.ok());
  CHECK(StrategyToText(again->proto()) == StrategyToText(s->proto()));
}

}  // namespace
}  // namespace loom
