// The graph readers: text proto and binary proto. Any input is refused with
// a Status or gives a graph that the verifier accepts and that serializes
// back to text that reads again.
#include <string>

#include "core/proto/graph.pb.h"
#include "graph/serialize.h"
#include "graph/verifier.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using loom::fuzz::Require;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto check = [](const loom::Graph& g) {
    Require(loom::VerifyGraph(g).ok(), "a loaded graph fails the verifier");
    auto text = loom::GraphToText(g);
    Require(text.ok(), "a loaded graph does not print");
    Require(loom::GraphFromText(*text).ok(), "a loaded graph does not read back from its text");
  };
  if (auto g = loom::GraphFromText(bytes, "fuzz.pbtxt"); g.ok()) check(*g);
  loom::proto::GraphProto proto;
  if (proto.ParseFromString(bytes))
    if (auto g = loom::GraphFromProto(proto); g.ok()) check(*g);
  return 0;
}
