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

}  // namespace dtrain::ps::shm
