// dtrain_netdelay: a link's propagation delay for emulated hosts, in user space.
//
// Why it exists: scripts/netns_hosts.sh --latency=MS adds a one-way delay to every host's link. `tc qdisc ...
// netem delay` is the usual way, but the kernels of this project's machines have no sch_netem (nor fq, sfq or
// prio); they do have NFQUEUE. So netns_hosts.sh, where netem is missing, sends every packet leaving a host
// (iptables ... -o eth0 -j NFQUEUE) to one of these daemons, started inside that host's network namespace
// (and outside its CPU quota: it is the link, not the host), which holds each packet MS and then lets it go
// on, in order, to the rest of the path (the host's tbf cap, the bridge, the other host).
//
// How it keeps the cost low: the kernel sends only each packet's metadata (NFQNL_COPY_META: no payload is
// copied to or from user space), GSO packets stay whole (NFQA_CFG_F_GSO), and since every packet is held the
// same time the held ones form a FIFO whose due part is always a prefix: one NFQNL_MSG_VERDICT_BATCH releases
// it ("every id up to N"). The queue is long (--queue_maxlen) and the socket's receive buffer large, so that
// a fast link's packets in flight fit; past that the kernel drops packets, as a full link queue would.
//
//   ip netns exec HOST dtrain_netdelay --queue=0 --delay_ms=10
//   ip netns exec HOST iptables -t mangle -A POSTROUTING -o eth0 -j NFQUEUE --queue-num 0
//
// Prints "dtrain_netdelay: queue Q, delay MS ms: ready" once bound (before that, packets sent to the queue
// are dropped), and its counts at exit. Runs until SIGTERM or SIGINT; then every held packet goes out at
// once. Needs CAP_NET_ADMIN (root). Exit codes: 0 after a signal, 1 on a netlink error, 2 on a bad flag.
#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tests/netdelay/delay_line.h"

extern "C" {
#include <libnetfilter_queue/libnetfilter_queue.h>
}

ABSL_FLAG(int, queue, 0, "The NFQUEUE number to serve (0..65535), as in iptables' --queue-num");
ABSL_FLAG(double, delay_ms, -1, "How long each packet is held, in milliseconds (0..60000; required)");
ABSL_FLAG(int, queue_maxlen, 65536, "Packets the kernel may hold for this queue before it drops more");
ABSL_FLAG(int, rcvbuf_mb, 64,
          "The netlink socket's receive buffer, MiB (the packets' metadata waiting to be read)");

namespace dtrain::netdelay {
namespace {

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

struct Options {
  uint16_t queue = 0;
  int64_t delay_ns = 0;
  uint32_t queue_maxlen = 65536;
  int rcvbuf_bytes = 64 << 20;
};

struct Counts {
  uint64_t packets = 0;
  uint64_t verdicts = 0;
  uint64_t reads = 0;
};

// One NFQUEUE bound on a netlink socket of the calling thread's network namespace. Not thread-safe.
class NfQueue {
 public:
  ~NfQueue() {
    if (nl_ != nullptr) mnl_socket_close(nl_);
  }

  absl::Status Open(const Options& o) {
    queue_ = o.queue;
    nl_ = mnl_socket_open(NETLINK_NETFILTER);
    if (nl_ == nullptr) return Errno("mnl_socket_open(NETLINK_NETFILTER)");
    if (mnl_socket_bind(nl_, 0, MNL_SOCKET_AUTOPID) < 0) return Errno("mnl_socket_bind");
    portid_ = mnl_socket_get_portid(nl_);
    const int fd = mnl_socket_get_fd(nl_);
    // FORCE: above rmem_max (root). Without room, the kernel drops the packets whose metadata does not fit.
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &o.rcvbuf_bytes, sizeof(o.rcvbuf_bytes)) < 0) {
      return Errno("setsockopt(SO_RCVBUFFORCE)");
    }
    // A full buffer is a dropped packet (counted by the kernel), not an error of ours: no ENOBUFS on reads.
    const int one = 1;
    setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof(one));

    std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
    nlmsghdr* nlh = nfq_nlmsg_put(buf.data(), NFQNL_MSG_CONFIG, queue_);
    nfq_nlmsg_cfg_put_cmd(nlh, AF_INET, NFQNL_CFG_CMD_BIND);
    if (absl::Status s = Send(nlh, "bind the queue"); !s.ok()) return s;

    nlh = nfq_nlmsg_put(buf.data(), NFQNL_MSG_CONFIG, queue_);
    nfq_nlmsg_cfg_put_params(nlh, NFQNL_COPY_META, 0);
    nfq_nlmsg_cfg_put_qmaxlen(nlh, o.queue_maxlen);
    // GSO packets whole: the kernel would otherwise segment each one before queueing it.
    mnl_attr_put_u32(nlh, NFQA_CFG_FLAGS, htonl(NFQA_CFG_F_GSO));
    mnl_attr_put_u32(nlh, NFQA_CFG_MASK, htonl(NFQA_CFG_F_GSO));
    return Send(nlh, "configure the queue (copy metadata, GSO, queue length)");
  }

  int fd() const { return mnl_socket_get_fd(nl_); }

  // Reads the messages waiting (without blocking) and adds each message's packets to the line at the time it
  // was read.
  absl::Status ReadAvailable(DelayLine* line, Counts* counts) {
    // At most kMaxReads at a time, so that a flood of arrivals cannot hold back the packets already due.
    constexpr int kMaxReads = 256;
    for (int i = 0; i < kMaxReads; ++i) {
      const ssize_t n = recv(fd(), rbuf_.data(), rbuf_.size(), MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
        if (errno == EINTR) return absl::OkStatus();
        if (errno == ENOBUFS) continue;  // NETLINK_NO_ENOBUFS unsupported: the kernel counted the drops
        return Errno("recv");
      }
      ++counts->reads;
      Batch b{line, MonotonicNs(), counts};
      const int rc = mnl_cb_run(rbuf_.data(), n, 0, portid_, &OnPacket, &b);
      if (rc < 0) return Errno("mnl_cb_run");
    }
    return absl::OkStatus();
  }

  // Lets every held packet with an id up to `last` go on.
  absl::Status AcceptUpTo(uint32_t last, Counts* counts) {
    char buf[256];
    nlmsghdr* nlh = nfq_nlmsg_put(buf, NFQNL_MSG_VERDICT_BATCH, queue_);
    nfq_nlmsg_verdict_put(nlh, static_cast<int>(last), NF_ACCEPT);
    ++counts->verdicts;
    if (mnl_socket_sendto(nl_, nlh, nlh->nlmsg_len) < 0) return Errno("send a verdict");
    return absl::OkStatus();
  }

 private:
  struct Batch {
    DelayLine* line;
    int64_t now_ns;
    Counts* counts;
  };

  static int OnPacket(const nlmsghdr* nlh, void* data) {
    nlattr* attr[NFQA_MAX + 1] = {};
    if (nfq_nlmsg_parse(nlh, attr) < 0 || attr[NFQA_PACKET_HDR] == nullptr) return MNL_CB_OK;
    const auto* ph = static_cast<const nfqnl_msg_packet_hdr*>(mnl_attr_get_payload(attr[NFQA_PACKET_HDR]));
    auto* b = static_cast<Batch*>(data);
    b->line->Add(ntohl(ph->packet_id), b->now_ns);
    ++b->counts->packets;
    return MNL_CB_OK;
  }

  // Sends one configuration message and waits (2 s at most) for the kernel's answer: an acknowledgement, or
  // the error (EBUSY: another process serves this queue; EPERM: not root).
  absl::Status Send(nlmsghdr* nlh, const char* what) {
    nlh->nlmsg_flags |= NLM_F_ACK;
    nlh->nlmsg_seq = ++seq_;
    if (mnl_socket_sendto(nl_, nlh, nlh->nlmsg_len) < 0) return Errno(what);
    pollfd pfd{fd(), POLLIN, 0};
    const int ready = poll(&pfd, 1, 2000);
    if (ready < 0) return Errno(what);
    if (ready == 0)
      return absl::DeadlineExceededError(absl::StrCat(what, ": no answer from the kernel in 2 s"));
    const ssize_t n = recv(fd(), rbuf_.data(), rbuf_.size(), 0);
    if (n < 0) return Errno(what);
    if (mnl_cb_run(rbuf_.data(), n, seq_, portid_, nullptr, nullptr) < 0) return Errno(what);
    return absl::OkStatus();
  }

  static absl::Status Errno(const std::string& what) {
    const int e = errno;
    std::string hint;
    if (e == EPERM) hint = " (needs CAP_NET_ADMIN: run as root)";
    if (e == EPROTONOSUPPORT || e == ENOENT) hint = " (is nfnetlink_queue in this kernel?)";
    return absl::InternalError(absl::StrCat(what, ": ", std::strerror(e), hint));
  }

  mnl_socket* nl_ = nullptr;
  uint32_t portid_ = 0;
  uint16_t queue_ = 0;
  uint32_t seq_ = 0;
  std::vector<char> rbuf_ = std::vector<char>(MNL_SOCKET_BUFFER_SIZE);
};

absl::Status Serve(const Options& o) {
  NfQueue q;
  if (absl::Status s = q.Open(o); !s.ok()) return s;
  // Sleep as exactly as the kernel can: the default 50 us slack would add to every release.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  std::printf("dtrain_netdelay: queue %u, delay %.3f ms: ready\n", o.queue, o.delay_ns / 1e6);
  std::fflush(stdout);

  // The signals arrive only inside ppoll, so that a stop is never missed between the check and the sleep.
  sigset_t blocked, during_poll;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGTERM);
  sigaddset(&blocked, SIGINT);
  sigprocmask(SIG_BLOCK, &blocked, &during_poll);
  sigdelset(&during_poll, SIGTERM);
  sigdelset(&during_poll, SIGINT);

  DelayLine line(o.delay_ns);
  Counts counts;
  while (!g_stop) {
    if (absl::Status s = q.ReadAvailable(&line, &counts); !s.ok()) return s;
    if (std::optional<uint32_t> last = line.TakeDue(MonotonicNs())) {
      if (absl::Status s = q.AcceptUpTo(*last, &counts); !s.ok()) return s;
    }
    // Until the oldest held packet is due or another arrives; with none held, a second at most.
    const int64_t due = line.NextDueNs();
    int64_t wait_ns = 1'000'000'000;
    if (due >= 0) wait_ns = std::max<int64_t>(0, due - MonotonicNs());
    // A zero wait still goes through ppoll: the only place a stop signal is let in.
    timespec ts{static_cast<time_t>(wait_ns / 1'000'000'000), static_cast<long>(wait_ns % 1'000'000'000)};
    pollfd pfd{q.fd(), POLLIN, 0};
    if (ppoll(&pfd, 1, &ts, &during_poll) < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("ppoll: ", std::strerror(errno)));
    }
  }
  if (std::optional<uint32_t> last = line.TakeAll()) {
    if (absl::Status s = q.AcceptUpTo(*last, &counts); !s.ok()) return s;
  }
  std::printf(
      "dtrain_netdelay: queue %u: %llu packets delayed, %llu verdicts, %llu reads, at most %zu held\n",
      o.queue, static_cast<unsigned long long>(counts.packets),
      static_cast<unsigned long long>(counts.verdicts), static_cast<unsigned long long>(counts.reads),
      line.max_size());
  return absl::OkStatus();
}

}  // namespace
}  // namespace dtrain::netdelay

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "holds every packet of an NFQUEUE a fixed time: dtrain_netdelay --queue=0 --delay_ms=10");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr, "dtrain_netdelay: unexpected argument '%s'\n", rest[1]);
    return 2;
  }
  dtrain::netdelay::Options o;
  const int queue = absl::GetFlag(FLAGS_queue);
  const double delay_ms = absl::GetFlag(FLAGS_delay_ms);
  const int maxlen = absl::GetFlag(FLAGS_queue_maxlen);
  const int rcvbuf_mb = absl::GetFlag(FLAGS_rcvbuf_mb);
  if (queue < 0 || queue > 65535) {
    std::fprintf(stderr, "dtrain_netdelay: --queue=%d is not a queue number (0..65535)\n", queue);
    return 2;
  }
  if (!(delay_ms >= 0 && delay_ms <= 60000)) {
    std::fprintf(stderr, "dtrain_netdelay: --delay_ms=%g must be given, in 0..60000\n", delay_ms);
    return 2;
  }
  if (maxlen < 1) {
    std::fprintf(stderr, "dtrain_netdelay: --queue_maxlen=%d must be positive\n", maxlen);
    return 2;
  }
  if (rcvbuf_mb < 1 || rcvbuf_mb > 1024) {
    std::fprintf(stderr, "dtrain_netdelay: --rcvbuf_mb=%d must be in 1..1024\n", rcvbuf_mb);
    return 2;
  }
  o.queue = static_cast<uint16_t>(queue);
  o.delay_ns = std::llround(delay_ms * 1e6);
  o.queue_maxlen = static_cast<uint32_t>(maxlen);
  o.rcvbuf_bytes = rcvbuf_mb << 20;

  struct sigaction sa = {};
  sa.sa_handler = dtrain::netdelay::OnSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  absl::Status s = dtrain::netdelay::Serve(o);
  if (!s.ok()) {
    std::fprintf(stderr, "dtrain_netdelay: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
