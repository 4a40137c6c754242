// `loom checkpoint FILE`: what a checkpoint holds: the training position and,
// per tensor, its dtype, shape and CRC32C of its bytes (two checkpoints with
// equal listings hold bit-identical tensors).
#include <cinttypes>
#include <cstdio>

#include "train/checkpoint/checkpoint.h"
#include "core/crc32c.h"
#include "tools/commands.h"

namespace loom::tools {

Status CheckpointCommand(const std::vector<std::string>& args) {
  if (args.size() != 1 || args[0].rfind("--", 0) == 0) return InvalidArgument("usage: loom checkpoint FILE");
  LOOM_ASSIGN_OR_RETURN(Checkpoint c, LoadCheckpoint(args[0]));
  std::printf("global_step %lld\nepoch %lld\nbatch_in_epoch %lld\nexecutor_step %lld\n",
              static_cast<long long>(c.position.global_step), static_cast<long long>(c.position.epoch),
              static_cast<long long>(c.position.batch_in_epoch), static_cast<long long>(c.position.executor_step));
  for (const auto& [name, t] : c.tensors)
    std::printf("tensor %s %s %s crc32c=%08" PRIx32 "\n", name.c_str(), DTypeName(t.dtype()), t.shape().ToString().c_str(),
                Crc32c(t.raw_data(), t.nbytes()));
  return Status::Ok();
}

}  // namespace loom::tools
