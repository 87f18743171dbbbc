// Test helper: how far a vector of floats is from a reference, relative to the reference's size.
#ifndef DTRAIN_COMMON_TESTING_RELATIVE_DIFFERENCE_H_
#define DTRAIN_COMMON_TESTING_RELATIVE_DIFFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace dtrain::testing {

// ||a - b|| / ||b|| over the first b.size() elements (a must hold at least as many), computed in double;
// 0 when both are zero. Thread-compatible (pure).
inline double RelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace dtrain::testing

#endif  // DTRAIN_COMMON_TESTING_RELATIVE_DIFFERENCE_H_
