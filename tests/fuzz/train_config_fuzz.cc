// The train config reader (text proto plus our validation): any text is
// either refused with a Status or gives a config that prints and reads back
// to the same config.
#include <string>

#include "train/config/train_config.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = loom::ParseTrainConfig(text, "fuzz.pbtxt");
  if (!config.ok()) return 0;
  const std::string printed = loom::TrainConfigToText(*config);
  auto again = loom::ParseTrainConfig(printed, "printed.pbtxt");
  loom::fuzz::Require(again.ok(), "a config that was accepted does not read back after printing");
  loom::fuzz::Require(loom::TrainConfigToText(*again) == printed, "printing is not stable");
  return 0;
}
