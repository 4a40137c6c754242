#include "runtime/comm/local_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <type_traits>
#include <utility>

namespace loom {
namespace {

enum class Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast };

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce: return "AllReduce";
    case Kind::kReduceScatter: return "ReduceScatter";
    case Kind::kAllGather: return "AllGather";
    case Kind::kBroadcast: return "Broadcast";
  }
  return "?";
}

// One rank's arguments to a collective; the tensors are the caller's, which
// stay valid because the caller is blocked in the call.
struct Call {
  Kind kind = Kind::kAllReduce;
  ReduceOp reduce = ReduceOp::kSum;
  int root = 0;
  const Tensor* in = nullptr;
  Tensor* out = nullptr;  // == in for AllReduce and Broadcast
  Status check;           // this rank's own argument check

  // Equal on every rank exactly when the ranks agree.
  std::string Signature() const {
    switch (kind) {
      case Kind::kAllReduce: return StrCat("AllReduce(", ReduceOpName(reduce), ") of ", comm::Describe(*in));
      case Kind::kReduceScatter:
        return StrCat("ReduceScatter(", ReduceOpName(reduce), ") of ", comm::Describe(*in), " into ",
                      comm::Describe(*out));
      case Kind::kAllGather: return StrCat("AllGather of ", comm::Describe(*in), " into ", comm::Describe(*out));
      case Kind::kBroadcast: return StrCat("Broadcast from rank ", root, " of ", comm::Describe(*in));
    }
    return "?";
  }
};

template <typename T>
T Add(T a, T b) {
  // Integer sums wrap (as NCCL's do) instead of being undefined on overflow.
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

// dsts[d][i] = reduce over k in rank order of srcs[k][i], for i in [begin, end).
// Each tile is read from every source before any destination is written, so
// a destination may be one of the sources (in-place AllReduce).
template <typename T>
void ReduceRange(const std::vector<const T*>& srcs, const std::vector<T*>& dsts, int64_t begin, int64_t end,
                 ReduceOp reduce) {
  constexpr int64_t kTile = 1024;
  T acc[kTile];
  const T count = static_cast<T>(srcs.size());
  for (int64_t t0 = begin; t0 < end; t0 += kTile) {
    const int64_t len = std::min(kTile, end - t0);
    const T* first = srcs[0] + t0;
    for (int64_t i = 0; i < len; ++i) acc[i] = first[i];
    for (size_t k = 1; k < srcs.size(); ++k) {
      const T* s = srcs[k] + t0;
      if (reduce == ReduceOp::kMax) {
        for (int64_t i = 0; i < len; ++i) acc[i] = s[i] > acc[i] ? s[i] : acc[i];
      } else {
        for (int64_t i = 0; i < len; ++i) acc[i] = Add(acc[i], s[i]);
      }
    }
    if (reduce == ReduceOp::kMean)
      for (int64_t i = 0; i < len; ++i) acc[i] = acc[i] / count;
    for (T* d : dsts) std::memcpy(d + t0, acc, static_cast<size_t>(len) * sizeof(T));
  }
}

void CopyBytes(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
}

// Rank `rank`'s share of a collective that moves bytes (any dtype).
void Move(const std::vector<Call>& calls, int rank) {
  const int n = static_cast<int>(calls.size());
  const Call& mine = calls[rank];
  switch (mine.kind) {
    case Kind::kAllGather: {
      const size_t bytes = mine.in->nbytes();
      char* out = static_cast<char*>(mine.out->raw_data());
      for (int k = 0; k < n; ++k) CopyBytes(out + k * bytes, calls[k].in->raw_data(), bytes);
      return;
    }
    case Kind::kBroadcast:
      if (rank != mine.root) CopyBytes(mine.out->raw_data(), calls[mine.root].in->raw_data(), mine.in->nbytes());
      return;
    case Kind::kAllReduce:
    case Kind::kReduceScatter: LOOM_CHECK(false, "a reduction of ", DTypeName(mine.in->dtype()), " (unchecked)");
  }
}

// Rank `rank`'s share of a collective whose calls agree.
template <typename T>
void Execute(const std::vector<Call>& calls, int rank) {
  const int n = static_cast<int>(calls.size());
  const Call& mine = calls[rank];
  switch (mine.kind) {
    case Kind::kAllReduce: {
      // Rank r reduces slice r (cache-line aligned) and writes it to every rank.
      const int64_t numel = mine.in->numel();
      const int64_t align = std::max<int64_t>(1, 64 / static_cast<int64_t>(sizeof(T)));
      const int64_t slice = ((numel + n - 1) / n + align - 1) / align * align;
      const int64_t begin = std::min(numel, rank * slice), end = std::min(numel, begin + slice);
      if (begin >= end) return;
      std::vector<const T*> srcs;
      std::vector<T*> dsts;
      for (const Call& c : calls) {
        srcs.push_back(c.in->data<T>());
        dsts.push_back(c.out->data<T>());
      }
      ReduceRange(srcs, dsts, begin, end, mine.reduce);
      return;
    }
    case Kind::kReduceScatter: {
      const int64_t part = mine.out->numel();
      std::vector<const T*> srcs;
      for (const Call& c : calls) srcs.push_back(c.in->data<T>() + rank * part);
      ReduceRange(srcs, {mine.out->data<T>()}, 0, part, mine.reduce);
      return;
    }
    case Kind::kAllGather:
    case Kind::kBroadcast: return Move(calls, rank);
  }
}

void ExecuteAny(const std::vector<Call>& calls, int rank) {
  switch (calls[rank].in->dtype()) {
    case DType::kF32: return Execute<float>(calls, rank);
    case DType::kF64: return Execute<double>(calls, rank);
    case DType::kI32: return Execute<int32_t>(calls, rank);
    case DType::kI64: return Execute<int64_t>(calls, rank);
    case DType::kBF16:
    case DType::kF16:
    case DType::kBool: return Move(calls, rank);  // moved only (comm::CheckReduce refuses their reductions)
  }
}

// The state that the ranks of one group share.
class Group {
 public:
  explicit Group(int n) : n_(n), calls_(n), closed_(n, false), mailboxes_(n * n), recv_count_(n * n, 0) {}

  int size() const { return n_; }

  // Runs a collective for `rank`; the error comes without the rank's context.
  Status Collective(int rank, Call call) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return aborted_ || !running_; });
    if (aborted_) return AbortedError();
    const uint64_t index = started_;
    if (int left = FirstClosed(); left >= 0) return AbortLeft(left, StrCat("collective #", index));
    calls_[rank] = std::move(call);
    if (++arrived_ == n_) {
      arrived_ = 0;
      running_ = true;
      ++started_;
      MatchCalls(index);
      if (!result_.ok()) Abort(StrCat("the group was aborted by a failed collective: ", result_.message()));
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return started_ > index || aborted_ || FirstClosed() >= 0; });
      if (started_ == index) {
        if (aborted_) return AbortedError();
        return AbortLeft(FirstClosed(), StrCat("collective #", index));
      }
    }
    // The collective runs: every rank takes part until all have departed.
    Status result = result_;
    const bool run = result_.ok();
    lock.unlock();
    if (run) ExecuteAny(calls_, rank);
    lock.lock();
    if (++departed_ == n_) {
      departed_ = 0;
      running_ = false;
      ++finished_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return finished_ > index; });
    }
    return result;
  }

  Status Post(int from, int to, Tensor message) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return AbortedError();
    mailboxes_[from * n_ + to].push_back(std::move(message));
    cv_.notify_all();
    return Status::Ok();
  }

  // The oldest message from `from` to `to`, and its sequence number.
  StatusOr<std::pair<Tensor, uint64_t>> Take(int to, int from) {
    std::unique_lock<std::mutex> lock(mu_);
    std::deque<Tensor>& box = mailboxes_[from * n_ + to];
    cv_.wait(lock, [&] { return aborted_ || !box.empty() || closed_[from]; });
    if (aborted_) return AbortedError();
    const uint64_t seq = recv_count_[from * n_ + to];
    if (box.empty()) return AbortLeft(from, StrCat("message #", seq, " to rank ", to));
    Tensor message = std::move(box.front());
    box.pop_front();
    ++recv_count_[from * n_ + to];
    return std::make_pair(std::move(message), seq);
  }

  void AbortBy(int rank, const Status& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    Abort(StrCat("rank ", rank, " aborted the group (", reason.ToString(), ")"));
  }

  void Close(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    closed_[rank] = true;
    cv_.notify_all();
  }

 private:
  // The first reason wins; wakes every waiter. Called with mu_ held.
  void Abort(const std::string& message) {
    if (!aborted_) {
      aborted_ = true;
      abort_message_ = message;
    }
    cv_.notify_all();
  }

  Status AbortedError() const { return FailedPrecondition(abort_message_); }

  Status AbortLeft(int left, const std::string& what) {
    Abort(StrCat("rank ", left, " left the group (its communicator was destroyed) before ", what));
    return AbortedError();
  }

  int FirstClosed() const {
    for (int r = 0; r < n_; ++r)
      if (closed_[r]) return r;
    return -1;
  }

  // Sets result_ for collective `index` from calls_.
  void MatchCalls(uint64_t index) {
    result_ = Status::Ok();
    for (int r = 0; r < n_; ++r) {
      if (!calls_[r].check.ok()) {
        result_ = InvalidArgument("collective #", index, ": rank ", r, "'s call is invalid: ", calls_[r].check.message());
        return;
      }
    }
    std::string first = calls_[0].Signature();
    bool agree = true;
    for (int r = 1; r < n_ && agree; ++r) agree = calls_[r].Signature() == first;
    if (agree) return;
    std::string calls;
    for (int r = 0; r < n_; ++r) calls += StrCat(r == 0 ? "" : "; ", "rank ", r, ": ", calls_[r].Signature());
    result_ = InvalidArgument("ranks disagree at collective #", index, ": ", calls);
  }

  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool aborted_ = false;
  std::string abort_message_;

  // The collective rendezvous: ranks arrive (post their calls) until all n
  // have; then the collective runs until all n have departed, and only then
  // may the next one start. Both counters only grow.
  std::vector<Call> calls_;
  int arrived_ = 0, departed_ = 0;
  bool running_ = false;
  uint64_t started_ = 0, finished_ = 0;
  Status result_;

  std::vector<bool> closed_;
  std::vector<std::deque<Tensor>> mailboxes_;  // [from * n + to], oldest first
  std::vector<uint64_t> recv_count_;
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {}
  ~LocalCommunicator() override { group_->Close(rank_); }

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  Device device() const override { return Device::Cpu(); }

  Status AllReduce(Tensor& in_out, ReduceOp op) override {
    Call call{Kind::kAllReduce, op, 0, &in_out, &in_out, comm::CheckTensor(*this, "AllReduce", "in_out", in_out)};
    if (call.check.ok()) call.check = comm::CheckReduce(*this, "AllReduce", in_out.dtype(), op);
    return Run(std::move(call));
  }

  Status ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    return Run(Call{Kind::kReduceScatter, op, 0, &in, &out, comm::CheckReduceScatter(*this, in, out, op)});
  }

  Status AllGather(const Tensor& in, Tensor& out) override {
    return Run(Call{Kind::kAllGather, ReduceOp::kSum, 0, &in, &out, comm::CheckAllGather(*this, in, out)});
  }

  Status Broadcast(Tensor& t, int root) override {
    Call call{Kind::kBroadcast, ReduceOp::kSum, root, &t, &t, comm::CheckTensor(*this, "Broadcast", "t", t)};
    if (call.check.ok()) call.check = comm::CheckPeer(*this, "Broadcast", "root", root, /*allow_self=*/true);
    return Run(std::move(call));
  }

  Status Send(const Tensor& t, int peer) override {
    LOOM_RETURN_IF_ERROR(comm::CheckTensor(*this, "Send", "t", t));
    LOOM_RETURN_IF_ERROR(comm::CheckPeer(*this, "Send", "peer", peer, /*allow_self=*/false));
    LOOM_ASSIGN_OR_RETURN(Tensor message, Tensor::Empty(t.shape(), t.dtype(), device()));
    CopyBytes(message.raw_data(), t.raw_data(), t.nbytes());
    return group_->Post(rank_, peer, std::move(message)).WithContext(comm::CommContext(*this, "Send"));
  }

  Status Recv(Tensor& t, int peer) override {
    const std::string context = comm::CommContext(*this, "Recv");
    LOOM_RETURN_IF_ERROR(comm::CheckTensor(*this, "Recv", "t", t));
    LOOM_RETURN_IF_ERROR(comm::CheckPeer(*this, "Recv", "peer", peer, /*allow_self=*/false));
    StatusOr<std::pair<Tensor, uint64_t>> taken = group_->Take(rank_, peer);
    if (!taken.ok()) return taken.status().WithContext(context);
    const auto& [message, seq] = *taken;
    if (message.shape() != t.shape() || message.dtype() != t.dtype()) {
      Status mismatch = InvalidArgument(context, ": message #", seq, " from rank ", peer, " is ",
                                        comm::Describe(message), ", the receiving tensor is ", comm::Describe(t));
      group_->AbortBy(rank_, mismatch);
      return mismatch;
    }
    CopyBytes(t.raw_data(), message.raw_data(), t.nbytes());
    return Status::Ok();
  }

  // Send is buffered, so sending first never blocks.
  Status SendRecv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer) override {
    LOOM_RETURN_IF_ERROR(Send(send, send_peer));
    return Recv(recv, recv_peer);
  }

  Status Synchronize() override { return Status::Ok(); }

  void Abort(const Status& reason) override { group_->AbortBy(rank_, reason); }

 private:
  Status Run(Call call) {
    const std::string op = KindName(call.kind);
    Status own = call.check;
    // Invalid arguments still take part in the rendezvous, so that the other
    // ranks fail with them instead of waiting for this one.
    Status status = group_->Collective(rank_, std::move(call));
    if (!own.ok()) return own;
    return status.WithContext(comm::CommContext(*this, op));
  }

  std::shared_ptr<Group> group_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> MakeLocalCommunicators(int n) {
  LOOM_CHECK(n >= 1, "MakeLocalCommunicators(", n, "): a group has at least one rank");
  auto group = std::make_shared<Group>(n);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<LocalCommunicator>(group, r));
  return comms;
}

}  // namespace loom
