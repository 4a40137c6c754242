#include "train/run_parts.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "train/data/test_files.h"

namespace loom::train {
namespace {

using Catch::Matchers::Contains;
using testing::ErrorOf;
using testing::IdxFile;
using testing::TempPath;
using testing::WriteFile;

// An MNIST folder whose training images are 28x28 and whose test images
// are `test_side` square.
std::string MnistDir(const std::string& name, uint32_t test_side) {
  const std::string dir = TempPath(name);
  std::filesystem::create_directories(dir);
  WriteFile(dir + "/train-images-idx3-ubyte.gz", IdxFile(0x803, {2, 28, 28}, std::vector<uint8_t>(2 * 28 * 28)),
            /*gzip=*/true);
  WriteFile(dir + "/train-labels-idx1-ubyte.gz", IdxFile(0x801, {2}, {3, 4}), /*gzip=*/true);
  WriteFile(dir + "/t10k-images-idx3-ubyte", IdxFile(0x803, {1, test_side, test_side},
                                                     std::vector<uint8_t>(test_side * test_side)));
  WriteFile(dir + "/t10k-labels-idx1-ubyte", IdxFile(0x801, {1}, {5}));
  return dir;
}

proto::DataConfig Mnist(const std::string& dir) {
  proto::DataConfig d;
  d.set_dataset("mnist");
  d.set_path(dir);
  return d;
}

TEST_CASE("LoadDatasets: train and test images of different shapes are an error naming both files") {
  const std::string dir = MnistDir("mnist_shapes", 32);
  CHECK_THAT(ErrorOf(LoadDatasets(Mnist(dir))),
             Contains("data: train inputs are [1, 28, 28] f32 (" + dir +
                      "/train-images-idx3-ubyte.gz) but test inputs are [1, 32, 32] f32 (" + dir +
                      "/t10k-images-idx3-ubyte)"));
  std::filesystem::remove_all(dir);

  const std::string same = MnistDir("mnist_same", 28);
  auto data = LoadDatasets(Mnist(same));
  REQUIRE(data.status().ToString() == "OK");
  CHECK(data->train->size() == 2);
  CHECK(data->test->input_spec() == data->train->input_spec());
  std::filesystem::remove_all(same);
}

}  // namespace
}  // namespace loom::train
