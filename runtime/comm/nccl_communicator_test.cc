// The NCCL communicator. Without a GPU: the checks that need none, then
// "no GPU: NCCL tests skipped" (LOOM_REQUIRE_CUDA=1 makes that a failure).
// With one GPU: every collective with one rank (identities and copies)
// against the local communicator. With two: two ranks, one thread each.
#include "runtime/comm/nccl_communicator.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <functional>
#include <random>
#include <thread>
#include <type_traits>

#include "core/cuda/cuda_device.h"
#include "core/logging.h"
#include "runtime/comm/nccl_bootstrap.h"
#include "runtime/comm/local_communicator.h"

namespace loom {
namespace {

bool CudaRequired() {
  const char* v = std::getenv("LOOM_REQUIRE_CUDA");
  return v != nullptr && std::string(v) == "1";
}

// Whether at least `count` GPUs can run the test; says once why not.
bool HaveGpus(int count) {
  static const bool any = [] {
    if (cuda::DeviceCount() > 0 && cuda::ProbeDevice(0).ok()) return true;
    LOOM_LOG_WARN("no GPU: NCCL tests skipped ({})", cuda::ProbeDevice(0).message());
    return false;
  }();
  if (!any && CudaRequired()) FAIL("LOOM_REQUIRE_CUDA=1 but cuda:0 is unusable: " << cuda::ProbeDevice(0).ToString());
  if (!any) return false;
  for (int i = 0; i < count; ++i)
    if (i >= cuda::DeviceCount() || !cuda::ProbeDevice(i).ok()) {
      LOOM_LOG_WARN("{} GPU(s): the {}-rank NCCL tests skipped", cuda::DeviceCount(), count);
      return false;
    }
  return true;
}

template <typename T>
Tensor Input(const Shape& shape, int rank) {
  std::mt19937 gen(17 + rank);
  std::uniform_int_distribution<int> dist(-50, 50);
  std::vector<T> v(shape.numel());
  for (T& x : v) x = static_cast<T>(dist(gen)) / static_cast<T>(std::is_integral_v<T> ? 1 : 8);
  return Tensor::FromVector<T>(shape, v);
}

Tensor OnDevice(const Tensor& host, Device device) {
  StatusOr<Tensor> t = host.To(device);
  LOOM_CHECK_OK(t.status());
  return *t;
}

Tensor OnHost(Communicator& comm, const Tensor& t) {
  LOOM_CHECK_OK(comm.Synchronize());
  StatusOr<Tensor> host = t.To(Device::Cpu());
  LOOM_CHECK_OK(host.status());
  return *host;
}

std::vector<double> Doubles(const Tensor& t) { return t.ToDoubleVector(); }

// Runs fn on every rank, one thread each, and returns the statuses.
std::vector<Status> OnEveryRank(std::vector<std::unique_ptr<Communicator>>& comms,
                                const std::function<Status(Communicator&)>& fn) {
  std::vector<Status> status(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) threads.emplace_back([&, r] { status[r] = fn(*comms[r]); });
  for (std::thread& t : threads) t.join();
  return status;
}

TEST_CASE("NCCL arguments that need no GPU are checked") {
  StatusOr<ncclUniqueId> short_id = NcclUniqueIdFromBytes("abc");
  REQUIRE_FALSE(short_id.ok());
  CHECK(short_id.status().message() == "an NCCL unique id has 128 bytes, got 3");
  ncclUniqueId id{};
  id.internal[5] = 42;
  StatusOr<ncclUniqueId> back = NcclUniqueIdFromBytes(NcclUniqueIdBytes(id));
  REQUIRE(back.ok());
  CHECK(back->internal[5] == 42);

  auto cpu = MakeNcclCommunicators({Device::Cpu()});
  REQUIRE_FALSE(cpu.ok());
  CHECK(cpu.status().message() == "MakeNcclCommunicators: rank 0 is on cpu:0, not a CUDA device");
  auto twice = MakeNcclCommunicators({Device::Cuda(0), Device::Cuda(0)});
  REQUIRE_FALSE(twice.ok());
  CHECK(twice.status().message() ==
        "MakeNcclCommunicators: ranks 0 and 1 are both on cuda:0 (NCCL needs one GPU per rank)");
  CHECK(NcclErrorMessage(ncclInvalidUsage, "ncclX()", "f.cc", 3).rfind("ncclInvalidUsage (", 0) == 0);
  if (!HaveGpus(1)) {
    auto missing = NcclCommunicator::Create(id, 1, 0, Device::Cuda(0));
    CHECK_FALSE(missing.ok());
  }
}

TEMPLATE_TEST_CASE("one NCCL rank: every collective is the identity, as on the local communicator", "", float, double,
                   int32_t, int64_t) {
  if (!HaveGpus(1)) return;
  using T = TestType;
  const Device gpu = Device::Cuda(0);
  auto made = MakeNcclCommunicators({gpu});
  REQUIRE(made.ok());
  Communicator& nccl = *(*made)[0];
  std::vector<std::unique_ptr<Communicator>> local = MakeLocalCommunicators(1);
  CHECK(nccl.rank() == 0);
  CHECK(nccl.size() == 1);
  CHECK(nccl.device() == gpu);
  const Tensor x = Input<T>({6, 5}, 0);

  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kMax};
  if (!std::is_integral_v<T>) ops.push_back(ReduceOp::kMean);
  for (ReduceOp op : ops) {
    INFO(ReduceOpName(op));
    Tensor d = OnDevice(x, gpu);
    REQUIRE(nccl.AllReduce(d, op).ok());
    Tensor h = OnDevice(x, Device::Cpu());
    REQUIRE(local[0]->AllReduce(h, op).ok());
    CHECK(Doubles(OnHost(nccl, d)) == Doubles(h));

    Tensor out = OnDevice(Tensor::Zeros({6, 5}, x.dtype()), gpu);
    REQUIRE(nccl.ReduceScatter(OnDevice(x, gpu), out, op).ok());
    CHECK(Doubles(OnHost(nccl, out)) == Doubles(x));
  }
  Tensor gathered = OnDevice(Tensor::Zeros({6, 5}, x.dtype()), gpu);
  REQUIRE(nccl.AllGather(OnDevice(x, gpu), gathered).ok());
  CHECK(Doubles(OnHost(nccl, gathered)) == Doubles(x));
  Tensor b = OnDevice(x, gpu);
  REQUIRE(nccl.Broadcast(b, 0).ok());
  CHECK(Doubles(OnHost(nccl, b)) == Doubles(x));

  // Local checks name the rank; a host tensor is refused.
  Tensor host = x;
  Status wrong = nccl.AllReduce(host, ReduceOp::kSum);
  CHECK(wrong.message().rfind("rank 0 of 1: AllReduce: in_out [6, 5] ", 0) == 0);
  CHECK(nccl.Send(OnDevice(x, gpu), 0).message() == "rank 0 of 1: Send: peer 0 is this rank");
}

TEST_CASE("one NCCL rank made from a unique id (the per-process bootstrap)") {
  if (!HaveGpus(1)) return;
  StatusOr<ncclUniqueId> id = NewNcclUniqueId();
  REQUIRE(id.ok());
  StatusOr<ncclUniqueId> copied = NcclUniqueIdFromBytes(NcclUniqueIdBytes(*id));
  REQUIRE(copied.ok());
  auto comm = NcclCommunicator::Create(*copied, 1, 0, Device::Cuda(0));
  REQUIRE(comm.ok());
  Tensor t = OnDevice(Input<float>({100}, 0), Device::Cuda(0));
  REQUIRE((*comm)->AllReduce(t, ReduceOp::kSum).ok());
  CHECK(Doubles(OnHost(**comm, t)) == Doubles(Input<float>({100}, 0)));
  // After Abort every call fails with the reason.
  (*comm)->Abort(Internal("step failed"));
  Status after = (*comm)->AllReduce(t, ReduceOp::kSum);
  CHECK(after.message() == "rank 0 of 1: AllReduce: rank 0 aborted the group (INTERNAL: step failed)");
}

// The process bootstrap (nccl_bootstrap.h) over local communicators, one
// rank per GPU present (up to 2), each rank on its own thread.
TEST_CASE("NCCL ranks bootstrapped through a CPU communicator all-reduce") {
  if (!HaveGpus(1)) return;
  const int ranks = HaveGpus(2) ? 2 : 1;
  std::vector<std::unique_ptr<Communicator>> cpu = MakeLocalCommunicators(ranks);
  std::vector<Status> status(static_cast<size_t>(ranks));
  std::vector<std::vector<double>> sums(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      auto nccl = NcclCommunicatorOver(*cpu[static_cast<size_t>(r)], Device::Cuda(r));
      if (!nccl.ok()) {
        status[static_cast<size_t>(r)] = nccl.status();
        return;
      }
      Tensor t = OnDevice(Input<float>({64}, r), Device::Cuda(r));
      status[static_cast<size_t>(r)] = (*nccl)->AllReduce(t, ReduceOp::kSum);
      sums[static_cast<size_t>(r)] = Doubles(OnHost(**nccl, t));
    });
  for (std::thread& t : threads) t.join();
  std::vector<double> want(64, 0.0);
  for (int r = 0; r < ranks; ++r) {
    const std::vector<double> x = Doubles(Input<float>({64}, r));
    for (size_t i = 0; i < want.size(); ++i) want[i] += x[i];
  }
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    REQUIRE(status[static_cast<size_t>(r)].ToString() == "OK");
    CHECK(sums[static_cast<size_t>(r)] == want);
  }
}

TEMPLATE_TEST_CASE("two NCCL ranks on two GPUs agree with the local communicator", "", float, double) {
  if (!HaveGpus(2)) return;
  using T = TestType;
  const int n = 2;
  auto made = MakeNcclCommunicators({Device::Cuda(0), Device::Cuda(1)});
  REQUIRE(made.ok());
  std::vector<std::unique_ptr<Communicator>>& nccl = *made;
  std::vector<std::unique_ptr<Communicator>> local = MakeLocalCommunicators(n);
  // Runs the same calls on both groups; returns each group's results (host).
  using Results = std::vector<std::vector<double>>;
  auto both = [&](const std::function<Status(Communicator&, Results&)>& fn) {
    std::vector<Results> results(2, Results(n));
    std::vector<std::unique_ptr<Communicator>>* groups[2] = {&nccl, &local};
    for (int g = 0; g < 2; ++g) {
      std::vector<Status> status = OnEveryRank(*groups[g], [&](Communicator& c) { return fn(c, results[g]); });
      for (const Status& s : status) REQUIRE(s.ok());
    }
    return results;
  };
  auto expect_same = [&](const std::vector<Results>& results) {
    for (int r = 0; r < n; ++r) {
      REQUIRE(results[0][r].size() == results[1][r].size());
      // Two terms: a + b is the same in any order; the mean may be scaled first.
      for (size_t i = 0; i < results[0][r].size(); ++i)
        CHECK(results[0][r][i] == Approx(results[1][r][i]).epsilon(1e-6));
    }
  };
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
    INFO(ReduceOpName(op));
    expect_same(both([&](Communicator& c, Results& out) -> Status {
      Tensor t = OnDevice(Input<T>({1000}, c.rank()), c.device());
      LOOM_RETURN_IF_ERROR(c.AllReduce(t, op));
      out[c.rank()] = Doubles(OnHost(c, t));
      return Status::Ok();
    }));
    expect_same(both([&](Communicator& c, Results& out) -> Status {
      Tensor in = OnDevice(Input<T>({2 * n, 3}, c.rank()), c.device());
      Tensor part = OnDevice(Tensor::Zeros({2, 3}, DTypeOf<T>::value), c.device());
      LOOM_RETURN_IF_ERROR(c.ReduceScatter(in, part, op));
      out[c.rank()] = Doubles(OnHost(c, part));
      return Status::Ok();
    }));
  }
  expect_same(both([&](Communicator& c, Results& out) -> Status {
    Tensor in = OnDevice(Input<T>({3, 2}, c.rank()), c.device());
    Tensor all = OnDevice(Tensor::Zeros({3 * n, 2}, DTypeOf<T>::value), c.device());
    LOOM_RETURN_IF_ERROR(c.AllGather(in, all));
    out[c.rank()] = Doubles(OnHost(c, all));
    return Status::Ok();
  }));
  expect_same(both([&](Communicator& c, Results& out) -> Status {
    Tensor t = OnDevice(Input<T>({7}, c.rank()), c.device());
    LOOM_RETURN_IF_ERROR(c.Broadcast(t, 1));
    Tensor mine = OnDevice(Input<T>({4}, c.rank()), c.device());
    Tensor theirs = OnDevice(Tensor::Zeros({4}, DTypeOf<T>::value), c.device());
    const int peer = 1 - c.rank();
    LOOM_RETURN_IF_ERROR(c.SendRecv(mine, peer, theirs, peer));
    // Rank 0 sends first and rank 1 receives first: plain Send/Recv.
    Tensor one = OnDevice(Input<T>({2}, c.rank()), c.device());
    if (c.rank() == 0) {
      LOOM_RETURN_IF_ERROR(c.Send(one, 1));
    } else {
      LOOM_RETURN_IF_ERROR(c.Recv(one, 0));
    }
    std::vector<double> v = Doubles(OnHost(c, t));
    for (double x : Doubles(OnHost(c, theirs))) v.push_back(x);
    for (double x : Doubles(OnHost(c, one))) v.push_back(x);
    out[c.rank()] = v;
    return Status::Ok();
  }));
}

}  // namespace
}  // namespace loom
