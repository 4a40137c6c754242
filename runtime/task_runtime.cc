#include "runtime/task_runtime.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "core/logging.h"
#include "core/rng.h"
#include "runtime/executor.h"

namespace loom {

struct TaskRuntime::StepState {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> done;  // by task id
  int64_t next_message = 0;  // processes: the turn of this rank's next cross-rank task
  bool failed = false;
  Status error = Status::Ok();
  std::vector<std::atomic<int>> readers;  // by piece id: readers still to run
  std::chrono::steady_clock::time_point start;
  explicit StepState(size_t tasks, size_t pieces) : done(tasks, 0), readers(pieces) {}
};

// This process's device threads but the first, kept for the runtime's life
// (starting them anew every step cost a few percent of a small model's
// step). Run(fn) calls fn(k) for every k in [0, count) at once, k = 0 on
// the calling thread, and returns when all have returned.
class TaskRuntime::DeviceThreads {
 public:
  static StatusOr<std::unique_ptr<DeviceThreads>> Create(size_t count) {
    std::unique_ptr<DeviceThreads> t(new DeviceThreads());
    try {
      for (size_t k = 1; k < count; ++k) t->threads_.emplace_back([p = t.get(), k] { p->Loop(k); });
    } catch (const std::exception& e) {  // std::system_error: the system would not start one
      return ResourceExhausted("cannot start ", count, " device threads: ", e.what());  // ~DeviceThreads joins
    }
    return t;
  }
  ~DeviceThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  void Run(const std::function<void(size_t)>& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &fn;
      running_ = threads_.size();
      ++generation_;
    }
    start_.notify_all();
    fn(0);
    std::unique_lock<std::mutex> lock(mu_);
    finished_.wait(lock, [&] { return running_ == 0; });
    job_ = nullptr;
  }

 private:
  DeviceThreads() = default;
  void Loop(size_t k) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(size_t)>* job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      (*job)(k);
      std::lock_guard<std::mutex> lock(mu_);
      if (--running_ == 0) finished_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable start_, finished_;
  const std::function<void(size_t)>* job_ = nullptr;
  uint64_t generation_ = 0;
  size_t running_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

TaskRuntime::TaskRuntime(TaskGraph tasks, TaskRuntimeOptions options)
    : tasks_(std::move(tasks)), options_(options), comm_(options.communicator) {}

TaskRuntime::~TaskRuntime() = default;

StatusOr<std::unique_ptr<TaskRuntime>> TaskRuntime::Create(TaskGraph tasks, const TaskRuntimeOptions& options) {
  if (options.threads_per_device < 1)
    return InvalidArgument("threads per device must be >= 1, got ", options.threads_per_device);
  std::unique_ptr<TaskRuntime> r(new TaskRuntime(std::move(tasks), options));
  LOOM_RETURN_IF_ERROR(r->Prepare());
  return r;
}

int64_t TaskRuntime::RunnerOf(const Task& task) const {
  if (comm_ == nullptr || task.kind == TaskKind::kCompute) return Local(task.device) ? task.device : -1;
  if (task.kind == TaskKind::kTransfer) {
    if (Local(task.device)) return task.device;  // the destination copies or receives
    return Local(task.src_device) ? task.src_device : -1;
  }
  if (Local(task.device)) return task.device;  // a collective's first member combines
  for (const IdList* list : {&task.sources, &task.outputs})
    for (int p : *list)
      if (Local(tasks_.pieces[static_cast<size_t>(p)].device)) return tasks_.pieces[static_cast<size_t>(p)].device;
  return -1;
}

bool TaskRuntime::CrossesRanks(const Task& task) const {
  if (comm_ == nullptr || task.kind == TaskKind::kCompute) return false;
  if (task.kind == TaskKind::kTransfer) return Owner(task.src_device) != Owner(task.device);
  for (const IdList* list : {&task.sources, &task.outputs})
    for (int p : *list)
      if (Owner(tasks_.pieces[static_cast<size_t>(p)].device) != Owner(task.device)) return true;
  return false;
}

Status TaskRuntime::Prepare() {
  const OpRegistry& registry = OpRegistry::Global();
  const int64_t devices = tasks_.devices;
  devices_ = options_.devices.empty() ? std::vector<Device>(static_cast<size_t>(devices), Device::Cpu())
                                      : options_.devices;
  if (static_cast<int64_t>(devices_.size()) != devices)
    return InvalidArgument("the task graph has ", devices, " devices, but ", devices_.size(), " were given to run it");
  const DeviceType kind = devices_[0].type;
  for (const Device& d : devices_)
    if (d.type != kind)
      return InvalidArgument("the task runtime runs devices of one kind, got ", devices_[0].ToString(), " and ",
                             d.ToString());
  if (comm_) {
    if (devices % comm_->size() != 0)
      return InvalidArgument("the task graph has ", devices, " devices, not a multiple of the communicator's ",
                             comm_->size(), " ranks (each process runs as many devices)");
    devices_per_rank_ = devices / comm_->size();
    if (comm_->device() != Device::Cpu())
      return InvalidArgument("the task runtime runs processes on CPU communicators, got one on ",
                             comm_->device().ToString());
  }
  for (int64_t d = 0; d < devices; ++d) {
    if (kind == DeviceType::kCpu) {
      allocators_.push_back(&CpuDeviceAllocator(static_cast<int>(d)));
    } else {
      LOOM_ASSIGN_OR_RETURN(Allocator * a, GetAllocator(devices_[static_cast<size_t>(d)]));
      allocators_.push_back(a);
    }
    std::unique_ptr<ThreadPool> pool;
    if (Local(d)) {
      if (kind == DeviceType::kCpu) {
        LOOM_ASSIGN_OR_RETURN(pool, ThreadPool::Create(options_.threads_per_device));
      }
      local_devices_.push_back(static_cast<size_t>(d));
    }
    pools_.push_back(std::move(pool));
  }
  LOOM_ASSIGN_OR_RETURN(threads_, DeviceThreads::Create(local_devices_.size()));
  queues_.assign(static_cast<size_t>(devices), {});
  kernels_.assign(tasks_.tasks.size(), nullptr);
  readers_.assign(tasks_.pieces.size(), 0);
  for (const Task& t : tasks_.tasks) {
    if (t.device < 0 || t.device >= devices) return Internal("task ", t.name, " on device ", t.device);
    // Processes: a task (or this rank's half of it) goes to one local
    // device's queue; those that cross ranks also take a message ticket.
    const int64_t runner = RunnerOf(t);
    marker_.push_back(runner >= 0 ? static_cast<int>(queues_[static_cast<size_t>(runner)].size()) : -1);
    if (runner >= 0) queues_[static_cast<size_t>(runner)].push_back(t.id);
    runner_.push_back(runner);
    runs_here_.push_back(runner >= 0);
    message_turn_.push_back(runner >= 0 && CrossesRanks(t) ? messages_++ : -1);
    for (int p : t.sources) ++readers_[static_cast<size_t>(p)];
    for (const Operand& op : t.inputs)
      for (int p : op.pieces) ++readers_[static_cast<size_t>(p)];
    if (t.kind != TaskKind::kCompute) continue;
    const Node& n = tasks_.graph.node(t.node);
    std::vector<TensorType> in, out;
    for (size_t i = 0; i < n.inputs.size(); ++i) in.push_back({t.inputs[i].region.shape(), tasks_.graph.type(n.inputs[i]).dtype});
    for (int p : t.outputs) {
      const Piece& piece = tasks_.pieces[static_cast<size_t>(p)];
      out.push_back({piece.region.shape(), tasks_.graph.type(piece.value).dtype});
    }
    LOOM_RETURN_IF_ERROR(registry.SupportsNode(n, in, out, kind).WithContext(StrCat("task ", t.name, " on ",
                                                                                     devices_[static_cast<size_t>(t.device)].ToString())));
    kernels_[static_cast<size_t>(t.id)] = registry.FindKernel(n.op, kind);
  }
  add_kernel_ = registry.FindKernel("Add", kind);
  cast_kernel_ = registry.FindKernel("Cast", kind);
  if (!add_kernel_ || !cast_kernel_) return Internal("no Add or Cast kernel for the all-reduces on ", devices_[0].ToString());
  work_.resize(static_cast<size_t>(devices));
  for (size_t d : local_devices_) {
    const int markers = static_cast<int>(queues_[d].size());
    LOOM_ASSIGN_OR_RETURN(work_[d], options_.make_queue ? options_.make_queue(static_cast<int64_t>(d), markers)
                                                        : CreateWorkQueue(devices_[d], markers));
  }
  for (const auto& [home, op] : tasks_.writebacks)
    for (int p : op.pieces) ++readers_[static_cast<size_t>(p)];
  for (const auto& [name, op] : tasks_.outputs)
    for (int p : op.pieces) ++readers_[static_cast<size_t>(p)];

  // The pieces' places in one arena per local device (runtime/task_memory_plan.h).
  std::vector<bool> local(static_cast<size_t>(devices));
  for (int64_t d = 0; d < devices; ++d) local[static_cast<size_t>(d)] = Local(d);
  memory_plan_ = PlanTaskMemory(tasks_, runner_, local);
  arenas_.resize(static_cast<size_t>(devices));
  for (int64_t d = 0; d < devices; ++d) {
    const size_t bytes = memory_plan_.arena_bytes[static_cast<size_t>(d)];
    if (bytes == 0) continue;
    arenas_[static_cast<size_t>(d)] = std::make_shared<Buffer>(AllocatorOf(d), bytes);
    if (!arenas_[static_cast<size_t>(d)]->data())
      return ResourceExhausted("cannot allocate device ", d, "'s ", bytes, "-byte arena of the step's pieces");
  }

  pieces_.assign(tasks_.pieces.size(), Tensor());
  for (const Node& n : tasks_.graph.nodes()) {
    if (!IsStateOp(n.op)) continue;
    const ValueId v = n.outputs[0];
    state_values_[n.name] = v;
    for (int h : tasks_.homes[v]) {
      if (!Local(tasks_.pieces[static_cast<size_t>(h)].device)) continue;
      LOOM_ASSIGN_OR_RETURN(pieces_[static_cast<size_t>(h)],
                            Tensor::Empty(tasks_.pieces[static_cast<size_t>(h)].region.shape(), tasks_.graph.type(v).dtype,
                                          AllocatorOf(tasks_.pieces[static_cast<size_t>(h)].device)));
    }
  }
  return Status::Ok();
}

Status TaskRuntime::InitializeState(uint64_t seed) {
  for (const auto& [name, v] : state_values_) {
    Tensor whole = Tensor::Zeros(tasks_.graph.type(v).shape, tasks_.graph.type(v).dtype);
    LOOM_RETURN_IF_ERROR(InitializeStateTensor(tasks_.graph.node(tasks_.graph.value(v).producer), &whole, seed));
    LOOM_RETURN_IF_ERROR(SetState(name, whole));
  }
  return Status::Ok();
}

std::vector<std::string> TaskRuntime::StateNames() const {
  std::vector<std::string> names;
  for (const auto& [name, v] : state_values_) names.push_back(name);
  return names;
}

StatusOr<Tensor> TaskRuntime::GetState(const std::string& name) const {
  auto it = state_values_.find(name);
  if (it == state_values_.end()) return NotFound("no parameter or buffer named '", name, "'");
  const TensorType& t = tasks_.graph.type(it->second);
  Tensor whole = Tensor::Zeros(t.shape, t.dtype);
  const Region all = Region::Whole(t.shape);
  std::vector<Region> seen;
  for (int h : tasks_.homes.at(it->second)) {
    const Region& r = tasks_.pieces[static_cast<size_t>(h)].region;
    if (std::find(seen.begin(), seen.end(), r) != seen.end()) continue;
    seen.push_back(r);
    LOOM_ASSIGN_OR_RETURN(Tensor piece, PieceEverywhere(h));
    if (!piece.device().is_cpu()) {
      LOOM_ASSIGN_OR_RETURN(piece, piece.To(Device::Cpu()));
    }
    LOOM_RETURN_IF_ERROR(CopyRegion(piece, r, &whole, all, r));
  }
  return whole;
}

StatusOr<Tensor> TaskRuntime::PieceEverywhere(int p) const {
  const Piece& piece = tasks_.pieces[static_cast<size_t>(p)];
  if (comm_ == nullptr) return pieces_[static_cast<size_t>(p)];
  Tensor t = pieces_[static_cast<size_t>(p)];
  if (!Local(piece.device)) {
    LOOM_ASSIGN_OR_RETURN(Allocator * host, GetAllocator(Device::Cpu()));
    LOOM_ASSIGN_OR_RETURN(t, Tensor::Empty(piece.region.shape(), tasks_.graph.type(piece.value).dtype, host));
  } else if (!t.device().is_cpu()) {
    LOOM_ASSIGN_OR_RETURN(t, t.To(Device::Cpu()));
  }
  LOOM_RETURN_IF_ERROR(comm_->Broadcast(t, Owner(piece.device)));
  return t;
}

Status TaskRuntime::SetState(const std::string& name, const Tensor& value) {
  auto it = state_values_.find(name);
  if (it == state_values_.end()) return NotFound("no parameter or buffer named '", name, "'");
  const TensorType& t = tasks_.graph.type(it->second);
  if (value.shape() != t.shape || value.dtype() != t.dtype)
    return InvalidArgument("state '", name, "' is ", t.ToString(), ", got ", value.shape().ToString(), " ",
                           DTypeName(value.dtype()));
  LOOM_ASSIGN_OR_RETURN(Tensor host, value.To(Device::Cpu()));
  const Region all = Region::Whole(t.shape);
  for (int h : tasks_.homes.at(it->second)) {
    const Piece& home = tasks_.pieces[static_cast<size_t>(h)];
    if (!Local(home.device)) continue;
    // A new tensor, not the old one overwritten: the old may be shared (Run).
    LOOM_ASSIGN_OR_RETURN(pieces_[static_cast<size_t>(h)], PartOn(host, all, home.region, home.device));
  }
  return Status::Ok();
}

StatusOr<Tensor> TaskRuntime::PartOn(const Tensor& whole, const Region& all, const Region& region, int64_t d) const {
  // Cut on the host (a CPU device's own memory), then moved to a GPU.
  const Device device = devices_[static_cast<size_t>(d)];
  LOOM_ASSIGN_OR_RETURN(Allocator * host, device.is_cpu() ? AllocatorOf(d) : GetAllocator(Device::Cpu()));
  LOOM_ASSIGN_OR_RETURN(Tensor part, Tensor::Empty(region.shape(), whole.dtype(), host));
  LOOM_RETURN_IF_ERROR(CopyRegion(whole, all, &part, region, region));
  if (device.is_cpu()) return part;
  return part.To(device);
}

StatusOr<Tensor> TaskRuntime::PieceTensor(int p) const {
  const Piece& piece = tasks_.pieces[static_cast<size_t>(p)];
  const DType dtype = tasks_.graph.type(piece.value).dtype;
  const int64_t offset = memory_plan_.offset[static_cast<size_t>(p)];
  if (offset == TaskMemoryPlan::kUnplanned) return Tensor::Empty(piece.region.shape(), dtype, AllocatorOf(piece.device));
  return Tensor::View(arenas_[static_cast<size_t>(piece.device)], static_cast<size_t>(offset), piece.region.shape(),
                      dtype);
}

StatusOr<Tensor> TaskRuntime::Assemble(const Operand& op, Allocator* allocator, WorkQueue& queue) const {
  if (op.pieces.size() == 1 && Region::Whole(tasks_.graph.type(op.value).shape).Contains(op.region)) {
    const Piece& p = tasks_.pieces[static_cast<size_t>(op.pieces[0])];
    const Tensor& t = pieces_[static_cast<size_t>(op.pieces[0])];
    if (p.region == op.region) return t;
    LOOM_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(op.region.shape(), t.dtype(), allocator));
    LOOM_RETURN_IF_ERROR(CopyRegionOn(queue, t, p.region, &out, op.region, op.region));
    return out;
  }
  LOOM_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(op.region.shape(), tasks_.graph.type(op.value).dtype, allocator));
  // Zeros where no piece lies: the padding rows of a window part.
  if (!Region::Whole(tasks_.graph.type(op.value).shape).Contains(op.region))
    LOOM_RETURN_IF_ERROR(queue.Run([&queue, out]() { return queue.Zero(out.raw_data(), out.nbytes()); }));
  for (int q : op.pieces) {
    const Piece& p = tasks_.pieces[static_cast<size_t>(q)];
    std::optional<Region> box = p.region.Intersect(op.region);
    if (box) LOOM_RETURN_IF_ERROR(CopyRegionOn(queue, pieces_[static_cast<size_t>(q)], p.region, &out, op.region, *box));
  }
  return out;
}

Status TaskRuntime::RunTask(const Task& task, int64_t runner) {
  WorkQueue& queue = *work_[static_cast<size_t>(runner)];
  // A dependency on this queue is ahead in its order; one on another queue
  // is waited for by marker (on a GPU the host has only queued it).
  for (int d : task.deps) {
    const int64_t r = runner_[static_cast<size_t>(d)];
    if (r >= 0 && r != runner)
      LOOM_RETURN_IF_ERROR(queue.WaitFor(*work_[static_cast<size_t>(r)], marker_[static_cast<size_t>(d)]));
  }
  LOOM_RETURN_IF_ERROR(QueueTask(task, queue, pools_[static_cast<size_t>(runner)].get()));
  return queue.Mark(marker_[static_cast<size_t>(task.id)]);
}

Status TaskRuntime::QueueTask(const Task& task, WorkQueue& queue, ThreadPool* pool) {
  switch (task.kind) {
    case TaskKind::kTransfer: {
      if (Owner(task.src_device) != Owner(task.device)) return RunRemoteTransfer(task, queue);
      const Piece& src = tasks_.pieces[static_cast<size_t>(task.sources[0])];
      const Piece& dst = tasks_.pieces[static_cast<size_t>(task.outputs[0])];
      LOOM_ASSIGN_OR_RETURN(Tensor out, PieceTensor(task.outputs[0]));
      LOOM_RETURN_IF_ERROR(CopyRegionOn(queue, pieces_[static_cast<size_t>(task.sources[0])], src.region, &out,
                                        dst.region, dst.region));
      pieces_[static_cast<size_t>(task.outputs[0])] = out;
      return Status::Ok();
    }
    case TaskKind::kAllReduce:
    case TaskKind::kReduceScatter: return RunAllReduce(task, queue, pool);
    case TaskKind::kAllGather:
    case TaskKind::kAllToAll: return RunRedistribute(task, queue);
    case TaskKind::kCompute: break;
  }
  // The kernel's call, with the tensors it uses, as the queue's work.
  struct Call {
    std::vector<Tensor> inputs, outputs;
    KernelContext ctx;
  };
  auto call = std::make_shared<Call>();
  for (const Operand& op : task.inputs) {
    LOOM_ASSIGN_OR_RETURN(Tensor t, Assemble(op, AllocatorOf(task.device), queue));
    call->inputs.push_back(std::move(t));
  }
  for (int p : task.outputs) {
    LOOM_ASSIGN_OR_RETURN(Tensor t, PieceTensor(p));
    call->outputs.push_back(std::move(t));
  }
  KernelContext& ctx = call->ctx;
  ctx.node = &tasks_.graph.node(task.node);
  ctx.attrs = task.attrs.get();
  ctx.device = devices_[static_cast<size_t>(task.device)];
  ctx.pool = pool;
  ctx.stream = queue.stream();
  for (const Tensor& t : call->inputs) ctx.inputs.push_back(&t);
  for (Tensor& t : call->outputs) ctx.outputs.push_back(&t);
  ctx.rng_key = NodeStreamKey(ctx.node->name);
  ctx.step = static_cast<uint64_t>(step_);
  for (size_t i = 0; i < call->outputs.size(); ++i) pieces_[static_cast<size_t>(task.outputs[i])] = call->outputs[i];
  return queue.Run([call, kernel = kernels_[static_cast<size_t>(task.id)], seed = options_.seed]() {
    Rng rng = call->ctx.StreamFor(seed);
    call->ctx.rng = &rng;
    AttrTypeErrors attr_errors;
    Status s = (*kernel)(call->ctx);
    if (s.ok() && !attr_errors.first().empty()) s = InvalidArgument(attr_errors.first());
    return s;
  });
}

Status TaskRuntime::RunHelper(const KernelFn* kernel, const Node& node, std::vector<Tensor> inputs, Tensor output,
                              WorkQueue& queue, ThreadPool* pool) const {
  return queue.Run([kernel, &node, inputs = std::move(inputs), output, stream = queue.stream(), pool]() mutable {
    KernelContext ctx;
    ctx.node = &node;
    ctx.attrs = &node.attrs;
    ctx.device = output.device();
    ctx.pool = pool;
    ctx.stream = stream;
    for (const Tensor& t : inputs) ctx.inputs.push_back(&t);
    ctx.outputs = {&output};
    return (*kernel)(ctx);
  });
}

// A transfer between processes: the source's rank sends the destination's
// region of its piece, the destination's rank receives it.
Status TaskRuntime::RunRemoteTransfer(const Task& task, WorkQueue& queue) {
  const int src_piece = task.sources[0], dst_piece = task.outputs[0];
  const Piece& src = tasks_.pieces[static_cast<size_t>(src_piece)];
  const Piece& dst = tasks_.pieces[static_cast<size_t>(dst_piece)];
  if (Local(task.src_device)) {
    LOOM_ASSIGN_OR_RETURN(Tensor region, Tensor::Empty(dst.region.shape(), tasks_.graph.type(dst.value).dtype,
                                                       AllocatorOf(task.src_device)));
    LOOM_RETURN_IF_ERROR(CopyRegionOn(queue, pieces_[static_cast<size_t>(src_piece)], src.region, &region, dst.region,
                                      dst.region));
    return SendAfter(queue, region, Owner(task.device));
  }
  LOOM_ASSIGN_OR_RETURN(Tensor region, PieceTensor(dst_piece));
  LOOM_RETURN_IF_ERROR(ReceiveInto(queue, &region, Owner(task.src_device)));
  pieces_[static_cast<size_t>(dst_piece)] = region;
  return Status::Ok();
}

Status TaskRuntime::SendAfter(WorkQueue& queue, const Tensor& t, int rank) const {
  if (!queue.done_when_queued()) LOOM_RETURN_IF_ERROR(queue.Synchronize());
  if (t.device().is_cpu()) return comm_->Send(t, rank);
  LOOM_ASSIGN_OR_RETURN(Tensor host, t.To(Device::Cpu()));
  return comm_->Send(host, rank);
}

Status TaskRuntime::ReceiveInto(WorkQueue& queue, Tensor* dst, int rank) const {
  if (queue.done_when_queued() && dst->device().is_cpu()) return comm_->Recv(*dst, rank);
  LOOM_ASSIGN_OR_RETURN(Allocator * host, GetAllocator(Device::Cpu()));
  LOOM_ASSIGN_OR_RETURN(Tensor received, Tensor::Empty(dst->shape(), dst->dtype(), host));
  LOOM_RETURN_IF_ERROR(comm_->Recv(received, rank));
  const Region whole = Region::Whole(dst->shape());
  return CopyRegionOn(queue, received, whole, dst, whole, whole);
}

// The partial sums added in the group's order on the task's device (the
// first member), which then hands each member its copy (a reduce-scatter:
// its part). Across processes the first member receives the sums other
// ranks hold and sends them their copies; the order of the additions, and
// so the bits, stay the same. A one-device group adds the output's region
// of each source (some hold more: the device's own partial sum).
Status TaskRuntime::RunAllReduce(const Task& task, WorkQueue& queue, ThreadPool* pool) {
  const auto device_of = [&](int p) { return tasks_.pieces[static_cast<size_t>(p)].device; };
  const Piece& first = tasks_.pieces[static_cast<size_t>(task.outputs[0])];
  const DType dtype = tasks_.graph.type(first.value).dtype;
  if (!Local(task.device)) return JoinCollective(task, queue);
  const Region& summed = SummedRegion(task);
  Allocator* here = AllocatorOf(task.device);
  // Source k (its part in the summed region) on the task's device: copied
  // when it holds more or lives on another GPU, received when another rank
  // holds it.
  const auto source = [&](size_t k) -> StatusOr<Tensor> {
    const int p = task.sources[k];
    const Region& held = tasks_.pieces[static_cast<size_t>(p)].region;
    const Tensor& piece = pieces_[static_cast<size_t>(p)];
    if (Local(device_of(p)) && held == summed && piece.device() == devices_[static_cast<size_t>(task.device)])
      return piece;
    LOOM_ASSIGN_OR_RETURN(Tensor part, Tensor::Empty(summed.shape(), dtype, here));
    if (Local(device_of(p))) {
      LOOM_RETURN_IF_ERROR(CopyRegionOn(queue, piece, held, &part, summed, summed));
    } else {
      LOOM_RETURN_IF_ERROR(ReceiveInto(queue, &part, Owner(device_of(p))));
    }
    return part;
  };
  // bf16 and f16 partial sums add in f32 and round once at the end. The
  // helpers' nodes outlive the work that names them.
  const auto helper = [](const char* op, std::optional<DType> to) {
    Node n;
    n.name = StrCat("all-reduce ", op);
    n.op = op;
    if (to) n.attrs.Set("to", std::string(DTypeName(*to)));
    return n;
  };
  static const Node add = helper("Add", std::nullopt), to_f32 = helper("Cast", DType::kF32),
                    to_bf16 = helper("Cast", DType::kBF16), to_f16 = helper("Cast", DType::kF16);
  const DType add_dtype = IsHalf(dtype) ? DType::kF32 : dtype;
  const Node& widen = to_f32;
  const Node& narrow = dtype == DType::kBF16 ? to_bf16 : to_f16;
  LOOM_ASSIGN_OR_RETURN(Tensor sum, Tensor::Empty(summed.shape(), add_dtype, here));
  for (size_t k = 0; k < task.sources.size(); ++k) {
    LOOM_ASSIGN_OR_RETURN(Tensor xk, source(k));
    if (k == 0 && add_dtype == dtype) {
      const Region whole = Region::Whole(summed.shape());
      LOOM_RETURN_IF_ERROR(CopyRegionOn(queue, xk, whole, &sum, whole, whole));
      continue;
    }
    if (add_dtype != dtype) {
      LOOM_ASSIGN_OR_RETURN(Tensor wide, Tensor::Empty(summed.shape(), add_dtype, here));
      LOOM_RETURN_IF_ERROR(RunHelper(cast_kernel_, widen, {xk}, k == 0 ? sum : wide, queue, pool));
      if (k == 0) continue;
      xk = wide;
    }
    LOOM_RETURN_IF_ERROR(RunHelper(add_kernel_, add, {sum, xk}, sum, queue, pool));
  }
  if (add_dtype != dtype) {
    LOOM_ASSIGN_OR_RETURN(Tensor rounded, Tensor::Empty(summed.shape(), dtype, here));
    LOOM_RETURN_IF_ERROR(RunHelper(cast_kernel_, narrow, {sum}, rounded, queue, pool));
    sum = rounded;
  }
  return HandOut(task, queue, {sum}, {&summed});
}

// An all-gather or all-to-all: the sources on the task's device (the first
// member; received when another rank holds them), each output assembled
// there from the sources it meets and handed to its member.
Status TaskRuntime::RunRedistribute(const Task& task, WorkQueue& queue) {
  if (!Local(task.device)) return JoinCollective(task, queue);
  std::vector<Tensor> held;
  std::vector<const Region*> regions;
  for (int p : task.sources) {
    const Piece& source = tasks_.pieces[static_cast<size_t>(p)];
    regions.push_back(&source.region);
    if (Local(source.device)) {
      held.push_back(pieces_[static_cast<size_t>(p)]);
      continue;
    }
    LOOM_ASSIGN_OR_RETURN(Tensor received, Tensor::Empty(source.region.shape(), tasks_.graph.type(source.value).dtype,
                                                         AllocatorOf(task.device)));
    LOOM_RETURN_IF_ERROR(ReceiveInto(queue, &received, Owner(source.device)));
    held.push_back(std::move(received));
  }
  return HandOut(task, queue, held, regions);
}

// What a sum adds of each source: the sources' region for a reduce-scatter,
// the outputs' for an all-reduce (a source may hold more).
const Region& TaskRuntime::SummedRegion(const Task& task) const {
  const int p = task.kind == TaskKind::kReduceScatter ? task.sources[0] : task.outputs[0];
  return tasks_.pieces[static_cast<size_t>(p)].region;
}

// A collective's part on a rank that does not hold its first member: sends
// this rank's sources to the first member's rank (a sum's sources cut to
// what it adds), receives its outputs.
Status TaskRuntime::JoinCollective(const Task& task, WorkQueue& queue) {
  const int root = Owner(task.device);
  const bool sums = task.kind == TaskKind::kAllReduce || task.kind == TaskKind::kReduceScatter;
  for (int p : task.sources) {
    const Piece& held = tasks_.pieces[static_cast<size_t>(p)];
    if (!Local(held.device)) continue;
    const Tensor& source = pieces_[static_cast<size_t>(p)];
    if (!sums || held.region == SummedRegion(task)) {
      LOOM_RETURN_IF_ERROR(SendAfter(queue, source, root));
      continue;
    }
    const Region& summed = SummedRegion(task);
    LOOM_ASSIGN_OR_RETURN(Tensor part, Tensor::Empty(summed.shape(), source.dtype(), AllocatorOf(held.device)));
    LOOM_RETURN_IF_ERROR(CopyRegionOn(queue, source, held.region, &part, summed, summed));
    LOOM_RETURN_IF_ERROR(SendAfter(queue, part, root));
  }
  for (int p : task.outputs) {
    if (!Local(tasks_.pieces[static_cast<size_t>(p)].device)) continue;
    LOOM_ASSIGN_OR_RETURN(Tensor copy, PieceTensor(p));
    LOOM_RETURN_IF_ERROR(ReceiveInto(queue, &copy, root));
    pieces_[static_cast<size_t>(p)] = copy;
  }
  return Status::Ok();
}

// A collective's outputs, made on its first member from `results` (each
// holding its region of the value): each output assembled from the results
// it meets, kept on this rank or sent to its member's.
Status TaskRuntime::HandOut(const Task& task, WorkQueue& queue, const std::vector<Tensor>& results,
                            const std::vector<const Region*>& regions) {
  for (int p : task.outputs) {
    const Piece& out = tasks_.pieces[static_cast<size_t>(p)];
    if (!Local(out.device) && results.size() == 1 && out.region == *regions[0]) {  // sent as it is
      LOOM_RETURN_IF_ERROR(SendAfter(queue, results[0], Owner(out.device)));
      continue;
    }
    Tensor assembled;
    if (Local(out.device)) {
      LOOM_ASSIGN_OR_RETURN(assembled, PieceTensor(p));
    } else {
      LOOM_ASSIGN_OR_RETURN(assembled, Tensor::Empty(out.region.shape(), tasks_.graph.type(out.value).dtype,
                                                     AllocatorOf(task.device)));
    }
    for (size_t k = 0; k < results.size(); ++k)
      if (std::optional<Region> box = regions[k]->Intersect(out.region))
        LOOM_RETURN_IF_ERROR(CopyRegionOn(queue, results[k], *regions[k], &assembled, out.region, *box));
    if (Local(out.device)) {
      pieces_[static_cast<size_t>(p)] = assembled;
    } else {
      LOOM_RETURN_IF_ERROR(SendAfter(queue, assembled, Owner(out.device)));
    }
  }
  return Status::Ok();
}

StatusOr<std::map<std::string, Tensor>> TaskRuntime::Run(const std::map<std::string, Tensor>& feeds) {
  size_t fed = 0;
  for (const Node& n : tasks_.graph.nodes()) {
    if (n.op != kInputOp) continue;
    auto it = feeds.find(n.name);
    if (it == feeds.end()) return InvalidArgument("input '", n.name, "' was not fed");
    const TensorType& want = tasks_.graph.type(n.outputs[0]);
    if (it->second.shape() != want.shape || it->second.dtype() != want.dtype)
      return InvalidArgument("input '", n.name, "' expects ", want.ToString(), ", got ", it->second.shape().ToString(),
                             " ", DTypeName(it->second.dtype()));
    ++fed;
    LOOM_ASSIGN_OR_RETURN(Tensor host, it->second.To(Device::Cpu()));
    const Region all = Region::Whole(want.shape);
    auto homes = tasks_.homes.find(n.outputs[0]);
    if (homes == tasks_.homes.end()) continue;
    for (int h : homes->second) {
      if (!Local(tasks_.pieces[static_cast<size_t>(h)].device)) continue;
      const Region& r = tasks_.pieces[static_cast<size_t>(h)].region;
      const int64_t d = tasks_.pieces[static_cast<size_t>(h)].device;
      if (r == all && devices_[static_cast<size_t>(d)].is_cpu()) {
        pieces_[static_cast<size_t>(h)] = host;
        continue;
      }
      LOOM_ASSIGN_OR_RETURN(pieces_[static_cast<size_t>(h)], PartOn(host, all, r, d));
    }
  }
  if (fed != feeds.size())
    for (const auto& [name, t] : feeds) {
      auto id = tasks_.graph.FindNode(name);
      if (!id || tasks_.graph.node(*id).op != kInputOp) return InvalidArgument("feed '", name, "' is not an input of the graph");
    }

  StepState st(tasks_.tasks.size(), tasks_.pieces.size());
  for (size_t p = 0; p < readers_.size(); ++p) st.readers[p].store(readers_[p]);
  if (options_.trace) trace_.assign(tasks_.tasks.size(), TaskSpan{});
  st.start = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - st.start).count();
  };
  const auto fail = [&](const Status& s, const std::string& where) {
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.failed) return;
    st.failed = true;
    st.error = s.WithContext(where);
  };
  auto worker = [&](size_t device) {
    WorkQueue& queue = *work_[device];
    if (Status bound = queue.BindThread(); !bound.ok()) fail(bound, StrCat("device ", device));
    for (int id : queues_[device]) {
      const Task& task = tasks_.tasks[static_cast<size_t>(id)];
      {
        std::unique_lock<std::mutex> lock(st.mu);
        // Processes: a dependency another rank runs arrives by message, and
        // this rank's messages go in the graph's order (so each pair of
        // ranks sends and receives in the same order, whichever device
        // thread gets there first).
        const int64_t turn = message_turn_[static_cast<size_t>(id)];
        st.cv.wait(lock, [&] {
          if (st.failed) return true;
          if (turn >= 0 && turn != st.next_message) return false;
          for (int d : task.deps)
            if (runs_here_[static_cast<size_t>(d)] && !st.done[static_cast<size_t>(d)]) return false;
          return true;
        });
        if (st.failed) break;
      }
      const double start = options_.trace ? seconds() : 0;
      Status s = RunTask(task, static_cast<int64_t>(device));
      // A trace times the work, not its queueing: wait for it.
      if (options_.trace && s.ok()) s = queue.Synchronize();
      if (options_.trace) trace_[static_cast<size_t>(id)] = {id, start, seconds()};
      if (s.ok()) Release(task);
      if (!s.ok())
        fail(s, StrCat("task ", task.id, " (", TaskKindName(task.kind), " ", task.name, ") on device ", task.device));
      {
        std::lock_guard<std::mutex> lock(st.mu);
        st.done[static_cast<size_t>(id)] = 1;
        if (message_turn_[static_cast<size_t>(id)] >= 0) ++st.next_message;
      }
      st.cv.notify_all();
    }
    // On a GPU the work was only queued: the step ends when it is done (a
    // kernel's fault shows here), and no piece may be freed before.
    if (Status done = queue.Synchronize(); !done.ok())
      fail(done, StrCat("device ", device, " (", devices_[device].ToString(), ")"));
    queue.UnbindThread();
    st.cv.notify_all();
  };
  // Readers count down in Release; a piece whose last reader ran is freed.
  step_state_ = &st;
  threads_->Run([&](size_t k) { worker(local_devices_[k]); });  // a thread per local device
  step_state_ = nullptr;
  if (st.failed) {
    for (size_t p = 0; p < pieces_.size(); ++p)
      if (tasks_.pieces[p].producer >= 0) pieces_[p] = Tensor();
    if (comm_) comm_->Abort(st.error);  // the other ranks fail too instead of waiting for this one
    return st.error;
  }

  // After the step: outputs and writebacks assembled through the first
  // local device's queue (every device is idle now), then waited for; this
  // thread's blocks are that queue's meanwhile.
  WorkQueue& after = *work_[local_devices_[0]];
  LOOM_RETURN_IF_ERROR(after.BindThread());
  struct Unbind {
    WorkQueue& q;
    ~Unbind() { q.UnbindThread(); }
  } unbind{after};
  std::map<std::string, Tensor> results;
  LOOM_ASSIGN_OR_RETURN(Allocator * host, GetAllocator(Device::Cpu()));  // what the caller keeps
  for (const auto& [name, op] : tasks_.outputs) {
    if (comm_ == nullptr) {
      LOOM_ASSIGN_OR_RETURN(results[name], Assemble(op, host, after));
      continue;
    }
    // Every rank gets every output: assembled from its pieces broadcast to
    // the host, then the pieces are put back (a home, or a piece that a
    // writeback reads, stays the device's own tensor).
    std::vector<std::pair<int, Tensor>> own;
    for (int p : op.pieces) {
      own.emplace_back(p, pieces_[static_cast<size_t>(p)]);
      LOOM_ASSIGN_OR_RETURN(pieces_[static_cast<size_t>(p)], PieceEverywhere(p));
    }
    StatusOr<Tensor> assembled = Assemble(op, host, after);
    for (auto it = own.rbegin(); it != own.rend(); ++it) pieces_[static_cast<size_t>(it->first)] = it->second;
    LOOM_ASSIGN_OR_RETURN(results[name], std::move(assembled));
  }
  // Every reader of the old state has run: the new values become the homes.
  // A home takes the new value's tensor itself (no copy: data parallelism
  // would copy every parameter and optimizer slot on every device each
  // step); no home is ever written in place, so tensors a home shares with
  // a result or another home stay as they are.
  std::vector<Tensor> fresh;
  std::vector<int> refreshed;
  for (const auto& [home, op] : tasks_.writebacks) {
    if (!Local(tasks_.pieces[static_cast<size_t>(home)].device)) continue;
    LOOM_ASSIGN_OR_RETURN(Tensor t, Assemble(op, AllocatorOf(tasks_.pieces[static_cast<size_t>(home)].device), after));
    fresh.push_back(std::move(t));
    refreshed.push_back(home);
  }
  LOOM_RETURN_IF_ERROR(after.Synchronize());
  for (const auto& [name, op] : tasks_.outputs) {
    // A piece that is the result itself: a device's (copied to the host),
    // or a home, a state's or the caller's own feed, which the caller may
    // change (so the caller gets a copy).
    Tensor& result = results[name];
    const bool home = op.pieces.size() == 1 && tasks_.pieces[static_cast<size_t>(op.pieces[0])].producer < 0;
    if (!result.device().is_cpu() || home) {
      LOOM_ASSIGN_OR_RETURN(result, result.To(Device::Cpu()));
    }
  }
  for (size_t i = 0; i < fresh.size(); ++i) pieces_[static_cast<size_t>(refreshed[i])] = std::move(fresh[i]);
  for (size_t p = 0; p < pieces_.size(); ++p)
    if (tasks_.pieces[p].producer >= 0) pieces_[p] = Tensor();
  // Blocks freed while each device thread was bound to its queue may now
  // go to any queue (on a GPU: after every stream is done); once per GPU.
  for (size_t k = 0; k < local_devices_.size(); ++k) {
    const size_t d = local_devices_[k];
    const auto same_gpu = [&](size_t e) { return devices_[e] == devices_[d]; };
    if (std::none_of(local_devices_.begin(), local_devices_.begin() + static_cast<std::ptrdiff_t>(k), same_gpu))
      LOOM_RETURN_IF_ERROR(work_[d]->AllIdle());
  }
  ++step_;
  return results;
}

void TaskRuntime::Release(const Task& task) {
  auto release = [&](int p) {
    if (tasks_.pieces[static_cast<size_t>(p)].producer < 0) return;  // homes stay
    if (step_state_->readers[static_cast<size_t>(p)].fetch_sub(1) == 1) pieces_[static_cast<size_t>(p)] = Tensor();
  };
  for (int p : task.sources) release(p);
  for (const Operand& op : task.inputs)
    for (int p : op.pieces) release(p);
}

std::string TaskRuntime::TraceJson() const {
  ChromeTrace trace;
  AppendTrace(trace, 0, 0);
  return trace.Json();
}

double TaskRuntime::AppendTrace(ChromeTrace& trace, int64_t group, double offset_s) const {
  // Rows: devices 0..N-1, then one per link (src, dst) that carried a transfer.
  std::map<std::pair<int64_t, int64_t>, int64_t> links;
  for (const Task& t : tasks_.tasks)
    if (t.kind == TaskKind::kTransfer) links.emplace(std::make_pair(t.src_device, t.device), 0);
  int64_t row = tasks_.devices;
  for (auto& [link, id] : links) id = row++;
  for (int64_t d = 0; d < tasks_.devices; ++d) trace.NameRow(d, StrCat("device ", d), group);
  for (const auto& [link, id] : links) trace.NameRow(id, StrCat("link ", link.first, "->", link.second), group);
  double end = offset_s;
  for (size_t i = 0; i < trace_.size(); ++i) {
    if (!runs_here_[i]) continue;  // another rank's: no span here
    const TaskSpan& span = trace_[i];
    const Task& t = tasks_.tasks[static_cast<size_t>(span.task)];
    const int64_t tid = t.kind == TaskKind::kTransfer ? links.at({t.src_device, t.device}) : t.device;
    trace.Span(tid, t.name, TaskKindName(t.kind), offset_s + span.start, offset_s + span.end, group);
    end = std::max(end, offset_s + span.end);
  }
  return end;
}

}  // namespace loom
