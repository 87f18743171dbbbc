#include "common/open_files.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

namespace dtrain {

OpenFileLimit RaiseOpenFileLimit(int64_t cap) {
  OpenFileLimit out;
  struct rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) {
    out.error = std::strerror(errno);
    return out;
  }
  const auto as_int = [](rlim_t v) { return v == RLIM_INFINITY ? int64_t{-1} : static_cast<int64_t>(v); };
  out.before = out.after = as_int(r.rlim_cur);
  out.hard = as_int(r.rlim_max);
  const rlim_t want = r.rlim_max == RLIM_INFINITY || static_cast<int64_t>(r.rlim_max) > cap
                          ? static_cast<rlim_t>(cap)
                          : r.rlim_max;
  if (r.rlim_cur != RLIM_INFINITY && r.rlim_cur < want) {
    struct rlimit raised = r;
    raised.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      out.after = static_cast<int64_t>(want);
    } else {
      out.error = std::strerror(errno);
    }
  }
  return out;
}

}  // namespace dtrain
