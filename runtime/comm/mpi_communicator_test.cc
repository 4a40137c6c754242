// The MPI communicator, run as several processes (tests/mpirun.sh NP):
// every rank runs every case; each collective's result is checked against
// what the ranks' known inputs give.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <vector>

#include "runtime/comm/mpi_communicator.h"

namespace loom {
namespace {

MpiCommunicator* world = nullptr;  // made in main

// Rank r's values: r * 100 + i (+ 0.5 for floats).
Tensor RankValues(const Shape& shape, DType dtype, int r) {
  Tensor t = Tensor::Zeros(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = r * 100.0 + static_cast<double>(i) + (IsFloating(dtype) ? 0.5 : 0.0);
    if (dtype == DType::kF32) t.data<float>()[i] = static_cast<float>(v);
    if (dtype == DType::kF64) t.data<double>()[i] = v;
    if (dtype == DType::kI32) t.data<int32_t>()[i] = static_cast<int32_t>(v);
    if (dtype == DType::kI64) t.data<int64_t>()[i] = static_cast<int64_t>(v);
  }
  return t;
}

TEST_CASE("MPI: the world has every process of the job") {
  REQUIRE(world->size() >= 2);
  CHECK(world->rank() >= 0);
  CHECK(world->rank() < world->size());
  CHECK(world->device() == Device::Cpu());
}

TEST_CASE("MPI: AllReduce sums, averages and takes the max over ranks") {
  const int n = world->size();
  for (DType dtype : {DType::kF32, DType::kF64, DType::kI32, DType::kI64}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
      if (op == ReduceOp::kMean && IsInteger(dtype)) continue;
      INFO(DTypeName(dtype) << " " << ReduceOpName(op));
      Tensor t = RankValues({3, 5}, dtype, world->rank());
      REQUIRE(world->AllReduce(t, op).ok());
      for (int64_t i = 0; i < t.numel(); ++i) {
        double want = 0;
        for (int r = 0; r < n; ++r) want += RankValues({3, 5}, dtype, r).ScalarAt(i);
        if (op == ReduceOp::kMean) want /= n;
        if (op == ReduceOp::kMax) want = RankValues({3, 5}, dtype, n - 1).ScalarAt(i);
        CHECK(t.ScalarAt(i) == Approx(want).epsilon(1e-6));
      }
    }
  }
  Tensor ints = RankValues({2}, DType::kI64, world->rank());
  const Status mean = world->AllReduce(ints, ReduceOp::kMean);
  CHECK_THAT(mean.message(), Catch::Contains("rank " + std::to_string(world->rank())) && Catch::Contains("mean"));
}

TEST_CASE("MPI: ReduceScatter, AllGather and Broadcast") {
  const int n = world->size(), me = world->rank();
  Tensor in = RankValues({2 * n, 3}, DType::kF64, me), out = Tensor::Zeros({2, 3}, DType::kF64);
  REQUIRE(world->ReduceScatter(in, out, ReduceOp::kSum).ok());
  for (int64_t i = 0; i < out.numel(); ++i) {
    double want = 0;
    for (int r = 0; r < n; ++r) want += RankValues({2 * n, 3}, DType::kF64, r).ScalarAt(me * 6 + i);
    CHECK(out.ScalarAt(i) == want);
  }
  Tensor mine = RankValues({2, 2}, DType::kI32, me), all = Tensor::Zeros({2 * n, 2}, DType::kI32);
  REQUIRE(world->AllGather(mine, all).ok());
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < 4; ++i) CHECK(all.ScalarAt(r * 4 + i) == RankValues({2, 2}, DType::kI32, r).ScalarAt(i));
  for (int root = 0; root < n; ++root) {
    Tensor t = RankValues({7}, DType::kF32, me);
    REQUIRE(world->Broadcast(t, root).ok());
    CHECK(t.ToDoubleVector() == RankValues({7}, DType::kF32, root).ToDoubleVector());
  }
  Tensor odd = Tensor::Zeros({2 * n + 1, 3}, DType::kF64);
  CHECK_THAT(world->ReduceScatter(odd, out, ReduceOp::kSum).message(), Catch::Contains("equal parts"));
}

TEST_CASE("MPI: Send and Recv around a ring, in order per pair; SendRecv") {
  const int n = world->size(), me = world->rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  // Two messages each way: the first Send meets the first Recv.
  for (int k = 0; k < 2; ++k) {
    Tensor t = RankValues({4}, DType::kF64, me * 10 + k), got = Tensor::Zeros({4}, DType::kF64);
    if (me % 2 == 0) {
      REQUIRE(world->Send(t, next).ok());
      REQUIRE(world->Recv(got, prev).ok());
    } else {
      REQUIRE(world->Recv(got, prev).ok());
      REQUIRE(world->Send(t, next).ok());
    }
    CHECK(got.ToDoubleVector() == RankValues({4}, DType::kF64, prev * 10 + k).ToDoubleVector());
  }
  Tensor send = RankValues({3}, DType::kI64, me), recv = Tensor::Zeros({3}, DType::kI64);
  REQUIRE(world->SendRecv(send, next, recv, prev).ok());
  CHECK(recv.ToDoubleVector() == RankValues({3}, DType::kI64, prev).ToDoubleVector());
  CHECK_THAT(world->Send(send, me).message(), Catch::Contains("is this rank"));
}

TEST_CASE("MPI: a Recv whose tensor is not the message's size fails naming both") {
  const int n = world->size(), me = world->rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  Tensor send = Tensor::Zeros({5}, DType::kF32), recv = Tensor::Zeros({4}, DType::kF32);
  const Status s = world->SendRecv(send, next, recv, prev);
  CHECK_THAT(s.message(), Catch::Contains("20 bytes") && Catch::Contains("[4] f32"));
  // The message was taken: the pair's next one still arrives in order.
  Tensor again = Tensor::Zeros({5}, DType::kF32);
  CHECK(world->SendRecv(send, next, again, prev).ok());
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  auto communicator = loom::MpiCommunicator::World();
  if (!communicator.ok()) {
    std::fprintf(stderr, "%s\n", communicator.status().ToString().c_str());
    return 1;
  }
  loom::world = communicator->get();
  const int failed = Catch::Session().run(argc, argv);
  communicator->reset();
  loom::FinalizeMpi();
  return failed == 0 ? 0 : 1;
}
