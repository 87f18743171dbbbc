// dtrain_hostile_peer's lane scenarios (tests/hostile_lanes.h).
#include "tests/hostile_lanes.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ps/shm/shm_frame.h"
#include "ps/shm/shm_lane.h"
#include "ps/shm/shm_segment.h"
#include "ps/tcp/tcp_frame.h"
#include "ps/tcp/tcp_lane.h"

namespace dtrain::hostile {
namespace {

namespace shm = ::dtrain::ps::shm;
namespace tcp = ::dtrain::ps::tcp;

// How long a stranger's connection may stay open: the ps's hello timeout (2 s) and a margin for a loaded
// machine (a sanitizer build of the ps beside two workers on one core took over 5 s to close one once).
constexpr absl::Duration kCloseWithin = absl::Seconds(10);
// How long a worker's lane may take to answer a refused push or pull (or close).
constexpr absl::Duration kAnswerWithin = absl::Seconds(5);
constexpr int64_t kSegmentBytes = 64 << 10;

// ---- strangers: raw sockets -------------------------------------------------------------------------------

// One raw connection, what it sent, and what came back.
struct Raw {
  std::string sub;
  int fd = -1;
  std::string received;
  bool closed = false;
};

int ConnectUnix(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(addr.sun_path) - 1);
  std::memcpy(addr.sun_path + 1, name.data(), n);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr),
              static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int ConnectTcp(const std::string& host, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  (void)host;  // the lane port is the ps's, on this host (the suite runs beside it)
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `bytes` as one packet (seqpacket) or a stream, with `pass_fd` attached when >= 0.
bool SendBytes(int fd, const std::string& bytes, int pass_fd = -1) {
  if (bytes.empty()) return true;
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (pass_fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  }
  return sendmsg(fd, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

// Waits until every connection is closed by the ps (or `within` passed), collecting what each received.
void AwaitClosed(std::vector<Raw>* conns, absl::Duration within) {
  const absl::Time deadline = absl::Now() + within;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Raw*> open;
    for (Raw& c : *conns) {
      if (c.fd >= 0 && !c.closed) {
        fds.push_back({c.fd, POLLIN, 0});
        open.push_back(&c);
      }
    }
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (open.empty() || left <= 0) return;
    if (poll(fds.data(), fds.size(), static_cast<int>(left)) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = recv(fds[i].fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        open[i]->received.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        open[i]->closed = true;
      }
    }
  }
}

// The status of the Welcome in what a refused connection received (empty when none came).
std::string WelcomeOf(const std::string& received, bool tcp_lane) {
  absl::StatusOr<shm::PushResult> r = absl::DataLossError("none");
  if (tcp_lane) {
    if (received.size() < tcp::kTcpHeaderBytes) return "";
    absl::StatusOr<tcp::TcpFrameHeader> h = tcp::DecodeTcpHeader(received.substr(0, tcp::kTcpHeaderBytes));
    if (!h.ok() || h->type != tcp::TcpFrameType::kWelcome) return "something else";
    r = shm::DecodePushResult(received.substr(tcp::kTcpHeaderBytes, h->payload_bytes));
  } else {
    if (received.empty()) return "";
    absl::StatusOr<shm::Frame> f = shm::DecodeFrame(received);
    if (!f.ok() || f->type != shm::FrameType::kWelcome) return "something else";
    r = shm::DecodePushResult(f->payload);
  }
  return r.ok() ? absl::StatusCodeToString(r->status.code()) : "a malformed Welcome";
}

// Counts each connection: refused when the ps closed it (after a Welcome that refuses, if any).
void CountClosed(const std::vector<Raw>& conns, bool tcp_lane, Tally* tally) {
  for (const Raw& c : conns) {
    ++tally->sent;
    if (c.fd < 0) {
      tally->Gone(absl::StrCat(c.sub, ":could not connect"));
      continue;
    }
    const std::string welcome = WelcomeOf(c.received, tcp_lane);
    const std::string answer =
        absl::StrCat(c.sub, ":", welcome.empty() ? "" : absl::StrCat("welcome ", welcome, " then "),
                     c.closed ? "closed" : "still open");
    tally->Count(
        answer,
        c.closed && (welcome.empty() || welcome == "PERMISSION_DENIED" || welcome == "INVALID_ARGUMENT" ||
                     welcome == "DATA_LOSS" || welcome == "DEADLINE_EXCEEDED"),
        c.sub);
    close(c.fd);
  }
}

std::string RandomTicket() {
  static std::mt19937_64 rng(std::random_device{}());
  return absl::StrCat(absl::Hex(rng(), absl::kZeroPad16), absl::Hex(rng(), absl::kZeroPad16));
}

// ---- workers with a session: real lanes -------------------------------------------------------------------

// Reads frames until one of `want` (its PushResult status) or the lane's end; "closed", or "no answer" at the
// deadline (an acceptance: a lane that neither answers nor closes holds the ps's resources).
std::string AwaitResult(shm::Lane* lane, shm::FrameType want) {
  const absl::Time deadline = absl::Now() + kAnswerWithin;
  for (;;) {
    absl::StatusOr<shm::Frame> f = lane->Receive(deadline);
    if (absl::IsDeadlineExceeded(f.status())) return "no answer";
    if (!f.ok()) return "closed";
    if (f->type != want) continue;
    absl::StatusOr<shm::PushResult> r = shm::DecodePushResult(f->payload);
    if (!r.ok()) return "a malformed result";
    return absl::StatusCodeToString(r->status.code());
  }
}

std::string AwaitResult(tcp::TcpLane* lane, tcp::TcpFrameType want) {
  const absl::Time deadline = absl::Now() + kAnswerWithin;
  for (;;) {
    absl::StatusOr<tcp::TcpLane::Frame> f = lane->Receive(deadline);
    if (absl::IsDeadlineExceeded(f.status())) return "no answer";
    if (!f.ok()) return "closed";
    if (f->bulk_bytes > 0 && !lane->SkipBulk(deadline).ok()) return "closed";
    if (f->type != want) continue;
    absl::StatusOr<shm::PushResult> r = shm::DecodePushResult(f->payload);
    if (!r.ok()) return "a malformed result";
    return absl::StatusCodeToString(r->status.code());
  }
}

bool IsRefusal(const std::string& answer) { return answer != "OK" && answer != "no answer"; }

struct ShmAttachment {
  std::unique_ptr<shm::Lane> push, pull;
  std::string welcome;  // the push lane's Welcome (its status), "OK" when both lanes got in
};

ShmAttachment AttachShm(const shm::ShmOffer& offer, int hello_worker) {
  ShmAttachment a;
  const absl::Time deadline = absl::Now() + kCloseWithin;
  absl::StatusOr<std::unique_ptr<shm::Lane>> push = shm::Lane::Connect(offer.socket_name);
  absl::StatusOr<std::unique_ptr<shm::Lane>> pull = shm::Lane::Connect(offer.socket_name);
  if (!push.ok() || !pull.ok()) {
    a.welcome = "could not connect";
    return a;
  }
  a.push = *std::move(push);
  a.pull = *std::move(pull);
  a.push
      ->Send(shm::FrameType::kHello,
             shm::EncodeHello({shm::LaneKind::kPush, hello_worker, offer.push_ticket}), -1, deadline)
      .IgnoreError();
  a.pull
      ->Send(shm::FrameType::kHello,
             shm::EncodeHello({shm::LaneKind::kPull, hello_worker, offer.pull_ticket}), -1, deadline)
      .IgnoreError();
  a.welcome = AwaitResult(a.push.get(), shm::FrameType::kWelcome);
  const std::string pull_welcome = AwaitResult(a.pull.get(), shm::FrameType::kWelcome);
  if (a.welcome == "OK" && pull_welcome != "OK") a.welcome = pull_welcome;
  return a;
}

ps::PushHeader Header(uint64_t session) {
  static std::mt19937_64 rng(std::random_device{}());
  ps::PushHeader h;
  h.worker_id = 0;
  h.session = session;
  h.request_id = rng();
  h.commit = true;
  return h;
}

}  // namespace

absl::StatusOr<std::string> FindShmSocket(int task, int pid) {
  std::ifstream in("/proc/net/unix");
  const std::string prefix = absl::StrCat("@dtrain-ps", task, "-", pid, "-");
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find(prefix);
    if (at != std::string::npos) return line.substr(at + 1);
  }
  return absl::NotFoundError(absl::StrCat("no abstract socket ", prefix, "* in /proc/net/unix"));
}

void StrangerShmRound(const std::string& socket, Tally* tally) {
  std::vector<Raw> conns;
  auto open = [&](const std::string& sub, const std::string& bytes, int pass_fd = -1) {
    Raw r;
    r.sub = sub;
    r.fd = ConnectUnix(socket);
    if (r.fd >= 0) SendBytes(r.fd, bytes, pass_fd);
    conns.push_back(std::move(r));
  };
  const std::string hello =
      shm::EncodeFrame(shm::FrameType::kHello, shm::EncodeHello({shm::LaneKind::kPush, 0, RandomTicket()}));
  open("silent", "");
  open("half_frame", hello.substr(0, hello.size() / 2));
  std::string absurd = hello.substr(0, shm::kFrameHeaderBytes);
  const uint32_t huge = 0x7fffffff;
  std::memcpy(&absurd[8], &huge, sizeof(huge));  // the header's payload length
  open("absurd_length", absurd);
  open("made_up_ticket", hello);
  absl::StatusOr<std::unique_ptr<shm::ShmSegment>> seg = shm::ShmSegment::Create(4096);
  open("segment_before_hello", shm::EncodeFrame(shm::FrameType::kSegment, shm::EncodeSegment({1, 4096})),
       seg.ok() ? (*seg)->fd() : -1);
  AwaitClosed(&conns, kCloseWithin);
  CountClosed(conns, /*tcp_lane=*/false, tally);
}

void StrangerTcpRound(const std::string& host, int port, Tally* tally) {
  std::vector<Raw> conns;
  auto open = [&](const std::string& sub, const std::string& bytes) {
    Raw r;
    r.sub = sub;
    r.fd = ConnectTcp(host, port);
    if (r.fd >= 0) SendBytes(r.fd, bytes);
    conns.push_back(std::move(r));
  };
  const std::string payload = shm::EncodeHello({shm::LaneKind::kPush, 0, RandomTicket()});
  const std::string hello = tcp::EncodeTcpHeader(tcp::TcpFrameType::kHello, payload, 0) + payload;
  open("silent", "");
  open("half_header", hello.substr(0, tcp::kTcpHeaderBytes / 2));
  std::string absurd = hello.substr(0, tcp::kTcpHeaderBytes);
  const uint32_t huge = 0x7fffffff;
  std::memcpy(&absurd[8], &huge, sizeof(huge));  // payload bytes
  open("absurd_payload_length", absurd);
  open("bulk_on_hello",
       tcp::EncodeTcpHeader(tcp::TcpFrameType::kHello, payload, uint64_t{1} << 40) + payload);
  open("made_up_ticket", hello);
  AwaitClosed(&conns, kCloseWithin);
  CountClosed(conns, /*tcp_lane=*/true, tally);
}

void OwnShmRound(const std::function<absl::StatusOr<ps::shm::ShmOffer>()>& offer, uint64_t session,
                 int64_t max_push_rows, Tally* tally) {
  absl::StatusOr<std::unique_ptr<shm::ShmSegment>> seg = shm::ShmSegment::Create(kSegmentBytes);
  if (!seg.ok()) {
    ++tally->sent;
    tally->Gone(absl::StrCat("no segment (", seg.status().message(), ")"));
    return;
  }
  std::memset((*seg)->data(), 0, kSegmentBytes);
  // One sub-attack on a fresh attachment: `send` sends its frames; the answer is awaited on the push lane (a
  // PushResult) or the pull lane (a PullEnd).
  auto attack = [&](const std::string& sub, bool on_pull, int hello_worker,
                    const std::function<void(ShmAttachment&, absl::Time)>& send) {
    ++tally->sent;
    absl::StatusOr<shm::ShmOffer> o = offer();
    if (!o.ok()) {
      tally->Gone(absl::StrCat(sub, ":no offer ", absl::StatusCodeToString(o.status().code())));
      return;
    }
    ShmAttachment a = AttachShm(*o, hello_worker);
    if (a.welcome != "OK") {
      tally->Count(absl::StrCat(sub, ":welcome ", a.welcome), hello_worker != 0 && IsRefusal(a.welcome), sub);
      return;
    }
    if (hello_worker != 0) {
      tally->Count(absl::StrCat(sub, ":let in"), false, sub);
      return;
    }
    const absl::Time deadline = absl::Now() + kCloseWithin;
    a.push->Send(shm::FrameType::kSegment, shm::EncodeSegment({1, kSegmentBytes}), (*seg)->fd(), deadline)
        .IgnoreError();
    send(a, deadline);
    const std::string answer = on_pull ? AwaitResult(a.pull.get(), shm::FrameType::kPullEnd)
                                       : AwaitResult(a.push.get(), shm::FrameType::kPushResult);
    tally->Count(absl::StrCat(sub, ":", answer), IsRefusal(answer), sub);
  };
  auto push = [&](const std::string& frame_type_name, shm::FrameType type, const std::string& payload) {
    return [=](ShmAttachment& a, absl::Time deadline) {
      (void)frame_type_name;
      a.push->Send(shm::FrameType::kPushBegin, shm::EncodePushHeader(Header(session)), -1, deadline)
          .IgnoreError();
      a.push->Send(type, payload, -1, deadline).IgnoreError();
      a.push->Send(shm::FrameType::kPushFinish, "", -1, deadline).IgnoreError();
    };
  };
  attack("other_identity", false, 1, nullptr);
  shm::DataRef past;
  past.key = 0;
  past.n = 1000;
  past.segment = 1;
  past.at = kSegmentBytes - 100;
  attack("past_segment", false, 0, push("data", shm::FrameType::kPushData, shm::EncodeDataRef(past)));
  shm::DataRef unsent = past;
  unsent.segment = 9;
  unsent.at = 0;
  attack("segment_never_sent", false, 0, push("data", shm::FrameType::kPushData, shm::EncodeDataRef(unsent)));
  shm::RowsRef rows;
  rows.table = 0;
  rows.n = max_push_rows + 1;
  rows.dim = 4;
  rows.segment = 1;
  rows.ids_at = 0;
  rows.rows_at = 16 << 10;
  attack("rows_past_max_push_rows", false, 0,
         push("rows", shm::FrameType::kPushRows, shm::EncodeRowsRef(rows)));
  rows.n = int64_t{1} << 40;
  attack("rows_2^40", false, 0, push("rows", shm::FrameType::kPushRows, shm::EncodeRowsRef(rows)));
  auto pull = [&](shm::PullOrder order) {
    order.request.worker_id = 0;
    order.request.session = session;
    order.request.timeout_ms = 0;
    return [order](ShmAttachment& a, absl::Time deadline) {
      a.pull->Send(shm::FrameType::kPullRequest, shm::EncodePullOrder(order), -1, deadline).IgnoreError();
    };
  };
  shm::PullOrder ids;
  ids.sparse.push_back({0, int64_t{1} << 40, 4, 1, 0, 0});
  attack("pull_ids_2^40", true, 0, pull(ids));
  shm::PullOrder dst;
  dst.destinations.push_back({0, shm::Destination::Kind::kInPlace, 1, kSegmentBytes - 8, 1000});
  dst.destinations.push_back({1, shm::Destination::Kind::kInPlace, 1, 0, 10});
  attack("pull_past_segment", true, 0, pull(dst));
}

void OwnTcpRound(const std::function<absl::StatusOr<ps::tcp::TcpOffer>()>& offer, const std::string& host,
                 uint64_t session, int64_t max_push_rows, Tally* tally) {
  // `silent`: the ps is expected to read past the bytes the frame claims before it answers (nothing is
  // allocated for them), so no answer within the wait is the refusal; the lane is then closed unfinished.
  auto attack = [&](const std::string& sub, bool on_pull, int hello_worker,
                    const std::function<void(tcp::TcpLane*, absl::Time)>& send, bool silent = false) {
    ++tally->sent;
    absl::StatusOr<tcp::TcpOffer> o = offer();
    if (!o.ok()) {
      tally->Gone(absl::StrCat(sub, ":no offer ", absl::StatusCodeToString(o.status().code())));
      return;
    }
    const absl::Time deadline = absl::Now() + kCloseWithin;
    absl::StatusOr<std::unique_ptr<tcp::TcpLane>> lane = tcp::TcpLane::Connect(host, o->port, deadline);
    if (!lane.ok()) {
      tally->Gone(absl::StrCat(sub, ":could not connect"));
      return;
    }
    const shm::LaneKind kind = on_pull ? shm::LaneKind::kPull : shm::LaneKind::kPush;
    (*lane)
        ->Send(tcp::TcpFrameType::kHello,
               shm::EncodeHello({kind, hello_worker, on_pull ? o->pull_ticket : o->push_ticket}), nullptr, 0,
               deadline)
        .IgnoreError();
    const std::string welcome = AwaitResult(lane->get(), tcp::TcpFrameType::kWelcome);
    if (hello_worker != 0 || welcome != "OK") {
      tally->Count(absl::StrCat(sub, ":welcome ", welcome), hello_worker != 0 && IsRefusal(welcome), sub);
      return;
    }
    send(lane->get(), deadline);
    const std::string answer =
        AwaitResult(lane->get(), on_pull ? tcp::TcpFrameType::kPullEnd : tcp::TcpFrameType::kPushResult);
    if (silent) {
      tally->Count(absl::StrCat(sub, ":", answer == "no answer" ? "reading past the claimed bytes" : answer),
                   answer == "no answer" || (answer != "OK" && IsRefusal(answer)), sub);
      return;
    }
    tally->Count(absl::StrCat(sub, ":", answer), IsRefusal(answer), sub);
  };
  // Raw frames: a header claiming `bulk` bytes after its payload, and only `sent_bulk` of them.
  auto raw = [](tcp::TcpLane* lane, tcp::TcpFrameType type, const std::string& payload, uint64_t bulk,
                const std::string& sent_bulk, absl::Time deadline) {
    const std::string bytes = tcp::EncodeTcpHeader(type, payload, bulk) + payload + sent_bulk;
    tcp::TcpLane::Bulk part{bytes.data(), bytes.size()};
    lane->SendRaw(&part, 1, deadline).IgnoreError();
  };
  auto begin = [session](tcp::TcpLane* lane, absl::Time deadline) {
    lane->Send(tcp::TcpFrameType::kPushBegin, shm::EncodePushHeader(Header(session)), nullptr, 0, deadline)
        .IgnoreError();
  };
  attack("other_identity", false, 1, nullptr);
  attack("rows_past_max_push_rows", false, 0, [&](tcp::TcpLane* lane, absl::Time deadline) {
    begin(lane, deadline);
    shm::RowsRef r;
    r.n = max_push_rows + 1;
    r.dim = 4;
    const std::string bulk(static_cast<size_t>(r.n) * (8 + 16), '\0');  // ids 0, rows 0
    raw(lane, tcp::TcpFrameType::kPushRows, shm::EncodeRowsRef(r), bulk.size(), bulk, deadline);
    lane->Send(tcp::TcpFrameType::kPushFinish, "", nullptr, 0, deadline).IgnoreError();
  });
  attack(
      "rows_2^28_claimed", false, 0,
      [&](tcp::TcpLane* lane, absl::Time deadline) {
        begin(lane, deadline);
        shm::RowsRef r;
        r.n = int64_t{1} << 28;
        r.dim = 4;
        raw(lane, tcp::TcpFrameType::kPushRows, shm::EncodeRowsRef(r), static_cast<uint64_t>(r.n) * 24,
            std::string(1 << 20, '\0'), deadline);
      },
      /*silent=*/true);
  attack("pull_ids_2^28_claimed", true, 0, [&](tcp::TcpLane* lane, absl::Time deadline) {
    shm::PullOrder order;
    order.request.worker_id = 0;
    order.request.session = session;
    order.sparse.push_back({0, int64_t{1} << 28, 4, 0, 0, 0});
    raw(lane, tcp::TcpFrameType::kPullRequest, shm::EncodePullOrder(order), uint64_t{8} << 28, "", deadline);
  });
  attack("bulk_not_its_size", false, 0, [&](tcp::TcpLane* lane, absl::Time deadline) {
    begin(lane, deadline);
    tcp::Piece p;
    p.key = 1;
    p.n = 10;
    raw(lane, tcp::TcpFrameType::kPushData, tcp::EncodeSlicePiece(p), 12, std::string(12, '\0'), deadline);
  });
  attack("absurd_payload_length", false, 0, [&](tcp::TcpLane* lane, absl::Time deadline) {
    begin(lane, deadline);
    std::string h = tcp::EncodeTcpHeader(tcp::TcpFrameType::kPushFinish, "", 0);
    const uint32_t huge = 0x7fffffff;
    std::memcpy(&h[8], &huge, sizeof(huge));
    tcp::TcpLane::Bulk part{h.data(), h.size()};
    lane->SendRaw(&part, 1, deadline).IgnoreError();
  });
}

}  // namespace dtrain::hostile
