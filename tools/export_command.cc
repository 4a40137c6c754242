// `loom export --checkpoint FILE --replica R --out FILE`: one replica of a
// fused run's checkpoint as an ordinary single-model checkpoint. The layout
// of fused checkpoints and what the export holds:
// train/checkpoint/replica_export.h (ExportReplica, which loom::Predictor
// shares); docs/fusion_tools.md.
#include <cstdio>
#include <filesystem>

#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/replica_export.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace loom::tools {
namespace {

Status Export(const Flags& flags) {
  if (!flags.Has("checkpoint")) return InvalidArgument("loom export needs --checkpoint FILE (a fused run's checkpoint)");
  if (!flags.Has("replica")) return InvalidArgument("loom export needs --replica R (0-based, in config order)");
  if (!flags.Has("out")) return InvalidArgument("loom export needs --out FILE");
  const std::string path = flags.Str("checkpoint", ""), out_path = flags.Str("out", "");
  LOOM_ASSIGN_OR_RETURN(int64_t replica, flags.Int("replica", 0));
  std::error_code ec;
  if (std::filesystem::exists(out_path, ec)) {
    if (std::filesystem::equivalent(out_path, path, ec))
      return InvalidArgument("--out ", out_path, " is the --checkpoint being exported; choose another file");
    if (!StartsLikeCheckpoint(out_path))
      return FailedPrecondition(out_path, " exists and is not a loom checkpoint: not overwriting it (remove it or ",
                                "choose another --out)");
  }

  LOOM_ASSIGN_OR_RETURN(Checkpoint in, LoadCheckpoint(path));
  LOOM_ASSIGN_OR_RETURN(ReplicaExport exported, ExportReplica(in, replica, "--replica"));
  const Checkpoint& out = exported.checkpoint;
  LOOM_RETURN_IF_ERROR(SaveCheckpoint(out_path, out));

  size_t bytes = 0;
  for (const auto& [name, t] : out.tensors) bytes += t.nbytes();
  std::printf("wrote %s: replica %lld (%s), %s, %zu tensors (%.2f MiB), step %lld\n", out_path.c_str(),
              static_cast<long long>(replica), exported.label.c_str(),
              exported.row >= 0 ? StrCat("running, row ", exported.row, " of ", exported.running).c_str()
                                : exported.status.c_str(),
              out.tensors.size(), bytes / 1048576.0, static_cast<long long>(out.position.global_step));
  return Status::Ok();
}

}  // namespace

Status ExportCommand(const std::vector<std::string>& args) {
  Flags flags({{"checkpoint", "a fused run's checkpoint (runs/<run>/ckpt-<step>.loom)"},
               {"replica", "which replica, 0-based in config order (loom export lists them on a bad value)"},
               {"out", "the single-model checkpoint to write"}});
  LOOM_RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::printf("usage: loom export --checkpoint FILE --replica R --out FILE\n%s", flags.Help().c_str());
    return Status::Ok();
  }
  return Export(flags);
}

}  // namespace loom::tools
