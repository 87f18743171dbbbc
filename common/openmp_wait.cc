#include "common/openmp_wait.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace dtrain {

std::string OpenMpWaitSetting() {
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  if (spin != nullptr && policy == nullptr && std::getenv(kGompSpinCountSetByDtrain) != nullptr) {
    return absl::StrCat("GOMP_SPINCOUNT=", spin, " (dtrain's default)");
  }
  if (spin == nullptr && policy == nullptr) {
    return "libgomp's default spin (this program did not restart with GOMP_SPINCOUNT set)";
  }
  std::string s;
  if (policy != nullptr) s = absl::StrCat("OMP_WAIT_POLICY=", policy);
  if (spin != nullptr) absl::StrAppend(&s, s.empty() ? "" : " ", "GOMP_SPINCOUNT=", spin);
  return absl::StrCat(s, " (from the environment)");
}

}  // namespace dtrain
