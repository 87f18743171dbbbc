#include "ps/shm/shm_offer.h"

#include <fstream>

#include "absl/strings/ascii.h"

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

}  // namespace dtrain::ps::shm
