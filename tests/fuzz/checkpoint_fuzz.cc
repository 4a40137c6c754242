// The checkpoint reader: any file is refused with a Status (wrong magic,
// truncation, checksums, inconsistent header) or loads into a checkpoint
// that saves and loads back with the same tensors.
#include <cstring>

#include "train/checkpoint/checkpoint.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using loom::fuzz::Require;
  auto loaded = loom::LoadCheckpoint(loom::fuzz::AsFile(data, size));
  if (!loaded.ok()) return 0;
  const std::string copy = loom::fuzz::InputPath() + ".copy";
  Require(loom::SaveCheckpoint(copy, *loaded).ok(), "a loaded checkpoint does not save");
  auto again = loom::LoadCheckpoint(copy);
  Require(again.ok(), "a saved checkpoint does not load");
  Require(again->tensors.size() == loaded->tensors.size(), "the tensors changed in a save and load");
  for (const auto& [name, t] : loaded->tensors) {
    const loom::Tensor& u = again->tensors.at(name);
    Require(t.shape() == u.shape() && t.dtype() == u.dtype() && std::memcmp(t.raw_data(), u.raw_data(), t.nbytes()) == 0,
            "a tensor's bytes changed in a save and load");
  }
  return 0;
}
