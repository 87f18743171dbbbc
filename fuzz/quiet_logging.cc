// Linked into every fuzz harness (dtrain_fuzzer): the readers' INFO/WARNING/ERROR lines would cost more than
// the parsing and flood the fuzzer's output. FATAL (a failed CHECK) is still printed, and aborts.
#include "glog/logging.h"

namespace {

struct QuietLogging {
  QuietLogging() {
    FLAGS_logtostderr = true;
    FLAGS_minloglevel = google::GLOG_FATAL;
  }
} quiet_logging;

}  // namespace
