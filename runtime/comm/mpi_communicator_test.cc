// The MPI communicator, run as several processes (tests/mpirun.sh NP):
// every rank runs every case; each collective's result is checked against
// what the ranks' known inputs give.
#include <catch2/catch.hpp>

#include <cstring>

#include <vector>

#include "runtime/comm/mpi_communicator.h"
#include "tests/mpi_catch_main.h"

namespace loom {
namespace {

using testing::World;

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
  REQUIRE(World().size() >= 2);
  CHECK(World().rank() >= 0);
  CHECK(World().rank() < World().size());
  CHECK(World().device() == Device::Cpu());
}

TEST_CASE("MPI: AllReduce sums, averages and takes the max over ranks") {
  const int n = World().size();
  for (DType dtype : {DType::kF32, DType::kF64, DType::kI32, DType::kI64}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
      if (op == ReduceOp::kMean && IsInteger(dtype)) continue;
      INFO(DTypeName(dtype) << " " << ReduceOpName(op));
      Tensor t = RankValues({3, 5}, dtype, World().rank());
      REQUIRE(World().AllReduce(t, op).ok());
      for (int64_t i = 0; i < t.numel(); ++i) {
        double want = 0;
        for (int r = 0; r < n; ++r) want += RankValues({3, 5}, dtype, r).ScalarAt(i);
        if (op == ReduceOp::kMean) want /= n;
        if (op == ReduceOp::kMax) want = RankValues({3, 5}, dtype, n - 1).ScalarAt(i);
        CHECK(t.ScalarAt(i) == Approx(want).epsilon(1e-6));
      }
    }
  }
  Tensor ints = RankValues({2}, DType::kI64, World().rank());
  const Status mean = World().AllReduce(ints, ReduceOp::kMean);
  CHECK_THAT(mean.message(), Catch::Contains("rank " + std::to_string(World().rank())) && Catch::Contains("mean"));
}

TEST_CASE("MPI: ReduceScatter, AllGather and Broadcast") {
  const int n = World().size(), me = World().rank();
  Tensor in = RankValues({2 * n, 3}, DType::kF64, me), out = Tensor::Zeros({2, 3}, DType::kF64);
  REQUIRE(World().ReduceScatter(in, out, ReduceOp::kSum).ok());
  for (int64_t i = 0; i < out.numel(); ++i) {
    double want = 0;
    for (int r = 0; r < n; ++r) want += RankValues({2 * n, 3}, DType::kF64, r).ScalarAt(me * 6 + i);
    CHECK(out.ScalarAt(i) == want);
  }
  Tensor mine = RankValues({2, 2}, DType::kI32, me), all = Tensor::Zeros({2 * n, 2}, DType::kI32);
  REQUIRE(World().AllGather(mine, all).ok());
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < 4; ++i) CHECK(all.ScalarAt(r * 4 + i) == RankValues({2, 2}, DType::kI32, r).ScalarAt(i));
  for (int root = 0; root < n; ++root) {
    Tensor t = RankValues({7}, DType::kF32, me);
    REQUIRE(World().Broadcast(t, root).ok());
    CHECK(t.ToDoubleVector() == RankValues({7}, DType::kF32, root).ToDoubleVector());
  }
  Tensor odd = Tensor::Zeros({2 * n + 1, 3}, DType::kF64);
  CHECK_THAT(World().ReduceScatter(odd, out, ReduceOp::kSum).message(), Catch::Contains("equal parts"));
}

TEST_CASE("MPI: Send and Recv around a ring, in order per pair; SendRecv") {
  const int n = World().size(), me = World().rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  // Two messages each way: the first Send meets the first Recv.
  for (int k = 0; k < 2; ++k) {
    Tensor t = RankValues({4}, DType::kF64, me * 10 + k), got = Tensor::Zeros({4}, DType::kF64);
    if (me % 2 == 0) {
      REQUIRE(World().Send(t, next).ok());
      REQUIRE(World().Recv(got, prev).ok());
    } else {
      REQUIRE(World().Recv(got, prev).ok());
      REQUIRE(World().Send(t, next).ok());
    }
    CHECK(got.ToDoubleVector() == RankValues({4}, DType::kF64, prev * 10 + k).ToDoubleVector());
  }
  Tensor send = RankValues({3}, DType::kI64, me), recv = Tensor::Zeros({3}, DType::kI64);
  REQUIRE(World().SendRecv(send, next, recv, prev).ok());
  CHECK(recv.ToDoubleVector() == RankValues({3}, DType::kI64, prev).ToDoubleVector());
  CHECK_THAT(World().Send(send, me).message(), Catch::Contains("is this rank"));
}

// bf16, f16 and bool tensors move bit for bit (Send/Recv, Broadcast,
// AllGather); their reductions are refused by name.
TEST_CASE("MPI: 16-bit floats and bools move as bits and do not reduce") {
  const int n = World().size(), me = World().rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  auto bits = [](DType d, int rank) {
    Tensor t = Tensor::Zeros({5}, d);
    auto* raw = static_cast<unsigned char*>(t.raw_data());
    for (size_t i = 0; i < t.nbytes(); ++i) raw[i] = static_cast<unsigned char>(rank * 31 + i * 7 + 1);
    if (d == DType::kBool)
      for (size_t i = 0; i < t.nbytes(); ++i) raw[i] &= 1;
    return t;
  };
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
  };
  for (DType d : {DType::kBF16, DType::kF16, DType::kBool}) {
    INFO(DTypeName(d));
    Tensor got = Tensor::Zeros({5}, d);
    if (me % 2 == 0) {
      REQUIRE(World().Send(bits(d, me), next).ok());
      REQUIRE(World().Recv(got, prev).ok());
    } else {
      REQUIRE(World().Recv(got, prev).ok());
      REQUIRE(World().Send(bits(d, me), next).ok());
    }
    CHECK(same(got, bits(d, prev)));
    Tensor b = bits(d, me);
    REQUIRE(World().Broadcast(b, 0).ok());
    CHECK(same(b, bits(d, 0)));
    Tensor all = Tensor::Zeros({5 * n}, d);
    REQUIRE(World().AllGather(bits(d, me), all).ok());
    for (int r = 0; r < n; ++r)
      CHECK(std::memcmp(static_cast<const char*>(all.raw_data()) + r * b.nbytes(), bits(d, r).raw_data(),
                        b.nbytes()) == 0);
    Tensor sum = bits(d, me);
    CHECK_THAT(World().AllReduce(sum, ReduceOp::kSum).message(),
               Catch::Contains("reductions take f32, f64, i32 and i64, got " + std::string(DTypeName(d))));
  }
}

TEST_CASE("MPI: a Recv whose tensor is not the message's size fails naming both") {
  const int n = World().size(), me = World().rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  Tensor send = Tensor::Zeros({5}, DType::kF32), recv = Tensor::Zeros({4}, DType::kF32);
  const Status s = World().SendRecv(send, next, recv, prev);
  CHECK_THAT(s.message(), Catch::Contains("20 bytes") && Catch::Contains("[4] f32"));
  // The message was taken: the pair's next one still arrives in order.
  Tensor again = Tensor::Zeros({5}, DType::kF32);
  CHECK(World().SendRecv(send, next, again, prev).ok());
}

}  // namespace
}  // namespace loom
