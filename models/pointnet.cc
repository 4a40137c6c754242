#include "models/pointnet.h"

#include <optional>

namespace loom::models {
namespace {

// The k x k identity as a constant [1, k*k] that no input or parameter feeds
// (so training leaves it alone and fusion shares it between replicas). There
// is no eye op or initializer, so: Concat(ones [k, 1], zeros [k, k]) along
// axis 1 is [k, k+1] with rows [1, 0, ..., 0]; flattened, its ones sit at
// i * (k+1), which is exactly where the flattened identity has them; the first
// k*k entries are the identity.
Sym FlatIdentity(Model& m, int64_t k) {
  const std::string dt(DTypeName(m.dtype()));
  Sym ones = m.op1("Fill", {}, {{"shape", std::vector<int64_t>{k, 1}}, {"value", 1.0}, {"dtype", dt}}, "eye/ones");
  Sym zeros = m.op1("Fill", {}, {{"shape", std::vector<int64_t>{k, k}}, {"value", 0.0}, {"dtype", dt}}, "eye/zeros");
  Sym rows = m.concat({ones, zeros}, 1);  // [k, k+1]
  Sym flat = m.slice(m.reshape(rows, {k * (k + 1)}), 0, 0, k * k);
  return m.reshape(flat, {1, k * k});
}

Sym MaxOverPoints(Model& m, Sym x) {  // [B, C, N] -> [B, C]
  return m.op1("ReduceMax", {x}, {{"axes", std::vector<int64_t>{2}}, {"keepdims", false}});
}

Sym ConvBn(Model& m, Sym x, int64_t out, const std::string& conv, const std::string& bn, bool relu = true) {
  Sym y = m.batch_norm(m.conv1d(x, out, 1, {}, conv), {}, bn);
  return relu ? m.relu(y) : y;
}

// fxia22's STN3d (k = 3) and STNkd: x [B, k, N] -> the transform [B, k, k].
Sym Stn(Model& m, Sym x, int64_t k, const std::string& name) {
  if (!x.valid()) return {};
  auto s = m.scope(name);
  const int64_t b = m.shape(x)[0];
  Sym h = ConvBn(m, x, 64, "conv1", "bn1");
  h = ConvBn(m, h, 128, "conv2", "bn2");
  h = ConvBn(m, h, 1024, "conv3", "bn3");
  h = MaxOverPoints(m, h);
  h = m.relu(m.batch_norm(m.linear(h, 512, {}, "fc1"), {}, "bn4"));
  h = m.relu(m.batch_norm(m.linear(h, 256, {}, "fc2"), {}, "bn5"));
  h = m.add(m.linear(h, k * k, {}, "fc3"), FlatIdentity(m, k));  // [B, k*k] + [1, k*k]
  return m.reshape(h, {b, k, k});
}

// fxia22: x.transpose(2, 1) bmm trans, transposed back: [B, k, N] -> [B, k, N].
Sym Apply(Model& m, Sym x, Sym trans) {
  Sym xt = m.transpose(x, {0, 2, 1});                // [B, N, k]
  Sym y = m.op1("BatchMatMul", {xt, trans});      // [B, N, k]
  return m.transpose(y, {0, 2, 1});
}

// fxia22's feature_transform_regularizer: mean_b ||I - A A^T||_F^2.
Sym Regularizer(Model& m, Sym a, double weight) {
  if (!a.valid()) return {};
  const int64_t k = m.shape(a)[1];
  Sym aat = m.op1("BatchMatMul", {a, a}, {{"transpose_b", true}});  // [B, k, k]
  Sym d = m.sub(aat, m.reshape(FlatIdentity(m, k), {1, k, k}));
  Sym per_example = m.sum(m.mul(d, d), {1, 2});  // [B]
  return m.scale(m.mean(per_example), weight);
}

}  // namespace

PointNetFeatures PointNetFeat(Model& m, Sym x, bool feature_transform, double regularizer_weight, bool per_point) {
  auto feat = m.scope("feat");
  PointNetFeatures f;
  Sym h = Apply(m, x, Stn(m, x, 3, "stn"));
  h = ConvBn(m, h, 64, "conv1", "bn1");
  if (feature_transform) {
    Sym trans_feat = Stn(m, h, 64, "fstn");
    h = Apply(m, h, trans_feat);
    f.regularizer = Regularizer(m, trans_feat, regularizer_weight);
  }
  Sym point_features = h;  // [B, 64, N]
  h = ConvBn(m, h, 128, "conv2", "bn2");
  h = ConvBn(m, h, 1024, "conv3", "bn3", /*relu=*/false);
  f.global = MaxOverPoints(m, h);  // [B, 1024]
  if (per_point && f.global.valid()) {
    const Shape& s = m.shape(h);  // [B, 1024, N]
    Sym repeated = m.op1("BroadcastTo", {m.reshape(f.global, {s[0], s[1], 1})}, {{"shape", s.dims()}});
    f.per_point = m.concat({repeated, point_features}, 1);  // fxia22: cat([x, pointfeat], 1)
  }
  return f;
}

PointNetResult PointNetCls(Model& m, Sym x, const PointNetOptions& o, const std::string& name) {
  std::optional<Model::Scope> outer;
  if (!name.empty()) outer.emplace(m.scope(name));
  PointNetFeatures f = PointNetFeat(m, x, o.feature_transform, o.regularizer_weight, /*per_point=*/false);
  Sym h = m.relu(m.batch_norm(m.linear(f.global, 512, {}, "fc1"), {}, "bn1"));
  h = m.relu(m.batch_norm(m.dropout(m.linear(h, 256, {}, "fc2"), o.dropout, "dropout"), {}, "bn2"));
  return {m.linear(h, o.num_classes, {}, "fc3"), f.regularizer};
}

PointNetResult PointNetDenseCls(Model& m, Sym x, const PointNetSegOptions& o, const std::string& name) {
  std::optional<Model::Scope> outer;
  if (!name.empty()) outer.emplace(m.scope(name));
  PointNetFeatures f = PointNetFeat(m, x, o.feature_transform, o.regularizer_weight, /*per_point=*/true);
  Sym h = ConvBn(m, f.per_point, 512, "conv1", "bn1");
  h = ConvBn(m, h, 256, "conv2", "bn2");
  h = ConvBn(m, h, 128, "conv3", "bn3");
  Sym scores = m.conv1d(h, o.num_parts, 1, {}, "conv4");  // [B, parts, N]
  return {m.transpose(scores, {0, 2, 1}), f.regularizer};  // [B, N, parts]
}

}  // namespace loom::models
