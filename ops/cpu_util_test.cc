#include "ops/cpu_util.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace loom {
namespace {

// f one element at a time with the vectoriser off, and in a loop that
// vectorises: the lanes must give the first's bits.
template <float (*F)(float)>
__attribute__((noinline, optimize("no-tree-vectorize"))) void OneAtATime(const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = F(x[i]);
}
template <float (*F)(float)>
__attribute__((noinline)) void InLanes(const float* __restrict x, float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = F(x[i]);
}
template <float (*F)(float)>
bool SameBitsInLanes(const std::vector<float>& x) {
  std::vector<float> one(x.size()), lanes(x.size());
  OneAtATime<F>(x.data(), one.data(), static_cast<int64_t>(x.size()));
  InLanes<F>(x.data(), lanes.data(), static_cast<int64_t>(x.size()));
  return std::memcmp(one.data(), lanes.data(), x.size() * sizeof(float)) == 0;
}

// Both of NormalCdfPdfF's results in one float, for SameBitsInLanes.
float NormalCdfMinusPdf(float x) {
  const NormalCdfPdf n = NormalCdfPdfF(x);
  return n.cdf - n.pdf;
}

TEST_CASE("ExpF is e^x within 2 ulp over float's range, and its special values") {
  double worst = 0;
  float at = 0;
  for (double x = -87.0; x <= 88.7; x += 1.0 / 1024) {
    const float xf = static_cast<float>(x);
    const double want = std::exp(static_cast<double>(xf));
    const double error = std::abs(ExpF(xf) - want) / want;
    if (error > worst) worst = error, at = xf;
  }
  INFO("worst relative error " << worst << " at x = " << at);
  CHECK(worst < 2 * std::numeric_limits<float>::epsilon());
  // Subnormal results: within an ulp of the subnormal spacing.
  for (float x : {-88.0f, -95.5f, -100.0f, -103.0f}) {
    INFO("x = " << x);
    CHECK(std::abs(ExpF(x) - std::exp(static_cast<double>(x))) <= std::numeric_limits<float>::denorm_min());
  }
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(ExpF(0.0f) == 1.0f);
  CHECK(ExpF(-inf) == 0.0f);
  CHECK(ExpF(-200.0f) == 0.0f);
  CHECK(ExpF(inf) == inf);
  CHECK(ExpF(89.0f) == inf);
  CHECK(std::isnan(ExpF(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isfinite(ExpF(88.72f)));
}

// The largest relative error of f against the double reference over x.
template <typename F, typename R>
double WorstError(F f, R reference, const std::vector<float>& xs) {
  double worst = 0;
  for (float x : xs) {
    const double want = reference(static_cast<double>(x));
    if (want == 0) continue;
    worst = std::max(worst, std::abs(f(x) - want) / std::abs(want));
  }
  return worst;
}

TEST_CASE("SigmoidF and TanhF are within 2 ulp, with their limits") {
  std::vector<float> xs;
  for (double x = -20; x <= 20; x += 1.0 / 512) xs.push_back(static_cast<float>(x));
  for (double x = 1e-7; x < 1; x *= 1.01) xs.push_back(static_cast<float>(x)), xs.push_back(static_cast<float>(-x));
  const double eps = std::numeric_limits<float>::epsilon();
  CHECK(WorstError(TanhF, [](double x) { return std::tanh(x); }, xs) < 2 * eps);
  CHECK(WorstError(SigmoidF, [](double x) { return 1 / (1 + std::exp(-x)); }, xs) < 2 * eps);
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(TanhF(0.0f) == 0.0f);
  CHECK(std::signbit(TanhF(-0.0f)));
  CHECK(TanhF(inf) == 1.0f);
  CHECK(TanhF(-inf) == -1.0f);
  CHECK(std::isnan(TanhF(std::numeric_limits<float>::quiet_NaN())));
  CHECK(SigmoidF(-inf) == 0.0f);
  CHECK(SigmoidF(inf) == 1.0f);
  CHECK(SigmoidF(0.0f) == 0.5f);
}

// |got - want| in units of the last place of want rounded to float.
double UlpError(float got, double want) {
  const float w = std::abs(static_cast<float>(want));
  return std::abs(got - want) / (std::nextafter(w, std::numeric_limits<float>::infinity()) - w);
}

TEST_CASE("LogF is ln(x) within 1 ulp over positive floats, subnormals included, and its special values") {
  double worst = 0;
  float at = 0;
  // One float in 4099 over all positive finite floats: about 520 thousand.
  for (int32_t bits = 1; bits < 0x7f800000; bits += 4099) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    const double want = std::log(static_cast<double>(x));
    if (want == 0) continue;
    const double error = UlpError(LogF(x), want);
    if (error > worst) worst = error, at = x;
  }
  for (float x : {1.0f, std::nextafter(1.0f, 2.0f), std::nextafter(1.0f, 0.0f), 0.7071067f, 0.7071068f, 2.0f}) {
    const double want = std::log(static_cast<double>(x));
    INFO("x = " << x);
    CHECK(std::abs(LogF(x) - want) <= 2 * std::abs(want) * std::numeric_limits<float>::epsilon());
  }
  INFO("worst " << worst << " ulp at x = " << at);
  CHECK(worst < 1);
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(LogF(1.0f) == 0.0f);
  CHECK(LogF(0.0f) == -inf);
  CHECK(LogF(-0.0f) == -inf);
  CHECK(LogF(inf) == inf);
  CHECK(std::isnan(LogF(-1.0f)));
  CHECK(std::isnan(LogF(-inf)));
  CHECK(std::isnan(LogF(std::numeric_limits<float>::quiet_NaN())));
  const float smallest = std::numeric_limits<float>::denorm_min();
  CHECK(UlpError(LogF(smallest), std::log(static_cast<double>(smallest))) < 2);
}

TEST_CASE("NormalCdfPdfF is within 5 ulp of Phi and phi where they are normal, with their limits") {
  double worst_cdf = 0, worst_pdf = 0;
  float cdf_at = 0, pdf_at = 0;
  int64_t checked = 0;
  // One float in 257 from -13.1 (Phi's last normal values) to 6 (Phi = 1): about 8 million.
  for (float x = -13.1f; x < 6.0f;) {
    const NormalCdfPdf got = NormalCdfPdfF(x);
    const double cdf = 0.5 * std::erfc(-x * M_SQRT1_2), pdf = std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
    const double cdf_error = UlpError(got.cdf, cdf);
    if (cdf_error > worst_cdf) worst_cdf = cdf_error, cdf_at = x;
    if (pdf >= std::numeric_limits<float>::min()) {
      const double pdf_error = UlpError(got.pdf, pdf);
      if (pdf_error > worst_pdf) worst_pdf = pdf_error, pdf_at = x;
    }
    ++checked;
    int32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    bits += x < 0 ? -257 : 257;  // (magnitude bits: toward +inf is down for negatives)
    if (x < 0 && bits < 0x00800000) bits = 0;  // past -0's neighbours: on to +0
    std::memcpy(&x, &bits, sizeof bits);
  }
  INFO(checked << " points; worst Phi error " << worst_cdf << " ulp at " << cdf_at << ", phi " << worst_pdf
                << " ulp at " << pdf_at);
  CHECK(checked > 1000000);
  CHECK(worst_cdf < 5);
  CHECK(worst_pdf < 4);
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(NormalCdfPdfF(inf).cdf == 1.0f);
  CHECK(NormalCdfPdfF(inf).pdf == 0.0f);
  CHECK(NormalCdfPdfF(-inf).cdf == 0.0f);
  CHECK(NormalCdfPdfF(-inf).pdf == 0.0f);
  CHECK(NormalCdfPdfF(-15.0f).cdf == 0.0f);
  CHECK(NormalCdfPdfF(5.5f).cdf == 1.0f);
  CHECK(NormalCdfPdfF(-13.5f).cdf > 0.0f);  // subnormal, not flushed
  CHECK(std::isnan(NormalCdfPdfF(std::numeric_limits<float>::quiet_NaN()).cdf));
}

TEST_CASE("ExpF, TanhF, LogF and NormalCdfPdfF give the same bits in vector lanes as one at a time") {
  std::vector<float> x;
  for (int i = 0; i < 4099; ++i) x.push_back(static_cast<float>(-110.0 + 200.0 * i / 4098.0));
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(std::numeric_limits<float>::infinity());
  CHECK(SameBitsInLanes<ExpF>(x));
  CHECK(SameBitsInLanes<TanhF>(x));
  CHECK(SameBitsInLanes<LogF>(x));
  CHECK(SameBitsInLanes<NormalCdfMinusPdf>(x));
  std::vector<float> positive(x.size());  // logs of |x| and of tiny values
  for (size_t i = 0; i < x.size(); ++i) positive[i] = std::abs(x[i]) * (i % 3 == 0 ? 1e-40f : 1.0f);
  CHECK(SameBitsInLanes<LogF>(positive));
}

TEST_CASE("SumAsDouble adds in kSumLanes lanes, then the tail, then the lanes") {
  std::vector<float> p;
  for (int i = 0; i < 37; ++i) p.push_back(1.0f / static_cast<float>(i + 1) * (i % 3 == 0 ? -1.0f : 1.0f));
  double lanes[kSumLanes] = {};
  const int64_t full = 37 - 37 % kSumLanes;
  for (int64_t i = 0; i < full; ++i) lanes[i % kSumLanes] += p[static_cast<size_t>(i)];
  double want = 0;
  for (int64_t i = full; i < 37; ++i) want += p[static_cast<size_t>(i)];
  for (double l : lanes) want += l;
  CHECK(SumAsDouble(p.data(), 37) == want);
  CHECK(SumAsDouble(p.data(), 0) == 0.0);
}

}  // namespace
}  // namespace loom
