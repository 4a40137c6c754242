// Graphs to and from protobuf (core/proto/graph.proto), as text (.pbtxt) or
// binary. Loading re-creates the graph node by node through Graph::AddNode
// and then runs the verifier, so a file cannot smuggle in a graph that
// in-memory construction would have refused.
#pragma once

#include <string>

#include "core/proto/graph.pb.h"
#include "core/status.h"
#include "graph/ir.h"

namespace loom {

// Fails if the graph does not verify (such a file could not be loaded).
// Inputs are written by value name where the name is unambiguous, by id
// otherwise.
StatusOr<proto::GraphProto> GraphToProto(const Graph& graph);

// Errors name the node (and op) or graph entry: unknown op, an input that no
// earlier node produces, an attribute without a value or of the wrong kind,
// stored types that differ from type inference. Nodes without stored output
// types (hand-written text) get the inferred ones.
//
// Attribute kinds are checked for the attributes whose kind is fixed across
// the catalogue (shape, dtype, init, value, mean, std, low, high,
// transpose_a, transpose_b); an op reading another attribute of the wrong
// kind still trips that op's internal check.
StatusOr<Graph> GraphFromProto(const proto::GraphProto& proto);

// Text-format convenience for tests and tools; `source` names the text in
// errors, which carry line:column.
StatusOr<std::string> GraphToText(const Graph& graph);
StatusOr<Graph> GraphFromText(const std::string& text, const std::string& source = "<text>");

// Text format when the path ends in ".pbtxt", binary otherwise. The file is
// written to a temporary sibling and renamed into place, so `path` holds
// either the old content or the complete new one. Errors name the file.
// A binary file must end with GraphProto.num_nodes (SaveGraph writes it), so
// that a file cut at a field boundary is reported rather than half-loaded.
Status SaveGraph(const Graph& graph, const std::string& path);
StatusOr<Graph> LoadGraph(const std::string& path);

}  // namespace loom
