// The standard strategies (docs/parallel.md), the baselines a search must
// beat (issue 15) and what `loom strategy --kind` writes:
//   dp       data parallel: every layer split along sample over all devices
//            (where it can be; the rest whole on device 0)
//   replica  a fused array's replicas over the devices (no gradient exchange)
//   model    layers over devices: contiguous runs of about equal forward FLOPs
//   owt      Krizhevsky's "one weird trick": data parallel, but fully
//            connected layers (Linear) split along parameter
#pragma once

#include <string>

#include "core/proto/strategy.pb.h"
#include "core/status.h"
#include "graph/ir.h"
#include "graph/strategy.h"

namespace loom {

enum class StandardStrategy { kDataParallel, kReplicaParallel, kModelParallel, kOneWeirdTrick };

// "dp", "replica", "model" or "owt"; an error lists them.
StatusOr<StandardStrategy> ParseStandardStrategy(const std::string& kind);

// The strategy of `kind` for the forward graph `graph` (fused for replica)
// on `devices` devices, checked against the graph (graph/strategy.h).
StatusOr<proto::Strategy> MakeStandardStrategy(const Graph& graph, StandardStrategy kind, int64_t devices);

// `name`: a standard kind (made for `forward` on `devices` devices) or a
// strategy file (which must place parts on `devices` devices); errors name
// `what` ("field strategy", "--strategy") and the file.
StatusOr<Strategy> LoadOrMakeStrategy(const std::string& name, const Graph& forward, int64_t devices,
                                      const std::string& what);

}  // namespace loom
