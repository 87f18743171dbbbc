// Test helpers shared by the kernel tests of every backend: random inputs, array comparison with a stated
// tolerance, and a central-difference gradient check.
//
// The gradient check: for a scalar loss L(x) (typically L = sum(y * r) for a fixed random r, so that
// dL/dy = r), it compares the analytic gradient g = dL/dx on a sample of coordinates with
//   (L(x + h e_i) - L(x - h e_i)) / (x_i^+ - x_i^-)
// where x_i^± are the float values actually evaluated. A coordinate passes when
//   |g_i - fd_i| <= abs_tol + rel_tol * max(|g_i|, |fd_i|).
//
// Example:
//   GradCheckResult r = CheckGradient(x, analytic_dx, [&](const std::vector<float>& xp) {
//     RunForward(xp, &y);
//     return Dot(y, r);
//   });
//   EXPECT_EQ(r.failed, 0) << r.first_failure;
//
// All functions are thread-compatible (no shared state).
#ifndef DTRAIN_KERNELS_GRADIENT_CHECK_H_
#define DTRAIN_KERNELS_GRADIENT_CHECK_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dtrain::kernels::testing {

// n floats uniform in [lo, hi), deterministic in `seed`.
inline std::vector<float> RandomVector(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = dist(gen);
  return v;
}

// sum(a * b) in double.
inline double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

struct CompareResult {
  int64_t mismatches = 0;
  double max_abs_err = 0;
  std::string first_mismatch;  // empty when all match
};

// Element-wise |actual - expected| <= abs_tol + rel_tol * |expected|.
inline CompareResult CompareArrays(const std::vector<float>& actual, const std::vector<float>& expected,
                                   double rel_tol, double abs_tol) {
  CompareResult r;
  if (actual.size() != expected.size()) {
    r.mismatches = 1;
    r.first_mismatch = absl::StrCat("size ", actual.size(), " != expected size ", expected.size());
    return r;
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    const double err = std::fabs(static_cast<double>(actual[i]) - expected[i]);
    r.max_abs_err = std::max(r.max_abs_err, err);
    if (!(err <= abs_tol + rel_tol * std::fabs(expected[i]))) {  // also catches NaN
      if (r.mismatches == 0)
        r.first_mismatch = absl::StrCat("index ", i, ": got ", actual[i], ", expected ", expected[i]);
      ++r.mismatches;
    }
  }
  return r;
}

struct GradCheckOptions {
  double step = 1e-2;     // h; the loss must be smooth on [x_i - h, x_i + h]
  double rel_tol = 1e-2;  // fp32 forward passes: 1e-2 relative ...
  double abs_tol = 1e-3;  // ... plus 1e-3 absolute
  int max_coords = 48;    // coordinates sampled (all of them when x is smaller)
  uint64_t seed = 12345;  // which coordinates
};

struct GradCheckResult {
  int checked = 0;
  int failed = 0;
  double max_abs_err = 0;
  std::string first_failure;  // empty when none failed
};

// `loss` evaluates L at the given point; x is perturbed one coordinate at a time (a copy; x is not changed).
inline GradCheckResult CheckGradient(const std::vector<float>& x, const std::vector<float>& analytic,
                                     const std::function<double(const std::vector<float>&)>& loss,
                                     const GradCheckOptions& opt = {}) {
  GradCheckResult r;
  if (x.size() != analytic.size()) {
    r.failed = 1;
    r.first_failure = absl::StrCat("gradient size ", analytic.size(), " != input size ", x.size());
    return r;
  }
  std::vector<int64_t> coords;
  const int64_t n = static_cast<int64_t>(x.size());
  if (n <= opt.max_coords) {
    for (int64_t i = 0; i < n; ++i) coords.push_back(i);
  } else {
    std::mt19937_64 gen(opt.seed);
    std::uniform_int_distribution<int64_t> dist(0, n - 1);
    for (int k = 0; k < opt.max_coords; ++k) coords.push_back(dist(gen));
  }
  std::vector<float> xp = x;
  for (int64_t i : coords) {
    const float plus = static_cast<float>(x[i] + opt.step);
    const float minus = static_cast<float>(x[i] - opt.step);
    xp[i] = plus;
    const double l_plus = loss(xp);
    xp[i] = minus;
    const double l_minus = loss(xp);
    xp[i] = x[i];
    const double fd = (l_plus - l_minus) / (static_cast<double>(plus) - minus);
    const double g = analytic[i];
    const double err = std::fabs(g - fd);
    r.max_abs_err = std::max(r.max_abs_err, err);
    ++r.checked;
    if (!(err <= opt.abs_tol + opt.rel_tol * std::max(std::fabs(g), std::fabs(fd)))) {
      if (r.failed == 0)
        r.first_failure = absl::StrCat("coordinate ", i, ": analytic ", g, ", finite difference ", fd);
      ++r.failed;
    }
  }
  return r;
}

}  // namespace dtrain::kernels::testing

#endif  // DTRAIN_KERNELS_GRADIENT_CHECK_H_
