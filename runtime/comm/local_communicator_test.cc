// The in-process communicator: every collective against a serial reference
// for 1..4 ranks, point to point, mismatches and aborts (errors on every
// rank, never a hang), and many iterations of mixed calls.
#include "runtime/comm/local_communicator.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

namespace loom {
namespace {

// Runs fn(comm) on one thread per rank and returns each rank's status. A
// hang aborts the binary after a minute instead of waiting for the test
// timeout, so that it names the test.
std::vector<Status> RunRanks(int n, const std::function<Status(Communicator&)>& fn,
                             std::vector<std::unique_ptr<Communicator>>* keep = nullptr) {
  std::vector<std::unique_ptr<Communicator>> comms = MakeLocalCommunicators(n);
  std::vector<Status> status(n);
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      status[r] = fn(*comms[r]);
      std::lock_guard<std::mutex> lock(mu);
      ++done;
      cv.notify_all();
    });
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(60), [&] { return done == n; })) {
      std::fprintf(stderr, "communicator test hung: %d of %d ranks returned\n", done, n);
      std::abort();
    }
  }
  for (std::thread& t : threads) t.join();
  if (keep != nullptr) *keep = std::move(comms);
  return status;
}

void RequireAllOk(const std::vector<Status>& status) {
  for (size_t r = 0; r < status.size(); ++r) {
    INFO("rank " << r << ": " << status[r].ToString());
    REQUIRE(status[r].ok());
  }
}

// Rank r's input: distinct, exactly representable in neither f32 sums nor
// f64 sums in general, so the reduction order shows in the bits.
template <typename T>
Tensor Input(const Shape& shape, int rank, int salt) {
  std::mt19937 gen(1000 * rank + salt);
  std::uniform_real_distribution<double> dist(-3.0, 3.0);
  std::vector<T> v(shape.numel());
  for (T& x : v) x = static_cast<T>(dist(gen)) / static_cast<T>(7);
  return Tensor::FromVector<T>(shape, v);
}

template <typename T>
std::vector<T> Values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

// acc = x0; acc = acc (op) x1; ... per element, then / n for the mean.
template <typename T>
std::vector<T> SerialReduce(const std::vector<std::vector<T>>& xs, ReduceOp op) {
  std::vector<T> acc = xs[0];
  for (size_t k = 1; k < xs.size(); ++k)
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = op == ReduceOp::kMax ? std::max(acc[i], xs[k][i]) : acc[i] + xs[k][i];
  if (op == ReduceOp::kMean)
    for (T& a : acc) a = a / static_cast<T>(xs.size());
  return acc;
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax};

TEMPLATE_TEST_CASE("AllReduce matches a serial reduction in rank order, bit for bit on every rank", "", float, double) {
  using T = TestType;
  for (int n = 1; n <= 4; ++n)
    for (ReduceOp op : kOps)
      for (int64_t numel : {0, 1, 7, 1000, 5003}) {
        INFO("n " << n << ", " << ReduceOpName(op) << ", " << numel << " elements");
        std::vector<std::vector<T>> inputs;
        for (int r = 0; r < n; ++r) inputs.push_back(Values<T>(Input<T>({numel}, r, 1)));
        std::vector<T> expected = SerialReduce(inputs, op);
        std::vector<std::vector<T>> got(n);
        RequireAllOk(RunRanks(n, [&](Communicator& comm) -> Status {
          Tensor t = Input<T>({numel}, comm.rank(), 1);
          LOOM_RETURN_IF_ERROR(comm.AllReduce(t, op));
          got[comm.rank()] = Values<T>(t);
          return Status::Ok();
        }));
        for (int r = 0; r < n; ++r) {
          INFO("rank " << r);
          CHECK(SameBits(got[r], expected));
        }
      }
}

TEMPLATE_TEST_CASE("ReduceScatter gives rank r the reduction of part r", "", float, double) {
  using T = TestType;
  for (int n = 1; n <= 4; ++n)
    for (ReduceOp op : kOps)
      for (int64_t m : {0, 1, 3, 700}) {
        INFO("n " << n << ", " << ReduceOpName(op) << ", parts of " << m << " rows");
        const Shape in_shape{n * m, 3};
        std::vector<std::vector<T>> inputs;
        for (int r = 0; r < n; ++r) inputs.push_back(Values<T>(Input<T>(in_shape, r, 2)));
        std::vector<T> full = SerialReduce(inputs, op);
        std::vector<std::vector<T>> got(n);
        RequireAllOk(RunRanks(n, [&](Communicator& comm) -> Status {
          Tensor in = Input<T>(in_shape, comm.rank(), 2);
          Tensor out = Tensor::Zeros({m, 3}, DTypeOf<T>::value);
          LOOM_RETURN_IF_ERROR(comm.ReduceScatter(in, out, op));
          got[comm.rank()] = Values<T>(out);
          return Status::Ok();
        }));
        for (int r = 0; r < n; ++r) {
          INFO("rank " << r);
          std::vector<T> part(full.begin() + r * m * 3, full.begin() + (r + 1) * m * 3);
          CHECK(SameBits(got[r], part));
        }
      }
}

TEMPLATE_TEST_CASE("AllGather concatenates the ranks' tensors along dim 0", "", float, double) {
  using T = TestType;
  for (int n = 1; n <= 4; ++n)
    for (int64_t m : {0, 1, 5}) {
      INFO("n " << n << ", " << m << " rows per rank");
      std::vector<T> expected;
      for (int r = 0; r < n; ++r) {
        std::vector<T> v = Values<T>(Input<T>({m, 2}, r, 3));
        expected.insert(expected.end(), v.begin(), v.end());
      }
      std::vector<std::vector<T>> got(n);
      RequireAllOk(RunRanks(n, [&](Communicator& comm) -> Status {
        Tensor in = Input<T>({m, 2}, comm.rank(), 3);
        Tensor out = Tensor::Zeros({n * m, 2}, DTypeOf<T>::value);
        LOOM_RETURN_IF_ERROR(comm.AllGather(in, out));
        got[comm.rank()] = Values<T>(out);
        return Status::Ok();
      }));
      for (int r = 0; r < n; ++r) CHECK(SameBits(got[r], expected));
    }
}

TEMPLATE_TEST_CASE("Broadcast copies the root's tensor to every rank", "", float, double) {
  using T = TestType;
  for (int n = 1; n <= 4; ++n)
    for (int root = 0; root < n; ++root) {
      INFO("n " << n << ", root " << root);
      std::vector<T> expected = Values<T>(Input<T>({4, 3}, root, 4));
      std::vector<std::vector<T>> got(n);
      RequireAllOk(RunRanks(n, [&](Communicator& comm) -> Status {
        Tensor t = Input<T>({4, 3}, comm.rank(), 4);
        LOOM_RETURN_IF_ERROR(comm.Broadcast(t, root));
        got[comm.rank()] = Values<T>(t);
        return Status::Ok();
      }));
      for (int r = 0; r < n; ++r) CHECK(SameBits(got[r], expected));
    }
}

TEST_CASE("bf16, f16 and bool tensors move bit for bit") {
  for (DType d : {DType::kBF16, DType::kF16, DType::kBool}) {
    INFO(DTypeName(d));
    auto bits = [d](int rank) {
      Tensor t = Tensor::Zeros({6}, d);
      auto* raw = static_cast<unsigned char*>(t.raw_data());
      const unsigned mask = d == DType::kBool ? 1 : 0xff;  // a bool is 0 or 1
      for (size_t i = 0; i < t.nbytes(); ++i) raw[i] = static_cast<unsigned char>((rank * 29 + i * 5 + 3) & mask);
      return t;
    };
    RequireAllOk(RunRanks(3, [&](Communicator& comm) -> Status {
      const int me = comm.rank(), n = comm.size();
      auto same = [](const Tensor& a, const Tensor& b) {
        return std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
      };
      Tensor got = Tensor::Zeros({6}, d);
      LOOM_RETURN_IF_ERROR(comm.SendRecv(bits(me), (me + 1) % n, got, (me + n - 1) % n));
      if (!same(got, bits((me + n - 1) % n))) return Internal("SendRecv changed the bits");
      Tensor b = bits(me);
      LOOM_RETURN_IF_ERROR(comm.Broadcast(b, 2));
      if (!same(b, bits(2))) return Internal("Broadcast changed the bits");
      Tensor all = Tensor::Zeros({6 * n}, d);
      LOOM_RETURN_IF_ERROR(comm.AllGather(bits(me), all));
      for (int r = 0; r < n; ++r)
        if (std::memcmp(static_cast<const char*>(all.raw_data()) + r * b.nbytes(), bits(r).raw_data(), b.nbytes()))
          return Internal("AllGather changed the bits of rank ", r);
      return Status::Ok();
    }));
  }
}

TEST_CASE("integer tensors reduce exactly; their mean is refused on every rank") {
  RequireAllOk(RunRanks(3, [](Communicator& comm) -> Status {
    Tensor a = Tensor::FromVector<int32_t>({2}, {comm.rank() + 1, -comm.rank()});
    LOOM_RETURN_IF_ERROR(comm.AllReduce(a, ReduceOp::kSum));
    Tensor b = Tensor::FromVector<int64_t>({2}, {int64_t{1} << 40, comm.rank()});
    LOOM_RETURN_IF_ERROR(comm.AllReduce(b, ReduceOp::kMax));
    if (Values<int32_t>(a) != std::vector<int32_t>{6, -3}) return Internal("i32 sum ", a.DebugString());
    if (Values<int64_t>(b) != std::vector<int64_t>{int64_t{1} << 40, 2}) return Internal("i64 max ", b.DebugString());
    return Status::Ok();
  }));
  std::vector<Status> status = RunRanks(2, [](Communicator& comm) -> Status {
    Tensor a = Tensor::FromVector<int64_t>({1}, {7});
    return comm.AllReduce(a, ReduceOp::kMean);
  });
  for (int r = 0; r < 2; ++r) {
    REQUIRE_FALSE(status[r].ok());
    CHECK(status[r].code() == StatusCode::kInvalidArgument);
  }
  CHECK(status[0].message() == "rank 0 of 2: AllReduce: mean of i64 tensors is not supported (use sum)");
}

TEST_CASE("Send and Recv pass tensors around a ring, in order per pair of ranks") {
  for (int n = 2; n <= 4; ++n) {
    INFO("n " << n);
    RequireAllOk(RunRanks(n, [n](Communicator& comm) -> Status {
      const int next = (comm.rank() + 1) % n, prev = (comm.rank() + n - 1) % n;
      // Three messages to the next rank before receiving: buffered sends.
      for (int k = 0; k < 3; ++k)
        LOOM_RETURN_IF_ERROR(comm.Send(Tensor::FromVector<double>({2}, {1.0 * comm.rank(), 1.0 * k}), next));
      for (int k = 0; k < 3; ++k) {
        Tensor t = Tensor::Zeros({2}, DType::kF64);
        LOOM_RETURN_IF_ERROR(comm.Recv(t, prev));
        if (Values<double>(t) != std::vector<double>{1.0 * prev, 1.0 * k}) return Internal("got ", t.DebugString());
      }
      // The other way round with SendRecv.
      Tensor mine = Tensor::FromVector<float>({1}, {10.0f + comm.rank()});
      Tensor got = Tensor::Zeros({1}, DType::kF32);
      LOOM_RETURN_IF_ERROR(comm.SendRecv(mine, prev, got, next));
      if (got.data<float>()[0] != 10.0f + next) return Internal("SendRecv got ", got.DebugString());
      return Status::Ok();
    }));
  }
}

TEST_CASE("arguments are checked with the rank, the op and the shapes") {
  std::vector<std::unique_ptr<Communicator>> comms = MakeLocalCommunicators(2);
  Communicator& c = *comms[1];
  Tensor t = Tensor::Zeros({5, 2});
  Tensor out = Tensor::Zeros({3, 2});
  CHECK(comm::CheckReduceScatter(c, t, out, ReduceOp::kSum).message() ==
        "rank 1 of 2: ReduceScatter: dim 0 of in [5, 2] f32 does not split into 2 equal parts");
  Tensor in4 = Tensor::Zeros({4, 2});
  CHECK(comm::CheckReduceScatter(c, in4, out, ReduceOp::kSum).message() ==
        "rank 1 of 2: ReduceScatter: out is [3, 2] f32, expected [2, 2] f32 (part of in [4, 2] f32 over 2 ranks)");
  CHECK(comm::CheckAllGather(c, out, t).message() ==
        "rank 1 of 2: AllGather: out is [5, 2] f32, expected [6, 2] f32 (2 ranks x [3, 2] f32)");
  CHECK(c.Send(t, 1).message() == "rank 1 of 2: Send: peer 1 is this rank");
  CHECK(c.Send(t, 2).message() == "rank 1 of 2: Send: peer 2 is not a rank of a group of 2");
  Tensor undefined;
  CHECK(c.Recv(undefined, 0).message() == "rank 1 of 2: Recv: t is an undefined tensor");
  CHECK(comm::CheckReduce(c, "AllReduce", DType::kBF16, ReduceOp::kSum).message() ==
        "rank 1 of 2: AllReduce: reductions take f32, f64, i32 and i64, got bf16 (bf16, f16 and bool tensors move, "
        "they do not reduce)");
  // Local argument errors of point to point calls leave the group usable.
  RequireAllOk(RunRanks(2, [](Communicator& comm) -> Status {
    Tensor x = Tensor::FromVector<float>({1}, {1.0f});
    if (comm.Send(x, comm.rank()).ok()) return Internal("self send accepted");
    return comm.AllReduce(x, ReduceOp::kSum);
  }));
}

// Every rank fails with `needle` in its message (and its own context), and
// the group is dead afterwards.
void CheckFailsEverywhere(const std::vector<Status>& status, const std::string& needle) {
  for (size_t r = 0; r < status.size(); ++r) {
    INFO("rank " << r << ": " << status[r].ToString());
    REQUIRE_FALSE(status[r].ok());
    CHECK(status[r].message().find(needle) != std::string::npos);
    CHECK(status[r].message().rfind(StrCat("rank ", r, " of ", status.size(), ": "), 0) == 0);
  }
}

TEST_CASE("ranks that disagree at a collective all get an error, and the group is aborted") {
  for (int n = 2; n <= 4; ++n) {
    INFO("n " << n);
    // Different shapes, then a later call on every rank.
    std::vector<Status> later(n);
    std::vector<Status> status = RunRanks(n, [&](Communicator& comm) -> Status {
      Tensor t = Tensor::Zeros({comm.rank() == n - 1 ? 5 : 4});
      Status s = comm.AllReduce(t, ReduceOp::kSum);
      Tensor u = Tensor::Zeros({1});
      later[comm.rank()] = comm.Broadcast(u, 0);
      return s;
    });
    CheckFailsEverywhere(status, "ranks disagree at collective #0: rank 0: AllReduce(sum) of [4] f32");
    CHECK(status[0].message().find(StrCat("rank ", n - 1, ": AllReduce(sum) of [5] f32")) != std::string::npos);
    CheckFailsEverywhere(later, "the group was aborted by a failed collective: ranks disagree");
    for (const Status& s : later) CHECK(s.code() == StatusCode::kFailedPrecondition);

    // Different collectives and different reduce ops.
    CheckFailsEverywhere(RunRanks(n, [](Communicator& comm) -> Status {
      Tensor t = Tensor::Zeros({2});
      if (comm.rank() == 1) {
        Tensor out = Tensor::Zeros({2 * comm.size()});
        return comm.AllGather(t, out);
      }
      return comm.AllReduce(t, ReduceOp::kSum);
    }), "rank 1: AllGather of [2] f32 into");
    CheckFailsEverywhere(RunRanks(n, [](Communicator& comm) -> Status {
      Tensor t = Tensor::Zeros({2});
      return comm.AllReduce(t, comm.rank() == 0 ? ReduceOp::kMax : ReduceOp::kSum);
    }), "rank 0: AllReduce(max) of [2] f32");
    CheckFailsEverywhere(RunRanks(n, [](Communicator& comm) -> Status {
      Tensor t = Tensor::Zeros({2}, comm.rank() == 0 ? DType::kF64 : DType::kF32);
      return comm.Broadcast(t, comm.rank() == 0 ? 0 : 1);
    }), "rank 0: Broadcast from rank 0 of [2] f64");

    // Invalid arguments on one rank: that rank says why, the others name it.
    std::vector<Status> invalid = RunRanks(n, [](Communicator& comm) -> Status {
      Tensor in = Tensor::Zeros({comm.rank() == 1 ? 3 * comm.size() + 1 : 3 * comm.size()});
      Tensor out = Tensor::Zeros({3});
      return comm.ReduceScatter(in, out, ReduceOp::kSum);
    });
    CheckFailsEverywhere(invalid, "does not split into");
    CHECK(invalid[1].message() == StrCat("rank 1 of ", n, ": ReduceScatter: dim 0 of in [", 3 * n + 1,
                                         "] f32 does not split into ", n, " equal parts"));
    CHECK(invalid[0].message().find("rank 1's call is invalid") != std::string::npos);
  }
}

TEST_CASE("a rank that fails and aborts releases the ranks waiting for it") {
  for (int n = 2; n <= 4; ++n) {
    INFO("n " << n);
    std::vector<Status> status = RunRanks(n, [&](Communicator& comm) -> Status {
      Tensor t = Tensor::Zeros({8});
      LOOM_RETURN_IF_ERROR(comm.AllReduce(t, ReduceOp::kSum));  // every rank gets this far
      if (comm.rank() == 1) {
        // Its step failed: it never reaches the next collective.
        Status failure = Internal("kernel Conv2D failed");
        comm.Abort(failure);
        return failure;
      }
      if (comm.rank() == 0 && n > 2) {
        Tensor r = Tensor::Zeros({8});
        return comm.Recv(r, 1);  // a message that will never come
      }
      return comm.AllReduce(t, ReduceOp::kSum);
    });
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << ": " << status[r].ToString());
      REQUIRE_FALSE(status[r].ok());
      if (r == 1) continue;
      CHECK(status[r].code() == StatusCode::kFailedPrecondition);
      CHECK(status[r].message().find("rank 1 aborted the group (INTERNAL: kernel Conv2D failed)") != std::string::npos);
    }
  }
}

TEST_CASE("a rank whose communicator is destroyed while others wait for it does not hang them") {
  std::vector<std::unique_ptr<Communicator>> comms = MakeLocalCommunicators(3);
  std::vector<Status> status(2);
  std::thread waiter0([&] {
    Tensor t = Tensor::Zeros({4});
    status[0] = comms[0]->AllReduce(t, ReduceOp::kSum);
  });
  std::thread waiter1([&] {
    Tensor t = Tensor::Zeros({4});
    status[1] = comms[1]->Recv(t, 2);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  comms[2].reset();
  waiter0.join();
  waiter1.join();
  for (const Status& s : status) {
    INFO(s.ToString());
    CHECK(s.message().find("rank 2 left the group (its communicator was destroyed)") != std::string::npos);
  }
}

TEST_CASE("a Recv that does not match its Send fails, and the sender learns at its next call") {
  std::vector<Status> status = RunRanks(2, [](Communicator& comm) -> Status {
    if (comm.rank() == 0) {
      LOOM_RETURN_IF_ERROR(comm.Send(Tensor::Zeros({3}), 1));
      Tensor t = Tensor::Zeros({1});
      return comm.AllReduce(t, ReduceOp::kSum);
    }
    Tensor t = Tensor::Zeros({4});
    return comm.Recv(t, 0);
  });
  REQUIRE_FALSE(status[1].ok());
  CHECK(status[1].message() ==
        "rank 1 of 2: Recv: message #0 from rank 0 is [3] f32, the receiving tensor is [4] f32");
  REQUIRE_FALSE(status[0].ok());
  CHECK(status[0].message().find("rank 0 of 2: AllReduce: rank 1 aborted the group (INVALID_ARGUMENT: rank 1 of 2: Recv") ==
        0);
}

TEST_CASE("many iterations of mixed calls lose no wake-up and stay in step") {
  const int n = 4, iterations = 1500;
  RequireAllOk(RunRanks(n, [&](Communicator& comm) -> Status {
    const int next = (comm.rank() + 1) % n, prev = (comm.rank() + n - 1) % n;
    for (int it = 0; it < iterations; ++it) {
      // Small tensors: the rendezvous, not the copying, is what is tested.
      Tensor t = Tensor::FromVector<double>({3}, {1.0 * comm.rank(), 1.0 * it, 1.0});
      LOOM_RETURN_IF_ERROR(comm.AllReduce(t, it % 2 == 0 ? ReduceOp::kSum : ReduceOp::kMax));
      const double expect0 = it % 2 == 0 ? 6.0 : 3.0, expect1 = it % 2 == 0 ? 4.0 * it : 1.0 * it;
      if (t.data<double>()[0] != expect0 || t.data<double>()[1] != expect1)
        return Internal("iteration ", it, ": ", t.DebugString());
      Tensor b = Tensor::FromVector<int64_t>({1}, {comm.rank() == it % n ? it : -1});
      LOOM_RETURN_IF_ERROR(comm.Broadcast(b, it % n));
      if (b.data<int64_t>()[0] != it) return Internal("iteration ", it, ": broadcast ", b.DebugString());
      Tensor got = Tensor::Zeros({1}, DType::kI32);
      LOOM_RETURN_IF_ERROR(comm.SendRecv(Tensor::FromVector<int32_t>({1}, {it * n + comm.rank()}), next, got, prev));
      if (got.data<int32_t>()[0] != it * n + prev) return Internal("iteration ", it, ": recv ", got.DebugString());
    }
    return Status::Ok();
  }));
}

}  // namespace
}  // namespace loom
