#include "ps/rpc/peer_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace dtrain::ps {
namespace {

// This namespace's interface addresses, as inet_ntop writes them.
const std::vector<std::string>& LocalAddresses() {
  static const std::vector<std::string>* addresses = [] {
    auto* out = new std::vector<std::string>;
    ifaddrs* list = nullptr;
    if (getifaddrs(&list) != 0) return out;
    for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr) continue;
      char text[INET6_ADDRSTRLEN] = {0};
      if (a->ifa_addr->sa_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text));
      } else if (a->ifa_addr->sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, text, sizeof(text));
      } else {
        continue;
      }
      out->push_back(text);
    }
    freeifaddrs(list);
    return out;
  }();
  return *addresses;
}

}  // namespace

std::string PeerIp(absl::string_view peer) {
  if (absl::ConsumePrefix(&peer, "ipv4:")) {
    const size_t colon = peer.rfind(':');
    return colon == absl::string_view::npos ? "" : std::string(peer.substr(0, colon));
  }
  if (absl::ConsumePrefix(&peer, "ipv6:") && absl::ConsumePrefix(&peer, "[")) {
    const size_t close = peer.find(']');
    if (close == absl::string_view::npos) return "";
    absl::string_view ip = peer.substr(0, close);
    const size_t zone = ip.find('%');
    return std::string(zone == absl::string_view::npos ? ip : ip.substr(0, zone));
  }
  return "";
}

bool PeerOnThisHost(absl::string_view peer) {
  if (absl::StartsWith(peer, "unix:") || absl::StartsWith(peer, "unix-abstract:")) return true;
  const std::string ip = PeerIp(peer);
  if (ip.empty()) return false;
  in_addr v4;
  if (inet_pton(AF_INET, ip.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127) return true;
  in6_addr v6;
  if (inet_pton(AF_INET6, ip.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) {  // "::ffff:10.0.0.2": compare the IPv4 address
      char text[INET_ADDRSTRLEN] = {0};
      inet_ntop(AF_INET, &v6.s6_addr[12], text, sizeof(text));
      for (const std::string& a : LocalAddresses()) {
        if (a == text) return true;
      }
      return false;
    }
  }
  for (const std::string& a : LocalAddresses()) {
    if (a == ip) return true;
  }
  return false;
}

}  // namespace dtrain::ps
