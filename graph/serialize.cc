#include "graph/serialize.h"

#include "core/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <variant>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>

#include "graph/builder.h"
#include "graph/verifier.h"
#include "ops/op.h"

namespace loom {
namespace {

constexpr int kFormatVersion = 1;

// ---- attributes ----

enum class AttrKind { kInt, kFloat, kBool, kString, kInts, kFloats };

const char* AttrKindName(AttrKind k) {
  switch (k) {
    case AttrKind::kInt: return "int (i)";
    case AttrKind::kFloat: return "float (f)";
    case AttrKind::kBool: return "bool (b)";
    case AttrKind::kString: return "string (s)";
    case AttrKind::kInts: return "int list (ints)";
    case AttrKind::kFloats: return "float list (floats)";
  }
  return "?";
}

// Attributes whose kind is the same for every op that reads them. Float
// attributes also accept an int (AttrMap::Float reads both).
const std::map<std::string, AttrKind>& FixedAttrKinds() {
  static const std::map<std::string, AttrKind> kinds = {
      {"shape", AttrKind::kInts},    {"dtype", AttrKind::kString},     {"init", AttrKind::kString},
      {"value", AttrKind::kFloat},   {"mean", AttrKind::kFloat},       {"std", AttrKind::kFloat},
      {"low", AttrKind::kFloat},     {"high", AttrKind::kFloat},       {"transpose_a", AttrKind::kBool},
      {"transpose_b", AttrKind::kBool},
  };
  return kinds;
}

void AttrToProto(const AttrValue& value, proto::AttrValue* out) {
  std::visit(
      [out](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          out->set_i(v);
        } else if constexpr (std::is_same_v<T, double>) {
          out->set_f(v);
        } else if constexpr (std::is_same_v<T, bool>) {
          out->set_b(v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          out->set_s(v);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          auto* list = out->mutable_ints();
          for (int64_t x : v) list->add_values(x);
        } else {
          static_assert(std::is_same_v<T, std::vector<double>>, "an AttrValue kind is not serialized");
          auto* list = out->mutable_floats();
          for (double x : v) list->add_values(x);
        }
      },
      value);
}

StatusOr<AttrValue> AttrFromProto(const proto::AttrValue& p, const std::string& name) {
  AttrValue value;
  AttrKind kind;
  switch (p.value_case()) {
    case proto::AttrValue::kI: value = static_cast<int64_t>(p.i()); kind = AttrKind::kInt; break;
    case proto::AttrValue::kF: value = p.f(); kind = AttrKind::kFloat; break;
    case proto::AttrValue::kB: value = p.b(); kind = AttrKind::kBool; break;
    case proto::AttrValue::kS: value = p.s(); kind = AttrKind::kString; break;
    case proto::AttrValue::kInts:
      value = std::vector<int64_t>(p.ints().values().begin(), p.ints().values().end());
      kind = AttrKind::kInts;
      break;
    case proto::AttrValue::kFloats:
      value = std::vector<double>(p.floats().values().begin(), p.floats().values().end());
      kind = AttrKind::kFloats;
      break;
    case proto::AttrValue::VALUE_NOT_SET:
    default:
      return InvalidArgument("attribute '", name, "' has no value (set one of i, f, b, s, ints, floats)");
  }
  auto fixed = FixedAttrKinds().find(name);
  if (fixed != FixedAttrKinds().end() && fixed->second != kind &&
      !(fixed->second == AttrKind::kFloat && kind == AttrKind::kInt))
    return InvalidArgument("attribute '", name, "' must be a ", AttrKindName(fixed->second), ", got a ",
                           AttrKindName(kind), " ", AttrValueToString(value));
  return value;
}

// ---- value references ----

std::string DefaultValueName(const Node& n, size_t index) {
  return n.outputs.size() == 1 ? n.name : n.name + ":" + std::to_string(index);
}

std::string RefToString(const proto::ValueRef& ref) {
  switch (ref.ref_case()) {
    case proto::ValueRef::kName: return "'" + ref.name() + "'";
    case proto::ValueRef::kId: return "id " + std::to_string(ref.id());
    default: return "<empty reference>";
  }
}

// Values already created while loading, by file id and by name.
class ValueTable {
 public:
  void AddName(const std::string& name, ValueId v) {
    auto [it, inserted] = by_name_.emplace(name, v);
    if (!inserted && it->second != v) ambiguous_.insert(name);
  }
  // False if the file uses this id twice.
  bool AddId(int64_t id, ValueId v) { return by_id_.emplace(id, v).second; }

  StatusOr<ValueId> Resolve(const proto::ValueRef& ref) const {
    switch (ref.ref_case()) {
      case proto::ValueRef::kName: {
        if (ambiguous_.count(ref.name()))
          return InvalidArgument("value name '", ref.name(),
                                 "' is ambiguous (several values have it); refer to it by id");
        auto it = by_name_.find(ref.name());
        if (it == by_name_.end())
          return InvalidArgument("unknown value '", ref.name(), "' (no earlier node produces a value of that name)");
        return it->second;
      }
      case proto::ValueRef::kId: {
        auto it = by_id_.find(ref.id());
        if (it == by_id_.end())
          return InvalidArgument("unknown value id ", ref.id(), " (no earlier node records an output with that id)");
        return it->second;
      }
      default:
        return InvalidArgument("empty value reference (set name or id)");
    }
  }

 private:
  std::map<std::string, ValueId> by_name_;
  std::set<std::string> ambiguous_;
  std::map<int64_t, ValueId> by_id_;
};

// The verifier checks the layout against the value and the graph.
ReplicaLayout LayoutFromProto(const proto::ReplicaLayoutProto& p) {
  return {p.dim(), p.per_replica() == 0 ? 1 : p.per_replica()};
}

void LayoutToProto(const ReplicaLayout& layout, proto::ReplicaLayoutProto* out) {
  out->set_dim(layout.dim);
  if (layout.replicated() && layout.per_replica != 1) out->set_per_replica(layout.per_replica);
}

StatusOr<TensorType> TypeFromProto(const proto::TensorTypeProto& p) {
  TensorType t;
  std::vector<int64_t> dims(p.shape().begin(), p.shape().end());
  for (int64_t d : dims)
    if (d < 0) return InvalidArgument("negative extent in shape ", Shape(dims).ToString());
  t.shape = Shape(std::move(dims));
  if (p.dtype().empty()) return InvalidArgument("dtype is missing");
  LOOM_ASSIGN_OR_RETURN(t.dtype, ParseDType(p.dtype()));
  return t;
}

Status AddNodeFromProto(const proto::NodeProto& p, int index, Graph* graph, ValueTable* table) {
  std::string where = "node '" + p.name() + "' (" + p.op() + ")";
  if (p.name().empty()) return InvalidArgument("node #", index, " (", p.op(), ") has no name");
  if (graph->FindNode(p.name())) return InvalidArgument(where, ": a node of that name already exists");
  if (p.op().empty()) return InvalidArgument("node '", p.name(), "' has no op");
  auto def = OpRegistry::Global().GetOp(p.op());
  if (!def.ok()) return def.status().WithContext(where);

  AttrMap attrs;
  for (const auto& [name, value] : p.attrs()) {
    if (name.empty()) return InvalidArgument(where, ": an attribute has an empty name");
    auto v = AttrFromProto(value, name);
    if (!v.ok()) return v.status().WithContext(where);
    attrs.Set(name, std::move(*v));
  }
  // A file may leave defaults out (or predate an attribute); the graph in
  // memory holds them, as a built one does.
  LOOM_RETURN_IF_ERROR(CanonicalizeAttrs(**def, &attrs).WithContext(where));

  std::vector<ValueId> inputs;
  for (int i = 0; i < p.inputs_size(); ++i) {
    auto v = table->Resolve(p.inputs(i));
    if (!v.ok()) return v.status().WithContext(where + ": input " + std::to_string(i));
    inputs.push_back(*v);
  }

  std::vector<TensorType> types;
  if (p.outputs_size() == 0) {
    LOOM_ASSIGN_OR_RETURN(types, InferNodeTypes(*graph, p.op(), attrs, inputs, p.name()));
  } else {
    for (int i = 0; i < p.outputs_size(); ++i) {
      auto t = TypeFromProto(p.outputs(i).type());
      if (!t.ok()) return t.status().WithContext(where + ": output " + std::to_string(i));
      types.push_back(*t);
    }
  }

  NodeId id = graph->AddNode(p.name(), p.op(), std::move(attrs), std::move(inputs), types);
  const Node& node = graph->node(id);
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    ValueId v = node.outputs[i];
    if (static_cast<int>(i) < p.outputs_size()) {
      const proto::ValueProto& out = p.outputs(static_cast<int>(i));
      if (!out.name().empty()) graph->mutable_value(v).name = out.name();
      if (out.has_replica_layout()) graph->mutable_value(v).replica_layout = LayoutFromProto(out.replica_layout());
      if (out.has_id() && !table->AddId(out.id(), v))
        return InvalidArgument(where, ": output ", i, " reuses value id ", out.id());
    }
    table->AddName(graph->value(v).name, v);
  }
  return Status::Ok();
}

// ---- files ----

bool IsTextPath(const std::string& path) {
  const std::string ext = ".pbtxt";
  return path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
}

Status FileError(const std::string& what, const std::string& path, int err) {
  std::string message = StrCat("cannot ", what, " graph file '", path, "': ", std::strerror(err));
  if (err == ENOENT) return Status(StatusCode::kNotFound, message);
  if (err == ENOSPC) return Status(StatusCode::kResourceExhausted, message);
  return Status(StatusCode::kInvalidArgument, message);
}

StatusOr<std::string> ReadFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return FileError("read", path, EISDIR);
  std::ifstream in(path, std::ios::binary);
  if (!in) return FileError("open", path, errno);
  std::ostringstream data;
  data << in.rdbuf();
  if (in.bad()) return FileError("read", path, errno);
  return data.str();
}

// Collects text-format errors as "source:line:column: message" (1-based).
class TextErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  explicit TextErrorCollector(std::string source) : source_(std::move(source)) {}
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    errors_ += StrCat(errors_.empty() ? "" : "; ", source_, ":", line + 1, ":", column + 1, ": ", message);
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    warnings_ += StrCat(warnings_.empty() ? "" : "; ", source_, ":", line + 1, ":", column + 1, ": ", message);
  }
  const std::string& errors() const { return errors_; }

 private:
  std::string source_;
  std::string errors_;
  std::string warnings_;
};

StatusOr<proto::GraphProto> ParseText(const std::string& text, const std::string& source) {
  proto::GraphProto proto;
  TextErrorCollector errors(source);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &proto)) {
    if (errors.errors().empty()) return InvalidArgument(source, ": not a valid text GraphProto");
    return InvalidArgument("text GraphProto parse error at ", errors.errors());
  }
  return proto;
}

}  // namespace

StatusOr<proto::GraphProto> GraphToProto(const Graph& graph) {
  Status valid = VerifyGraph(graph);
  if (!valid.ok()) return valid.WithContext("cannot serialize an invalid graph");

  // Names that several values share are written as ids.
  std::map<std::string, int> name_count;
  for (const Node& n : graph.nodes())
    for (ValueId v : n.outputs) ++name_count[graph.value(v).name];
  auto ref = [&](ValueId v, proto::ValueRef* out) {
    const std::string& name = graph.value(v).name;
    if (name_count[name] == 1) out->set_name(name);
    else out->set_id(v);
  };

  proto::GraphProto p;
  p.set_format_version(kFormatVersion);
  for (const Node& n : graph.nodes()) {
    proto::NodeProto* np = p.add_nodes();
    np->set_name(n.name);
    np->set_op(n.op);
    for (const auto& [name, value] : n.attrs.values()) AttrToProto(value, &(*np->mutable_attrs())[name]);
    for (ValueId v : n.inputs) ref(v, np->add_inputs());
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const Value& value = graph.value(n.outputs[i]);
      proto::ValueProto* vp = np->add_outputs();
      vp->set_id(value.id);
      if (value.name != DefaultValueName(n, i)) vp->set_name(value.name);
      for (int64_t d : value.type.shape.dims()) vp->mutable_type()->add_shape(d);
      vp->mutable_type()->set_dtype(DTypeName(value.type.dtype));
      if (value.replica_layout.known()) LayoutToProto(value.replica_layout, vp->mutable_replica_layout());
    }
  }
  for (const auto& [name, v] : graph.outputs()) ref(v, &(*p.mutable_outputs())[name]);
  for (const StateUpdate& u : graph.state_updates()) {
    proto::StateUpdateProto* up = p.add_state_updates();
    ref(u.state, up->mutable_state());
    ref(u.new_value, up->mutable_new_value());
  }
  for (const auto& [v, grad] : graph.gradients()) {
    proto::GradientProto* gp = p.add_gradients();
    ref(v, gp->mutable_value());
    ref(grad, gp->mutable_gradient());
  }
  p.set_replicas(graph.replicas());
  p.set_num_nodes(graph.num_nodes());
  return p;
}

StatusOr<Graph> GraphFromProto(const proto::GraphProto& p) {
  if (p.format_version() > kFormatVersion)
    return InvalidArgument("graph format version ", p.format_version(), " is newer than this reader (", kFormatVersion,
                           ")");
  if (p.format_version() < 0) return InvalidArgument("invalid graph format version ", p.format_version());
  if (p.has_num_nodes() && p.num_nodes() != p.nodes_size())
    return DataLoss("the graph records ", p.num_nodes(), " nodes but holds ", p.nodes_size());

  Graph graph;
  graph.set_replicas(p.replicas());
  ValueTable table;
  for (int i = 0; i < p.nodes_size(); ++i) LOOM_RETURN_IF_ERROR(AddNodeFromProto(p.nodes(i), i, &graph, &table));

  for (const auto& [name, r] : p.outputs()) {
    auto v = table.Resolve(r);
    if (!v.ok()) return v.status().WithContext("graph output '" + name + "'");
    graph.outputs()[name] = *v;
  }
  for (int i = 0; i < p.state_updates_size(); ++i) {
    const proto::StateUpdateProto& u = p.state_updates(i);
    std::string where = "state update " + std::to_string(i) + " of " + RefToString(u.state());
    auto state = table.Resolve(u.state());
    if (!state.ok()) return state.status().WithContext(where + ": state");
    auto next = table.Resolve(u.new_value());
    if (!next.ok()) return next.status().WithContext(where + ": new value");
    graph.state_updates().push_back({*state, *next});
  }
  for (int i = 0; i < p.gradients_size(); ++i) {
    const proto::GradientProto& g = p.gradients(i);
    std::string where = "gradient entry " + std::to_string(i) + " of " + RefToString(g.value());
    auto value = table.Resolve(g.value());
    if (!value.ok()) return value.status().WithContext(where + ": value");
    auto grad = table.Resolve(g.gradient());
    if (!grad.ok()) return grad.status().WithContext(where + ": gradient");
    if (!graph.gradients().emplace(*value, *grad).second)
      return InvalidArgument(where, ": the value has more than one gradient entry");
  }
  LOOM_RETURN_IF_ERROR(VerifyGraph(graph));
  return graph;
}

StatusOr<std::string> GraphToText(const Graph& graph) {
  LOOM_ASSIGN_OR_RETURN(proto::GraphProto p, GraphToProto(graph));
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(p, &text)) return Internal("text formatting of a GraphProto failed");
  return text;
}

StatusOr<Graph> GraphFromText(const std::string& text, const std::string& source) {
  LOOM_ASSIGN_OR_RETURN(proto::GraphProto p, ParseText(text, source));
  auto graph = GraphFromProto(p);
  if (!graph.ok()) return graph.status().WithContext(source);
  return graph;
}

Status SaveGraph(const Graph& graph, const std::string& path) {
  auto p = GraphToProto(graph);
  if (!p.ok()) return p.status().WithContext("saving graph file '" + path + "'");
  std::string data;
  if (IsTextPath(path)) {
    data = StrCat("# loom graph: core/proto/graph.proto GraphProto, ", graph.num_nodes(), " nodes\n");
    std::string text;
    if (!google::protobuf::TextFormat::PrintToString(*p, &text))
      return Internal("text formatting of graph file '", path, "' failed");
    data += text;
  } else {
    // Deterministic (map order fixed), so the same graph gives the same bytes.
    google::protobuf::io::StringOutputStream stream(&data);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    bool ok = p->SerializeToCodedStream(&coded);
    coded.Trim();  // flush into `data` before it is written
    if (!ok || coded.HadError()) return Internal("binary serialization of graph file '", path, "' failed");
  }
  return WriteFileAtomically(path, data).WithContext("saving the graph");
}

StatusOr<Graph> LoadGraph(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(std::string data, ReadFile(path));
  proto::GraphProto p;
  if (IsTextPath(path)) {
    LOOM_ASSIGN_OR_RETURN(p, ParseText(data, path));
  } else {
    // An empty buffer parses as an empty graph; say what it really is.
    if (data.empty()) return DataLoss("graph file '", path, "' is empty");
    if (!p.ParseFromString(data))
      return DataLoss("graph file '", path, "' (", data.size(),
                      " bytes) is not a valid binary GraphProto: corrupt or truncated (text files must end in .pbtxt)");
    if (!p.has_num_nodes())
      return DataLoss("graph file '", path, "' (", data.size(),
                      " bytes) is truncated: its closing node count is missing (", p.nodes_size(), " nodes read)");
  }
  auto graph = GraphFromProto(p);
  if (!graph.ok()) return graph.status().WithContext("graph file '" + path + "'");
  return graph;
}

}  // namespace loom
