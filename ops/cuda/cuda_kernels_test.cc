// The CUDA backend against the CPU: allocator, copies, and every CUDA kernel
// through the op harness (which compares CUDA with CPU when a GPU exists).
// Without a GPU, the registrations and the clean failure of GetAllocator are
// checked and the rest is skipped; LOOM_REQUIRE_CUDA=1 turns a missing GPU
// into a failure (tools/gpu_check.sh sets it on the GPU machine).
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "core/cuda/cuda_device.h"
#include "core/logging.h"
#include "core/rng.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "ops/cuda/cuda_kernel_util.h"
#include "ops/cuda/cublas_gemm.h"
#include "ops/op.h"
#include "runtime/executor.h"
#include "tests/op_harness.h"
#include "tests/reference_ops.h"

namespace loom::testing {
namespace {

bool CudaRequired() {
  const char* v = std::getenv("LOOM_REQUIRE_CUDA");
  return v != nullptr && std::string(v) == "1";
}

// Whether cuda:0 can be used; says once why not.
bool CudaPresent() {
  static const bool present = [] {
    StatusOr<Allocator*> allocator = GetAllocator(Device::Cuda(0));
    if (allocator.ok()) return true;
    LOOM_LOG_WARN("no GPU: CUDA tests skipped ({}; {})", allocator.status().ToString(), cuda::ProbeDevice(0).message());
    return false;
  }();
  return present;
}

// True when the GPU checks of a test should run; fails the test instead of
// skipping when LOOM_REQUIRE_CUDA=1.
bool RunGpuChecks() {
  if (CudaPresent()) return true;
  if (CudaRequired()) FAIL("LOOM_REQUIRE_CUDA=1 but cuda:0 is unusable: " << cuda::ProbeDevice(0).ToString());
  return false;
}

// ---- references (f64, host) ----

// Offset into `in` (right-aligned, numpy broadcasting) of flat index `flat` of `out`.
std::vector<Tensor> SumToRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  Shape target(attrs.Ints("shape"));
  Tensor y = ZerosF64(target);
  for (int64_t i = 0; i < in[0].numel(); ++i) At(y, BroadcastOffset(target, in[0].shape(), i)) += At(in[0], i);
  return {y};
}

std::vector<Tensor> BroadcastToRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  Shape target(attrs.Ints("shape"));
  Tensor y = ZerosF64(target);
  for (int64_t i = 0; i < y.numel(); ++i) At(y, i) = At(in[0], BroadcastOffset(in[0].shape(), target, i));
  return {y};
}

std::vector<Tensor> FillRef(const std::vector<Tensor>&, const AttrMap& attrs, const std::vector<Tensor>&) {
  Tensor y = ZerosF64(Shape(attrs.Ints("shape")));
  y.Fill(attrs.Float("value"));
  return {y};
}

// Runs the harness's forward checks (f64 and f32 against the reference) and
// its CUDA-vs-CPU comparison. Gradients are device-independent (autodiff
// emits ops whose CUDA kernels are checked here on their own), and the op
// families' tests check them against finite differences.
void RunCudaCase(OpCase c) {
  c.check_gradient = false;
  RunOpCase(c);
}

// ---- running graphs directly (f64 CUDA checks, the training step) ----

Tensor RandomTensor(const Shape& shape, DType dtype, uint64_t seed, double lo = -1, double hi = 1) {
  Rng rng(seed);
  Tensor t = Tensor::Zeros(shape, DType::kF64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = rng.Uniform(lo, hi);
  return t.Cast(dtype).value();
}

std::map<std::string, Tensor> RunGraph(const Graph& graph, Device device, const std::map<std::string, Tensor>& feeds) {
  ExecutorOptions options;
  options.device = device;
  auto exec = Executor::Create(graph, options);
  INFO("creating the executor on " << device.ToString());
  REQUIRE(exec.status().ToString() == "OK");
  auto out = (*exec)->Run(feeds);
  INFO("running on " << device.ToString());
  REQUIRE(out.status().ToString() == "OK");
  return *out;
}

void ExpectClose(const std::string& what, const Tensor& expected, const Tensor& actual, double tolerance) {
  INFO(what);
  REQUIRE(expected.shape() == actual.shape());
  REQUIRE(actual.device().is_cpu());
  int bad = 0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    const double e = expected.ScalarAt(i), a = actual.ScalarAt(i);
    if (std::abs(e - a) > tolerance * std::max(1.0, std::abs(e)) && bad++ < 3) {
      INFO("element " << i << ": expected " << e << ", got " << a);
      CHECK(false);
    }
  }
  CHECK(bad == 0);
}

// One op on f64 inputs, CUDA vs CPU (the harness compares f32 only).
void CheckF64AgainstCpu(const std::string& name, const std::string& op, const std::vector<Shape>& shapes,
                        const AttrMap& attrs = {}) {
  Graph graph;
  GraphBuilder b(&graph);
  std::vector<ValueId> inputs;
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string in = "in" + std::to_string(i);
    inputs.push_back(b.Input(in, {shapes[i], DType::kF64}));
    feeds[in] = RandomTensor(shapes[i], DType::kF64, 17 + i, 0.5, 1.5);
  }
  auto y = b.Add1(op, inputs, attrs, "op");
  INFO(name);
  REQUIRE(y.status().ToString() == "OK");
  graph.outputs()["y"] = *y;
  auto cpu = RunGraph(graph, Device::Cpu(), feeds);
  auto gpu = RunGraph(graph, Device::Cuda(0), feeds);
  ExpectClose(name + ": f64 cuda vs cpu", cpu["y"], gpu["y"], 1e-12);
}

// The whole catalogue runs on the GPU: an op that gains a CPU kernel without
// a CUDA one fails here (the op harness then compares the two on a GPU).
TEST_CASE("every op with a CPU kernel has a CUDA kernel") {
  const OpRegistry& registry = OpRegistry::Global();
  std::vector<std::string> missing;
  int covered = 0;
  for (const std::string& op : registry.OpNames()) {
    if (!registry.SupportsOp(op, DeviceType::kCpu)) continue;  // sources (Input, Parameter) run no kernel
    if (registry.SupportsOp(op, DeviceType::kCuda)) ++covered;
    else missing.push_back(op);
  }
  std::string list;
  for (const std::string& op : missing) list += " " + op;
  INFO(covered << " ops have CUDA kernels; without one:" << list);
  CHECK(missing.empty());
  CHECK(covered > 90);
}

TEST_CASE("GetAllocator(cuda) works or fails cleanly") {
  // A device index past the last is never present, GPU or not.
  StatusOr<Allocator*> past = GetAllocator(Device::Cuda(cuda::DeviceCount()));
  REQUIRE_FALSE(past.ok());
  CHECK(past.status().code() == StatusCode::kNotFound);
  CHECK_THAT(past.status().message(), Catch::Contains("not present"));

  StatusOr<Allocator*> allocator = GetAllocator(Device::Cuda(0));
  if (allocator.ok()) {
    CHECK(cuda::DeviceCount() >= 1);
    CHECK(cuda::ProbeDevice(0).ok());
    CHECK((*allocator)->device() == Device::Cuda(0));
    return;
  }
  CHECK_FALSE(CudaPresent());  // warns "no GPU: CUDA tests skipped" with the reason
  CHECK_FALSE(CudaRequired());
  CHECK(allocator.status().code() == StatusCode::kNotFound);
  CHECK_THAT(allocator.status().message(), Catch::Contains("not present"));
  CHECK_FALSE(cuda::ProbeDevice(0).ok());
  CHECK(cuda::DeviceCount() == 0);
  // Everything above the allocator fails with a status too, never a crash.
  CHECK_FALSE(Tensor::Empty({4}, DType::kF32, Device::Cuda(0)).ok());
  CHECK_FALSE(Tensor::Zeros({4}).To(Device::Cuda(0)).ok());
  Graph graph;
  GraphBuilder b(&graph);
  ValueId x = b.Input("x", {Shape{2}, DType::kF32});
  graph.outputs()["y"] = b.Add1("Neg", {x}, {}, "neg").value();
  ExecutorOptions options;
  options.device = Device::Cuda(0);
  auto exec = Executor::Create(graph, options);
  REQUIRE_FALSE(exec.ok());
  CHECK_THAT(exec.status().message(), Catch::Contains("not present"));
}

TEST_CASE("a CUDA kernel rejects tensors that are not on its device") {
  // Host tensors handed to a CUDA kernel must fail before any launch.
  Tensor a = Tensor::Zeros({3}), b = Tensor::Zeros({3}), y = Tensor::Zeros({3});
  AttrMap attrs;
  KernelContext ctx;
  ctx.attrs = &attrs;
  ctx.inputs = {&a, &b};
  ctx.outputs = {&y};
  ctx.device = Device::Cuda(0);
  const KernelFn* add = OpRegistry::Global().FindKernel("Add", DeviceType::kCuda);
  REQUIRE(add != nullptr);
  Status s = (*add)(ctx);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("is on cpu:0"));
}

// The kernels' index arithmetic (elementwise_kernels.cu), replayed on the
// host: checks the index builders without a GPU.
int64_t ReplayOffset(const int64_t* dims, const int64_t* strides, int rank, int64_t i) {
  int64_t offset = 0;
  for (int d = rank - 1; d >= 0; --d) {
    offset += (i % dims[d]) * strides[d];
    i /= dims[d];
  }
  return offset;
}

TEST_CASE("broadcast and reduce indexes address the right elements") {
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {{3, 4}, {3, 4}},       {{2, 3, 4}, {4}},          {{2, 1, 4}, {3, 1}},     {{}, {2, 3}},
      {{4, 1, 3}, {1, 5, 3}}, {{2, 1, 3, 1, 4}, {3, 2, 1}}, {{2, 1, 2, 1, 2, 1, 2, 1, 2, 3}, {3}},
      {{5, 1}, {1, 1}},       {{0, 3}, {3}},              {{6, 7, 8}, {6, 1, 8}},
  };
  for (const auto& [sa, sb] : pairs) {
    const Shape out = BroadcastShapes(sa, sb).value();
    INFO(sa.ToString() << " with " << sb.ToString());
    auto index = cuda::MakeBroadcastIndex(out, {sa, sb});
    REQUIRE(index.status().ToString() == "OK");
    CHECK(index->rank <= cuda::kMaxKernelRank);
    int64_t n = 1;
    for (int d = 0; d < index->rank; ++d) n *= index->dims[d];
    CHECK(n == out.numel());
    int bad = 0;
    for (int64_t i = 0; i < out.numel(); ++i) {
      bad += ReplayOffset(index->dims, index->strides[0], index->rank, i) != BroadcastOffset(sa, out, i);
      bad += ReplayOffset(index->dims, index->strides[1], index->rank, i) != BroadcastOffset(sb, out, i);
    }
    CHECK(bad == 0);
  }
  // Coalescing: the rank-10 case walks as [32 (b: stride 0), 3].
  auto ten = cuda::MakeBroadcastIndex({2, 1, 2, 1, 2, 1, 2, 1, 2, 3}, {Shape{2, 1, 2, 1, 2, 1, 2, 1, 2, 3}, Shape{3}});
  REQUIRE(ten.ok());
  CHECK(ten->rank == 2);

  const std::vector<std::pair<Shape, Shape>> reductions = {
      {{2, 3, 4}, {3, 1}}, {{4, 5}, {}},         {{5, 2, 7}, {1, 1, 7}}, {{2, 3}, {2, 3}},
      {{300, 33}, {33}},   {{4, 6, 10, 5}, {1, 6, 1, 5}}, {{3, 0, 2}, {1, 1, 2}}, {{1, 4}, {4}},
  };
  for (const auto& [in, target] : reductions) {
    INFO("sum " << in.ToString() << " to " << target.ToString());
    auto index = cuda::MakeReduceIndex(in, target);
    REQUIRE(index.status().ToString() == "OK");
    Tensor x = RandomTensor(in, DType::kF64, 9);
    std::vector<Tensor> expected = SumToRef({x}, AttrMap{{"shape", target.dims()}}, {});
    int64_t reduced_n = 1;
    for (int d = 0; d < index->reduced_rank; ++d) reduced_n *= index->reduced_dims[d];
    int bad = 0;
    for (int64_t o = 0; o < target.numel(); ++o) {
      const int64_t base = ReplayOffset(index->kept_dims, index->kept_strides, index->kept_rank, o);
      double sum = 0;
      for (int64_t j = 0; j < reduced_n; ++j)
        sum += x.data<double>()[base + ReplayOffset(index->reduced_dims, index->reduced_strides, index->reduced_rank, j)];
      bad += std::abs(sum - At(expected[0], o)) > 1e-12;
    }
    CHECK(bad == 0);
  }
}

// What cuBLAS computes, column-major: C[i + j ldc] = sum_p op1(X1)(i, p) op2(X2)(p, j),
// with X(r, c) stored at x[r + c ld].
void ColumnMajorGemm(const cuda::CublasGemmShape& g, const double* x1, const double* x2, double* c) {
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = 0; j < g.n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        double v1 = g.transpose_first ? x1[p + i * g.ld_first] : x1[i + p * g.ld_first];
        double v2 = g.transpose_second ? x2[j + p * g.ld_second] : x2[p + j * g.ld_second];
        s += v1 * v2;
      }
      c[i + j * g.ldc] = s;
    }
}

TEST_CASE("the row-major to cuBLAS GEMM mapping computes op(A) op(B)") {
  const int64_t m = 7, n = 9, k = 5;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      INFO("transpose_a " << ta << ", transpose_b " << tb);
      Tensor a = RandomTensor(ta ? Shape{k, m} : Shape{m, k}, DType::kF64, 1);
      Tensor b = RandomTensor(tb ? Shape{n, k} : Shape{k, n}, DType::kF64, 2);
      const int64_t lda = a.shape()[1], ldb = b.shape()[1];
      const cuda::CublasGemmShape g = cuda::RowMajorGemmToCublas(ta, tb, m, n, k, lda, ldb);
      // cuBLAS's own argument rules.
      CHECK(g.ld_first >= std::max<int64_t>(1, g.transpose_first ? g.k : g.m));
      CHECK(g.ld_second >= std::max<int64_t>(1, g.transpose_second ? g.n : g.k));
      CHECK(g.ldc >= std::max<int64_t>(1, g.m));
      Tensor c = ZerosF64({m, n});
      ColumnMajorGemm(g, b.data<double>(), a.data<double>(), c.data<double>());  // first operand is B
      Tensor expected = MatMulRef({a, b}, AttrMap{{"transpose_a", ta}, {"transpose_b", tb}}, {})[0];
      ExpectClose("row-major product through the cuBLAS mapping", expected, c, 1e-12);
    }
}

TEST_CASE("the CUDA allocator accounts its bytes") {
  if (!RunGpuChecks()) return;
  Allocator* allocator = GetAllocator(Device::Cuda(0)).value();
  const MemoryStats before = allocator->stats();
  {
    Tensor t = Tensor::Empty({1000, 3}, DType::kF32, Device::Cuda(0)).value();
    CHECK(t.device() == Device::Cuda(0));
    MemoryStats during = allocator->stats();
    CHECK(during.current_bytes == before.current_bytes + 12000);
    CHECK(during.allocations == before.allocations + 1);
    CHECK(during.peak_bytes >= during.current_bytes);
  }
  CHECK(allocator->stats().current_bytes == before.current_bytes);
  allocator->ResetPeak();
  CHECK(allocator->stats().peak_bytes == allocator->stats().current_bytes);
  // An empty tensor still gets a valid device allocation.
  StatusOr<Tensor> empty = Tensor::Empty({0, 5}, DType::kF64, Device::Cuda(0));
  CHECK(empty.status().ToString() == "OK");
  // Far more than any GPU has: a clean ResourceExhausted, not a crash.
  StatusOr<Tensor> huge = Tensor::Empty({int64_t{1} << 50}, DType::kF32, Device::Cuda(0));
  REQUIRE_FALSE(huge.ok());
  CHECK(huge.status().code() == StatusCode::kResourceExhausted);
  CHECK(allocator->stats().current_bytes == before.current_bytes);  // the live empty tensor counts 0 bytes
}

TEST_CASE("the CUDA allocator rounds requests into reusable size classes") {
  using cuda::CudaAllocator;
  CHECK(CudaAllocator::RoundedSize(0) == 512);
  CHECK(CudaAllocator::RoundedSize(1) == 512);
  CHECK(CudaAllocator::RoundedSize(512) == 512);
  CHECK(CudaAllocator::RoundedSize(513) == 1024);
  CHECK(CudaAllocator::RoundedSize((1 << 20) - 1) == (1 << 20));
  CHECK(CudaAllocator::RoundedSize((1 << 20) + 1) == (2 << 20));
  for (size_t bytes : {size_t{1}, size_t{4000}, size_t{3} << 20, (size_t{5} << 20) + 7}) {
    const size_t r = CudaAllocator::RoundedSize(bytes);
    CHECK(r >= bytes);
    CHECK(CudaAllocator::RoundedSize(r) == r);  // a size class maps to itself
  }
}

TEST_CASE("the CUDA allocator reuses freed blocks and releases them") {
  if (!RunGpuChecks()) return;
  auto* allocator = static_cast<cuda::CudaAllocator*>(GetAllocator(Device::Cuda(0)).value());
  allocator->ReleaseCached();
  const size_t reserved = allocator->reserved_bytes();
  const void* first = nullptr;
  {
    Tensor t = Tensor::Empty({3000}, DType::kF32, Device::Cuda(0)).value();
    first = t.raw_data();
  }
  CHECK(allocator->reserved_bytes() == reserved + cuda::CudaAllocator::RoundedSize(12000));
  {
    // Same size class: the cached block comes back, no new device memory.
    Tensor t = Tensor::Empty({2990}, DType::kF32, Device::Cuda(0)).value();
    CHECK(t.raw_data() == first);
    CHECK(allocator->reserved_bytes() == reserved + cuda::CudaAllocator::RoundedSize(12000));
  }
  allocator->ReleaseCached();
  CHECK(allocator->reserved_bytes() == reserved);
}

TEST_CASE("tensors round-trip host -> device -> host") {
  if (!RunGpuChecks()) return;
  for (DType dtype : {DType::kF32, DType::kF64, DType::kI32, DType::kI64}) {
    INFO(DTypeName(dtype));
    Tensor host = RandomTensor({37, 11}, dtype, 3, -100, 100);
    Tensor device = host.To(Device::Cuda(0)).value();
    CHECK(device.device() == Device::Cuda(0));
    // device -> device, then back to the host
    Tensor copy = Tensor::Empty(host.shape(), dtype, Device::Cuda(0)).value();
    REQUIRE(copy.CopyFrom(device).ToString() == "OK");
    Tensor back = copy.To(Device::Cpu()).value();
    CHECK(std::memcmp(back.raw_data(), host.raw_data(), host.nbytes()) == 0);
  }
  // Views at an offset into a device buffer copy only their own bytes.
  Tensor host = RandomTensor({8}, DType::kF32, 5);
  Tensor device = host.To(Device::Cuda(0)).value();
  Tensor tail = Tensor::View(device.buffer(), 4 * sizeof(float), {4}, DType::kF32);
  Tensor back = tail.To(Device::Cpu()).value();
  for (int i = 0; i < 4; ++i) CHECK(back.data<float>()[i] == host.data<float>()[4 + i]);
  // Empty tensors.
  Tensor none = Tensor::Zeros({0, 3}).To(Device::Cuda(0)).value();
  CHECK(none.To(Device::Cpu()).value().numel() == 0);
  // Between GPUs, where there are two.
  if (cuda::DeviceCount() >= 2 && cuda::ProbeDevice(1).ok()) {
    Tensor on1 = device.To(Device::Cuda(1)).value();
    Tensor again = on1.To(Device::Cpu()).value();
    CHECK(std::memcmp(again.raw_data(), host.raw_data(), host.nbytes()) == 0);
  }
}

// ---- kernels through the op harness (CUDA vs CPU when a GPU exists) ----

std::vector<OpCase> MatMulCases() {
  std::vector<OpCase> cases;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const std::string t = std::string(ta ? " A^T" : "") + (tb ? " B^T" : "");
      AttrMap attrs{{"transpose_a", ta}, {"transpose_b", tb}};
      auto a = [&](int64_t m, int64_t k) { return ta ? Shape{k, m} : Shape{m, k}; };
      auto b = [&](int64_t k, int64_t n) { return tb ? Shape{n, k} : Shape{k, n}; };
      auto ba = [&](int64_t batch, int64_t m, int64_t k) { return ta ? Shape{batch, k, m} : Shape{batch, m, k}; };
      auto bb = [&](int64_t batch, int64_t k, int64_t n) { return tb ? Shape{batch, n, k} : Shape{batch, k, n}; };
      cases.push_back({"matmul 7x5x9" + t, "MatMul", attrs,
                       {InputSpec::Uniform(a(7, 5)), InputSpec::Uniform(b(5, 9))}, MatMulRef});
      cases.push_back({"matmul 65x130x47" + t, "MatMul", attrs,
                       {InputSpec::Uniform(a(65, 130)), InputSpec::Uniform(b(130, 47))}, MatMulRef});
      cases.push_back({"batch matmul 3x(4x6x5)" + t, "BatchMatMul", attrs,
                       {InputSpec::Uniform(ba(3, 4, 6)), InputSpec::Uniform(bb(3, 6, 5))}, MatMulRef});
      cases.push_back({"batch matmul 5x(33x70x18)" + t, "BatchMatMul", attrs,
                       {InputSpec::Uniform(ba(5, 33, 70)), InputSpec::Uniform(bb(5, 70, 18))}, MatMulRef});
    }
  cases.push_back({"batch matmul rank 4 A^T", "BatchMatMul", {{"transpose_a", true}},
                   {InputSpec::Uniform({2, 3, 4, 5}), InputSpec::Uniform({2, 3, 4, 6})}, MatMulRef});
  cases.push_back({"matmul 1x1x1", "MatMul", {}, {InputSpec::Uniform({1, 1}), InputSpec::Uniform({1, 1})}, MatMulRef});
  cases.push_back({"linear with bias", "Linear", {},
                   {InputSpec::Uniform({4, 6}), InputSpec::Uniform({3, 6}), InputSpec::Uniform({3})}, LinearRef});
  cases.push_back({"linear no bias", "Linear", {}, {InputSpec::Uniform({4, 6}), InputSpec::Uniform({3, 6})}, LinearRef});
  cases.push_back({"linear with bias rank 3", "Linear", {},
                   {InputSpec::Uniform({2, 3, 6}), InputSpec::Uniform({5, 6}), InputSpec::Uniform({5})}, LinearRef});
  cases.push_back({"linear no bias rank 3", "Linear", {},
                   {InputSpec::Uniform({2, 3, 6}), InputSpec::Uniform({5, 6})}, LinearRef});
  cases.push_back({"linear rank 1", "Linear", {},
                   {InputSpec::Uniform({6}), InputSpec::Uniform({4, 6}), InputSpec::Uniform({4})}, LinearRef});
  cases.push_back({"linear 96x200 -> 70 with bias", "Linear", {},
                   {InputSpec::Uniform({96, 200}), InputSpec::Uniform({70, 200}), InputSpec::Uniform({70})},
                   LinearRef});
  cases.push_back({"linear batched with bias", "Linear", {},
                   {InputSpec::Uniform({3, 40, 24}), InputSpec::Uniform({3, 17, 24}), InputSpec::Uniform({3, 17})},
                   LinearRef});
  cases.push_back({"linear batched no bias", "Linear", {},
                   {InputSpec::Uniform({2, 5, 8}), InputSpec::Uniform({2, 6, 8})}, LinearRef});
  return cases;
}

TEST_CASE("cuBLAS matmul kernels match the CPU") {
  RunGpuChecks();  // fails here when a GPU is required and missing
  for (const OpCase& c : MatMulCases()) DYNAMIC_SECTION(c.name) { RunCudaCase(c); }
}

std::vector<OpCase> ElementwiseCases() {
  auto add = [](double a, double b) { return a + b; };
  auto sub = [](double a, double b) { return a - b; };
  auto mul = [](double a, double b) { return a * b; };
  auto div = [](double a, double b) { return a / b; };
  using IS = InputSpec;
  std::vector<OpCase> cases = {
      {"add same shape", "Add", {}, {IS::Uniform({3, 4}), IS::Uniform({3, 4})}, BinaryRef(add)},
      {"sub same shape", "Sub", {}, {IS::Uniform({3, 4}), IS::Uniform({3, 4})}, BinaryRef(sub)},
      {"mul same shape", "Mul", {}, {IS::Uniform({3, 4}), IS::Uniform({3, 4})}, BinaryRef(mul)},
      {"div same shape", "Div", {}, {IS::Uniform({3, 4}), IS::Uniform({3, 4}, 0.5, 2.0)}, BinaryRef(div)},
      {"add large", "Add", {}, {IS::Uniform({1000, 37}), IS::Uniform({1000, 37})}, BinaryRef(add)},
      {"add bias broadcast", "Add", {}, {IS::Uniform({2, 3, 4}), IS::Uniform({4})}, BinaryRef(add)},
      {"add both broadcast", "Add", {}, {IS::Uniform({2, 1, 4}), IS::Uniform({3, 1})}, BinaryRef(add)},
      {"sub column broadcast", "Sub", {}, {IS::Uniform({2, 3}), IS::Uniform({2, 1})}, BinaryRef(sub)},
      {"mul outer broadcast", "Mul", {}, {IS::Uniform({4, 1, 3}), IS::Uniform({1, 5, 3})}, BinaryRef(mul)},
      {"mul scalar tensor", "Mul", {}, {IS::Uniform({}), IS::Uniform({2, 3})}, BinaryRef(mul)},
      {"div broadcast", "Div", {}, {IS::Uniform({2, 3}), IS::Uniform({3}, 0.5, 2.0)}, BinaryRef(div)},
      {"div scalar by tensor", "Div", {}, {IS::Uniform({}), IS::Uniform({2, 2}, 0.5, 2.0)}, BinaryRef(div)},
      {"sub rank 5 broadcast", "Sub", {}, {IS::Uniform({2, 1, 3, 1, 4}), IS::Uniform({3, 2, 1})}, BinaryRef(sub)},
      // Rank 10: only coalescing the dims brings it within the kernels' 8.
      {"add rank 10 coalesced", "Add", {}, {IS::Uniform({2, 1, 2, 1, 2, 1, 2, 1, 2, 3}), IS::Uniform({3})},
       BinaryRef(add)},
      {"mul large broadcast", "Mul", {}, {IS::Uniform({64, 1, 300}), IS::Uniform({7, 300})}, BinaryRef(mul)},
      {"neg", "Neg", {}, {IS::Uniform({5})}, UnaryRef([](double x) { return -x; })},
      {"add scalar", "AddScalar", {{"value", 2.5}}, {IS::Uniform({2, 3})}, UnaryRef([](double x) { return x + 2.5; })},
      {"mul scalar", "MulScalar", {{"value", -3.0}}, {IS::Uniform({2, 3})}, UnaryRef([](double x) { return -3 * x; })},
      {"pow scalar", "PowScalar", {{"value", 1.5}}, {IS::Uniform({7}, 0.2, 2.0)},
       UnaryRef([](double x) { return std::pow(x, 1.5); })},
      {"neg large", "Neg", {}, {IS::Uniform({100000})}, UnaryRef([](double x) { return -x; })},
      {"identity", "Identity", {}, {IS::Uniform({3, 2})}, UnaryRef([](double x) { return x; })},
      {"reshape", "Reshape", {{"shape", std::vector<int64_t>{3, -1}}}, {IS::Uniform({2, 3, 2})},
       [](const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
         return std::vector<Tensor>{in[0].Reshape({3, 4}).value()};
       }},
      {"broadcast to", "BroadcastTo", {{"shape", std::vector<int64_t>{2, 3, 4}}}, {IS::Uniform({3, 1})}, BroadcastToRef},
      {"broadcast scalar to", "BroadcastTo", {{"shape", std::vector<int64_t>{5, 2}}}, {IS::Uniform({})}, BroadcastToRef},
      {"sum to [3, 1]", "SumToShape", {{"shape", std::vector<int64_t>{3, 1}}}, {IS::Uniform({2, 3, 4})}, SumToRef},
      {"sum to scalar", "SumToShape", {{"shape", std::vector<int64_t>{}}}, {IS::Uniform({4, 5})}, SumToRef},
      {"sum to [1, 1, 7]", "SumToShape", {{"shape", std::vector<int64_t>{1, 1, 7}}}, {IS::Uniform({5, 2, 7})}, SumToRef},
      {"sum to same shape", "SumToShape", {{"shape", std::vector<int64_t>{2, 3}}}, {IS::Uniform({2, 3})}, SumToRef},
      // The bias-gradient shape: few outputs, long sums (one block per output).
      {"sum to bias", "SumToShape", {{"shape", std::vector<int64_t>{33}}}, {IS::Uniform({300, 33})}, SumToRef},
      {"sum to scalar long", "SumToShape", {{"shape", std::vector<int64_t>{}}}, {IS::Uniform({40, 500})},
       SumToRef},
      // Many outputs (one thread per output).
      {"sum to many outputs", "SumToShape", {{"shape", std::vector<int64_t>{20000}}}, {IS::Uniform({3, 20000})},
       SumToRef},
      {"sum to middle dims", "SumToShape", {{"shape", std::vector<int64_t>{1, 6, 1, 5}}},
       {IS::Uniform({4, 6, 100, 5})}, SumToRef},
  };
  for (const char* dtype : {"f32", "f64", "i32", "i64"}) {
    OpCase fill{std::string("fill ") + dtype, "Fill",
                {{"shape", std::vector<int64_t>{3, 5}}, {"value", 7.0}, {"dtype", std::string(dtype)}}, {}, FillRef};
    cases.push_back(fill);
  }
  OpCase fill_big{"fill large", "Fill", {{"shape", std::vector<int64_t>{512, 513}}, {"value", -0.25}}, {}, FillRef};
  cases.push_back(fill_big);
  return cases;
}

TEST_CASE("element-wise CUDA kernels match the CPU") {
  RunGpuChecks();
  for (const OpCase& c : ElementwiseCases()) DYNAMIC_SECTION(c.name) { RunCudaCase(c); }
}

TEST_CASE("f64 CUDA kernels (Dgemm and friends) match the CPU") {
  if (!RunGpuChecks()) return;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      AttrMap attrs{{"transpose_a", ta}, {"transpose_b", tb}};
      CheckF64AgainstCpu("f64 matmul", "MatMul", {ta ? Shape{40, 31} : Shape{31, 40}, tb ? Shape{23, 40} : Shape{40, 23}},
                         attrs);
      CheckF64AgainstCpu("f64 batch matmul", "BatchMatMul",
                         {ta ? Shape{3, 12, 9} : Shape{3, 9, 12}, tb ? Shape{3, 8, 12} : Shape{3, 12, 8}}, attrs);
    }
  CheckF64AgainstCpu("f64 linear", "Linear", {{2, 5, 16}, {7, 16}, {7}});
  CheckF64AgainstCpu("f64 add broadcast", "Add", {{4, 1, 6}, {5, 6}});
  CheckF64AgainstCpu("f64 div", "Div", {{4, 6}, {4, 6}});
  CheckF64AgainstCpu("f64 pow", "PowScalar", {{50}}, {{"value", 2.5}});
  CheckF64AgainstCpu("f64 sum to", "SumToShape", {{30, 20}}, {{"shape", std::vector<int64_t>{20}}});
  CheckF64AgainstCpu("f64 broadcast to", "BroadcastTo", {{20}}, {{"shape", std::vector<int64_t>{3, 20}}});
}

TEST_CASE("a Linear forward and backward pass runs on CUDA as on the CPU") {
  if (!RunGpuChecks()) return;
  // loss = sum((x W^T + b) * (x W^T + b) * c): the backward graph uses
  // MatMul with transposes, Reshape, SumToShape, Mul and Add.
  Graph graph;
  GraphBuilder b(&graph);
  const TensorType xt{Shape{4, 3, 10}, DType::kF32}, wt{Shape{6, 10}, DType::kF32}, bt{Shape{6}, DType::kF32},
      ct{Shape{4, 3, 6}, DType::kF32};
  ValueId x = b.Input("x", xt), w = b.Input("w", wt), bias = b.Input("b", bt), c = b.Input("c", ct);
  ValueId y = b.Add1("Linear", {x, w, bias}, {}, "linear").value();
  ValueId sq = b.Add1("Mul", {y, y}, {}, "square").value();
  ValueId weighted = b.Add1("Mul", {sq, c}, {}, "weight").value();
  ValueId loss = b.Add1("SumToShape", {weighted}, AttrMap{{"shape", std::vector<int64_t>{}}}, "loss").value();
  auto grads = BuildGradients(&graph, loss, {x, w, bias});
  REQUIRE(grads.status().ToString() == "OK");
  graph.outputs()["loss"] = loss;
  graph.outputs()["dx"] = grads->at(x);
  graph.outputs()["dw"] = grads->at(w);
  graph.outputs()["db"] = grads->at(bias);
  for (const Node& n : graph.nodes()) {
    INFO("backward op " << n.op << " needs a CUDA kernel");
    CHECK((IsSourceOp(n.op) || OpRegistry::Global().SupportsOp(n.op, DeviceType::kCuda)));
  }
  std::map<std::string, Tensor> feeds = {{"x", RandomTensor(xt.shape, DType::kF32, 1)},
                                         {"w", RandomTensor(wt.shape, DType::kF32, 2)},
                                         {"b", RandomTensor(bt.shape, DType::kF32, 3)},
                                         {"c", RandomTensor(ct.shape, DType::kF32, 4)}};
  auto cpu = RunGraph(graph, Device::Cpu(), feeds);
  auto gpu = RunGraph(graph, Device::Cuda(0), feeds);
  for (const char* name : {"loss", "dx", "dw", "db"}) ExpectClose(std::string(name) + " cuda vs cpu", cpu[name], gpu[name], 1e-4);
}

// ---- throughput, run by tools/gpu_check.sh with the [bench] tag ----

// Times `iters` calls of a kernel on device tensors; returns seconds per call.
double TimeKernel(const std::string& op, AttrMap attrs, const std::vector<Tensor*>& inputs, Tensor* output,
                  int iters) {
  const KernelFn* kernel = OpRegistry::Global().FindKernel(op, DeviceType::kCuda);
  REQUIRE(kernel != nullptr);
  REQUIRE(CanonicalizeAttrs(*OpRegistry::Global().GetOp(op).value(), &attrs).ok());  // as a node holds them
  KernelContext ctx;
  ctx.attrs = &attrs;
  for (Tensor* t : inputs) ctx.inputs.push_back(t);
  ctx.outputs = {output};
  ctx.device = Device::Cuda(0);
  REQUIRE((*kernel)(ctx).ToString() == "OK");  // warm-up (cuBLAS heuristics, module load)
  REQUIRE(cuda::SynchronizeDevice(0).ToString() == "OK");
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) REQUIRE((*kernel)(ctx).ToString() == "OK");
  REQUIRE(cuda::SynchronizeDevice(0).ToString() == "OK");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
}

TEST_CASE("CUDA kernel throughput", "[.][bench]") {
  if (!RunGpuChecks()) return;
  for (DType dtype : {DType::kF32, DType::kF64}) {
    const int64_t n = 4096;
    Tensor a = RandomTensor({n, n}, dtype, 1).To(Device::Cuda(0)).value();
    Tensor b = RandomTensor({n, n}, dtype, 2).To(Device::Cuda(0)).value();
    Tensor y = Tensor::Empty({n, n}, dtype, Device::Cuda(0)).value();
    double s = TimeKernel("MatMul", {}, {&a, &b}, &y, 10);
    std::cout << "MatMul " << DTypeName(dtype) << " " << n << "^3: " << 2.0 * n * n * n / s / 1e12 << " TFLOP/s ("
              << s * 1e3 << " ms)\n";
  }
  const int64_t n = int64_t{1} << 26;
  Tensor a = RandomTensor({n}, DType::kF32, 3).To(Device::Cuda(0)).value();
  Tensor b = RandomTensor({n}, DType::kF32, 4).To(Device::Cuda(0)).value();
  Tensor y = Tensor::Empty({n}, DType::kF32, Device::Cuda(0)).value();
  double s = TimeKernel("Add", {}, {&a, &b}, &y, 20);
  std::cout << "Add f32 " << n << " elements: " << 3.0 * 4 * n / s / 1e9 << " GB/s (" << s * 1e3 << " ms)\n";
  Tensor bias = RandomTensor({1024}, DType::kF32, 5).To(Device::Cuda(0)).value();
  Tensor y2 = Tensor::Empty({n / 1024, 1024}, DType::kF32, Device::Cuda(0)).value();
  Tensor a2 = a.Reshape({n / 1024, 1024}).value();
  s = TimeKernel("Add", {}, {&a2, &bias}, &y2, 20);
  std::cout << "Add f32 broadcast [65536, 1024] + [1024]: " << 2.0 * 4 * n / s / 1e9 << " GB/s (" << s * 1e3
            << " ms)\n";
  Tensor col = Tensor::Empty({1024}, DType::kF32, Device::Cuda(0)).value();
  s = TimeKernel("SumToShape", {{"shape", std::vector<int64_t>{1024}}}, {&a2}, &col, 20);
  std::cout << "SumToShape f32 [65536, 1024] -> [1024]: " << 4.0 * n / s / 1e9 << " GB/s (" << s * 1e3 << " ms)\n";
}

}  // namespace
}  // namespace loom::testing
