#include "ps/shm/shm_offer.h"

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace dtrain::ps::shm {

std::string HostBootId() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return std::string(absl::StripAsciiWhitespace(id));
}

bool TicketsEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::Status CheckOfferSession(PsInterface* ps, int worker_id, uint64_t session) {
  absl::StatusOr<int64_t> live = ps->Heartbeat(worker_id, session);
  if (live.ok()) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("no offer for worker ", worker_id, ": its session is not the one "
                                                  "given (", live.status().message(), "); only the process "
                                                  "registered as that worker may attach, and its attachment stays"));
}

}  // namespace dtrain::ps::shm
