// Horizontal fusion (HFTA): turns the forward graph of one model into the
// forward graph of R replicas of it, trained together as one array.
//
// Every value of the fused graph either is shared by all replicas (the data
// batch, constants, anything computed from them alone) or carries a replica
// axis of extent R at some position, which the fused graph records
// (Graph::replicas(), Value::replica_layout, graph/ir.h). Parameters and
// buffers are [R, ...] (replica r's tensor is the contiguous chunk r);
// activations keep the replica axis where the op that made them puts it, so
// that each op maps onto one existing kernel:
//   Linear on shared x      a batched GEMM reading x [rows, in] in place for
//                           every replica, into [R, rows, out]
//   Linear on replicated x  a batched GEMM over [R, rows, in]
//   Conv                    a grouped convolution with R times the groups
//                           over [N, R*C, H, W] (one plain conv on shared x)
//   BatchNorm               BatchNorm over R*C channels
//   pooling, attention      over R*C planes / R*H heads
//   element-wise ops        broadcast with the replica axis aligned
//   Dropout                 one mask per replica, from that replica's seed
// Each op's fused form is its own rule, OpDef::Fuse, beside the op in ops/
// (ops/fusion_builder.h is what a rule sees); the pass handles sources,
// active Dropout, nodes whose inputs are all shared (kept as they are) and
// unfused_layers. Ops without a fused form (NLL, MSE, ...: FusionKind
// kPerReplica) and the layers named in `unfused_layers` run once per
// replica on slices of the fused inputs, their results stacked again
// ([R, ...]). Either way replica r computes exactly what the single model
// computes with replica r's parameters and seed.
//
// The fused graph keeps the model's node names (state names match a single
// model's checkpoint; RNG streams are keyed by name), its inputs (shared,
// fed exactly as the single model's, unless listed in per_replica_inputs:
// those are fed [R, ...]) and its outputs, each made [R, ...]: output
// "loss" becomes the R replicas' own losses.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "graph/ir.h"

namespace loom {

struct FusionOptions {
  int replicas = 1;
  // One per replica: its parameters are initialised and its dropout masks
  // drawn as a single model's would be with this seed.
  std::vector<uint64_t> seeds;
  // Node-name prefixes ("fc2" matches "fc2" and "fc2/..."): these nodes run
  // once per replica instead of fused, to measure what each fusion gains.
  std::vector<std::string> unfused_layers;
  // Inputs with their own data per replica, fed as [R, ...].
  std::set<std::string> per_replica_inputs;
};

// Attributes the pass sets on fused sources and random ops.
inline constexpr const char* kReplicaSeedsAttr = "replica_seeds";  // int list, one per replica
inline constexpr const char* kReplicaAxisAttr = "replica_axis";    // Dropout: where the replica axis is

// `model` is a forward graph (no gradients yet, not fused). Errors name the
// node.
StatusOr<Graph> FuseReplicas(const Graph& model, const FusionOptions& options);

// Whether a node name falls under one of the prefixes (an exact match or a
// match followed by '/').
bool MatchesLayer(const std::string& node_name, const std::vector<std::string>& prefixes);

}  // namespace loom
