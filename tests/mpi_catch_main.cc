#define CATCH_CONFIG_RUNNER
#include "tests/mpi_catch_main.h"

#include <catch2/catch.hpp>

#include <cstdio>
#include <memory>

namespace loom::testing {
namespace {
std::unique_ptr<MpiCommunicator> world;
}  // namespace

MpiCommunicator& World() { return *world; }

}  // namespace loom::testing

int main(int argc, char** argv) {
  auto made = loom::MpiCommunicator::World();
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
    return 1;
  }
  loom::testing::world = std::move(*made);
  const int failed = Catch::Session().run(argc, argv);
  loom::testing::world.reset();
  loom::FinalizeMpi();
  return failed == 0 ? 0 : 1;
}
