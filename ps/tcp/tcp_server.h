// The ps task's side of the TCP data plane (ps/README.md, "the TCP lanes"): serves the uploads and pulls of workers on other
// hosts over TCP lanes (ps/tcp/tcp_lane.h) to a PsInterface (the task's ParameterServer). Everything else
// (Register, Initialize, heartbeats, Done, statistics, checkpoints' Probe and Restore) stays on gRPC, which also
// hands out the offers (Offer) that let a worker in.
//
// Per attached worker: an attachment with two lanes, one for its uploads and one for its pulls, each served by its
// own thread, so that a pull can stream the values of a push that is still arriving (the early apply). A push's
// fp32 floats are received straight into a receive block of the attachment and lent to the ParameterServer
// where they lie (SliceUpload::WriteInPlace): no copy after the socket's. A block is reused only once nothing
// refers to it any more (its step applied or dropped), so a worker cannot change gradients the ps has checked;
// the blocks of one attachment hold at most `max_receive_bytes`. A pull's values are copied once, into the
// lane's send buffer, and sent in frames of about a megabyte.
//
// A worker that attaches again ends its previous attachment first (its calls return before the new one is
// offered). When either lane of an attachment closes (the worker exited, was killed, gave up on a call, or its
// host went silent: TCP keepalive) the attachment ends: an upload in progress is dropped unfinished (nothing of
// it is committed), a pull in progress is cancelled.
//
// A connection must present a valid ticket of an offer in its first frame within `hello_timeout`, or it is closed;
// nothing else is read from it.
//
// Thread-safety: Offer, Shutdown, counters and port may be called from any thread.
#ifndef DTRAIN_PS_TCP_TCP_SERVER_H_
#define DTRAIN_PS_TCP_TCP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "ps/api/ps_interface.h"
#include "ps/tcp/tcp_offer.h"

namespace dtrain::ps::tcp {

struct TcpServerOptions {
  int task_index = 0;  // for logs
  std::string host;    // where to listen: the gRPC server's host ("" or "0.0.0.0": every address)
  int port = 0;        // 0: any free port (the offers say which)
  // Cancelled when the ps shuts down: pulls in flight end at once (may be null).
  Cancellation* shutdown = nullptr;
  int max_lanes = 256;  // connections served at once; more are closed at once
  // The most rows of one table a pull may ask for (ParameterServerOptions::max_pull_rows), checked before its
  // ids are read off the connection (a pull past it is answered with the refusal, and the lane closed).
  int64_t max_pull_rows = int64_t{1} << 22;
  // The most rows of one table one push frame may carry (ParameterServerOptions::max_push_rows), checked before
  // anything is allocated for them (the upload then fails by name; the lane goes on).
  int64_t max_push_rows = int64_t{1} << 22;
  absl::Duration hello_timeout = absl::Seconds(2);
  absl::Duration ticket_ttl = absl::Seconds(30);
  // An upload silent for longer is dropped unfinished and its lane closed.
  absl::Duration upload_timeout = absl::Seconds(120);
  // The received gradients one attachment may hold at once (the blocks the ps reads them from until their step is
  // applied). A push past it fails with ResourceExhausted naming this limit.
  int64_t max_receive_bytes = int64_t{8} << 30;
  // Whose pushes may be applied as they arrive when they ask (PushHeader::apply_early): workers on other hosts,
  // workers on this one (dtrain_ps --apply_early: auto grants the first only).
  bool apply_early_remote = true;
  bool apply_early_local = false;
  // Whether a peer's IP address is one of this host's (null: none is).
  std::function<bool(const std::string& ip)> is_local_ip;
};

struct TcpServerCounters {
  int64_t offers = 0;
  int64_t lanes_accepted = 0;
  int64_t lanes_refused = 0;  // no valid ticket, too many, malformed Hello, silence
  int64_t active_lanes = 0;
  int64_t active_attachments = 0;
  // Open when their lane closed or fell silent: dropped, never acknowledged; nothing of them applied, except under
  // async --nonfinite=apply, whose slices are applied as each arrives whole (PushAccounting::partly_applied).
  int64_t uploads_cut_off = 0;
  int64_t bytes_received = 0;   // by lanes that have closed, and the open ones
  int64_t bytes_sent = 0;
};

class TcpServer {
 public:
  // Listens on a fresh port. `ps` must outlive the server. Unavailable when it cannot listen.
  static absl::StatusOr<std::unique_ptr<TcpServer>> Start(PsInterface* ps, TcpServerOptions options);
  ~TcpServer();  // Shutdown()

  // An offer for worker `request.worker_id` (called for an authenticated gRPC request). Ends the worker's
  // previous attachment first. Unavailable after Shutdown or when the previous attachment does not end.
  absl::StatusOr<TcpOffer> Offer(const TcpAttachRequest& request);
  // Closes the port and every lane, cancels pulls in flight, waits for the lanes' threads.
  void Shutdown();
  TcpServerCounters counters() const;
  int port() const;

  class Impl;

 private:
  explicit TcpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::ps::tcp

#endif  // DTRAIN_PS_TCP_TCP_SERVER_H_
