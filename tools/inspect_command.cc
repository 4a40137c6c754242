// `loom inspect --model NAME [--set key=value ...] [--input C,H,W] [--classes N]
// [--batch B] [--params] [--export FILE]`: builds a zoo model's forward graph
// (models::BuildSupervised, as `loom train` builds it) and prints one row per
// layer: its name, op, output shape, the parameter elements it owns and its
// forward FLOPs (graph/cost.h). Then the totals: parameters (Parameter
// elements only), buffers (BatchNorm running statistics and the like) and
// forward FLOPs, also per sample. docs/inspect.md.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "graph/cost.h"
#include "graph/model.h"
#include "graph/serialize.h"
#include "models/zoo.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace loom::tools {
namespace {

constexpr const char* kUsage =
    "usage: loom inspect --model NAME [--set key=value ...] [--input C,H,W | T] [--classes N] [--batch B] "
    "[--params] [--export FILE]\n"
    "       loom inspect --config FILE --strategy FILE [--taskgraph [--json FILE]]\n";

// 235146 -> "235,146".
std::string Grouped(double x) {
  char s[64];
  std::snprintf(s, sizeof(s), "%.0f", x);
  std::string digits = s, out;
  const bool neg = !digits.empty() && digits[0] == '-';
  if (neg) digits = digits.substr(1);
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (neg ? "-" : "") + out;
}

// 1.2e9 -> "1.20 G".
std::string Human(double x) {
  char s[64];
  if (x >= 1e12) std::snprintf(s, sizeof(s), "%.2f T", x / 1e12);
  else if (x >= 1e9) std::snprintf(s, sizeof(s), "%.2f G", x / 1e9);
  else if (x >= 1e6) std::snprintf(s, sizeof(s), "%.2f M", x / 1e6);
  else if (x >= 1e3) std::snprintf(s, sizeof(s), "%.2f K", x / 1e3);
  else std::snprintf(s, sizeof(s), "%.0f", x);
  return s;
}

struct LayerRow {
  std::string name, op, shape;
  int64_t params = 0, buffers = 0;
  double flops = 0;
};

Status Inspect(const Flags& flags, const std::map<std::string, std::string>& model_args) {
  if (!flags.Has("model")) {
    std::string names;
    for (const models::ZooEntry& e : models::Zoo()) names += (names.empty() ? "" : ", ") + e.name;
    return InvalidArgument("loom inspect needs --model NAME (the zoo has: ", names, ")");
  }
  const std::string name = flags.Str("model", "");
  LOOM_ASSIGN_OR_RETURN(const models::ZooEntry* entry, models::FindModel(name));
  // Token models read T token ids per example; the others C,H,W (or C,N)
  // features. The defaults are the data of the model's reference count.
  const bool tokens = entry->input == models::InputKind::kTokens;
  const bool gan = static_cast<bool>(entry->gan);
  LOOM_ASSIGN_OR_RETURN(std::vector<int64_t> input_dims, flags.PositiveInts("input", entry->reference.input.dims()));
  const Shape input(input_dims);
  if (gan && flags.Has("classes")) return InvalidArgument("--classes: model ", name, " is a GAN, it has no classes");
  LOOM_ASSIGN_OR_RETURN(int64_t classes, flags.Int("classes", entry->reference.num_classes));
  // Batch 2: training-mode BatchNorm after a global pool (PointNet's) needs
  // more than one value per channel.
  LOOM_ASSIGN_OR_RETURN(int64_t batch, flags.Int("batch", 2));
  if (!gan && classes < 1) return InvalidArgument("--classes must be >= 1, got ", classes);
  if (batch < 1) return InvalidArgument("--batch must be >= 1, got ", batch);

  Model m;
  if (gan) {  // both networks: the discriminator step runs G and D
    LOOM_RETURN_IF_ERROR(models::BuildGanStep(m, name, model_args, input, batch, models::GanStep::kDiscriminator));
  } else {
    LOOM_RETURN_IF_ERROR(
        models::BuildSupervised(m, name, model_args, models::ExpectedData(*entry, input, classes), batch));
  }
  const Graph& g = m.graph();

  // One row per non-source node; each Parameter or Buffer belongs to the
  // first node that reads it (the layer whose weight it is).
  std::vector<LayerRow> rows;
  std::map<NodeId, size_t> row_of;
  int64_t total_params = 0, total_buffers = 0;
  double total_flops = 0;
  for (const Node& n : g.nodes()) {
    if (n.op == kInputOp || n.op == kParameterOp || n.op == kBufferOp) continue;
    LayerRow r;
    r.name = n.name;
    r.op = n.op;
    r.shape = n.outputs.empty() ? "-" : g.type(n.outputs[0]).shape.ToString();
    r.flops = NodeCost(g, n).flops;
    total_flops += r.flops;
    row_of[n.id] = rows.size();
    rows.push_back(r);
  }
  const std::map<ValueId, std::vector<NodeId>> consumers = g.Consumers();
  std::vector<std::string> unowned;
  for (const Node& n : g.nodes()) {
    const bool is_param = n.op == kParameterOp, is_buffer = n.op == kBufferOp;
    if (!is_param && !is_buffer) continue;
    const int64_t elements = g.type(n.outputs[0]).shape.numel();
    (is_param ? total_params : total_buffers) += elements;
    auto it = consumers.find(n.outputs[0]);
    NodeId owner = -1;
    if (it != consumers.end())
      for (NodeId c : it->second)
        if (row_of.count(c) && (owner < 0 || c < owner)) owner = c;
    if (owner < 0) {
      unowned.push_back(n.name);
      continue;
    }
    (is_param ? rows[row_of[owner]].params : rows[row_of[owner]].buffers) += elements;
  }

  if (flags.Bool("params")) {
    std::printf("params: %lld\n", static_cast<long long>(total_params));
  } else {
    std::string shape_text = "[" + std::to_string(batch);
    for (int64_t d : input.dims()) shape_text += ", " + std::to_string(d);
    shape_text += "]";
    std::string what = StrCat(classes, " classes");
    if (gan) what = "a GAN (the discriminator step: generator and discriminator)";
    if (tokens && entry->prediction == models::Prediction::kPerPosition)
      what = StrCat(classes, " tokens in the vocabulary");
    std::printf("model %s: input %s%s, %s\n\n", name.c_str(), shape_text.c_str(), tokens ? " token ids" : "",
                what.c_str());
    size_t wn = 5, wo = 2, ws = 12, wp = 10, wf = 13;
    std::vector<std::string> pcol, fcol;
    for (const LayerRow& r : rows) {
      std::string p = r.params ? Grouped(static_cast<double>(r.params)) : "-";
      if (r.buffers) p += " (+" + Grouped(static_cast<double>(r.buffers)) + " buf)";
      pcol.push_back(p);
      fcol.push_back(Grouped(r.flops));
      wn = std::max(wn, r.name.size());
      wo = std::max(wo, r.op.size());
      ws = std::max(ws, r.shape.size());
      wp = std::max(wp, pcol.back().size());
      wf = std::max(wf, fcol.back().size());
    }
    std::printf("%-*s  %-*s  %-*s  %*s  %*s\n", static_cast<int>(wn), "layer", static_cast<int>(wo), "op",
                static_cast<int>(ws), "output shape", static_cast<int>(wp), "parameters", static_cast<int>(wf),
                "forward FLOPs");
    for (size_t i = 0; i < rows.size(); ++i)
      std::printf("%-*s  %-*s  %-*s  %*s  %*s\n", static_cast<int>(wn), rows[i].name.c_str(), static_cast<int>(wo),
                  rows[i].op.c_str(), static_cast<int>(ws), rows[i].shape.c_str(), static_cast<int>(wp),
                  pcol[i].c_str(), static_cast<int>(wf), fcol[i].c_str());
    for (const std::string& u : unowned) std::printf("(unused source: %s)\n", u.c_str());
    std::printf("\nparams: %lld\n", static_cast<long long>(total_params));
    std::printf("buffers: %lld\n", static_cast<long long>(total_buffers));
    std::printf("forward FLOPs: %.0f (%s; per sample: %.0f, %s)\n", total_flops, Human(total_flops).c_str(),
                total_flops / static_cast<double>(batch), Human(total_flops / static_cast<double>(batch)).c_str());
  }

  if (flags.Has("export")) {
    const std::string path = flags.Str("export", "");
    if (path.empty()) return InvalidArgument("--export needs a file name");
    LOOM_RETURN_IF_ERROR(SaveGraph(g, path));
    const bool text = path.size() >= 6 && path.compare(path.size() - 6, 6, ".pbtxt") == 0;
    std::fprintf(flags.Bool("params") ? stderr : stdout, "wrote the forward graph (%d nodes, %s) to %s\n",
                 g.num_nodes(), text ? "text protobuf" : "binary protobuf", path.c_str());
  }
  return Status::Ok();
}

}  // namespace

Status InspectCommand(const std::vector<std::string>& args) {
  // --set may repeat, which Flags does not keep: take those out first.
  std::map<std::string, std::string> model_args;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string kv;
    if (args[i] == "--set") {
      if (i + 1 >= args.size()) return InvalidArgument("flag --set needs a value key=value");
      kv = args[++i];
    } else if (args[i].rfind("--set=", 0) == 0) {
      kv = args[i].substr(6);
    } else {
      rest.push_back(args[i]);
      continue;
    }
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      return InvalidArgument("--set '", kv, "': expected key=value (e.g. --set hidden=64,32)");
    model_args[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  Flags flags({{"model", "the zoo model to build"},
               {"config", "with --strategy: the training config whose model the strategy splits"},
               {"strategy", "show this strategy file's split of every layer of --config's model (docs/parallel.md)"},
               {"taskgraph?", "with --strategy: also the training step's task graph, task by task"},
               {"json", "with --taskgraph: write the task graph to this file as JSON"},
               {"set", "a model argument key=value (repeatable), e.g. --set hidden=64,32"},
               {"input", "the example shape, comma-separated (default: the model's reference input, e.g. "
                         "3,224,224 for alexnet, 1,28,28 for mlp)"},
               {"classes", "the number of classes (default: the model's reference, e.g. 1000 for alexnet, 10 for mlp)"},
               {"batch", "the batch size the graph is built for (default 2)"},
               {"params?", "print only the line 'params: N'"},
               {"export", "write the forward graph to this file: text protobuf if it ends in .pbtxt, binary otherwise"}});
  LOOM_RETURN_IF_ERROR(flags.Parse(rest));
  if (flags.help_requested()) {
    const std::string help = flags.Help();
    std::printf("%s%s%s", kUsage, help.c_str(), !help.empty() && help.back() == '\n' ? "" : "\n");
    return Status::Ok();
  }
  if (flags.Has("strategy")) {
    if (!flags.Has("config")) return InvalidArgument("loom inspect --strategy FILE needs --config FILE (the model)");
    if (flags.Has("json") && !flags.Bool("taskgraph")) return InvalidArgument("--json FILE goes with --taskgraph");
    return InspectStrategy(flags.Str("config", ""), flags.Str("strategy", ""), flags.Bool("taskgraph"),
                           flags.Str("json", ""));
  }
  if (flags.Has("config")) return InvalidArgument("loom inspect --config FILE goes with --strategy FILE");
  return Inspect(flags, model_args);
}

}  // namespace loom::tools
