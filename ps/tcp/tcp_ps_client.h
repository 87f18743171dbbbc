// PsInterface for a ps task on another host: the data plane over TCP lanes (ps/README.md, "the TCP lanes"), the control plane
// on another PsInterface (the gRPC client, ps/rpc/grpc_ps_client.h).
//
// Uploads (StartPush) and pulls (Pull) go over the lanes: a push's pieces are sent straight from the caller's
// buffers (one sendmsg per slice gathers the frame and the floats, nothing copied in user space), and a pull's
// fp32 pieces are received straight into the receiver's destination (the worker's parameters). Narrow wire types
// and sparse rows pass through a small scratch buffer to be converted. Everything else (Register, Initialize,
// Done, Heartbeat, GetStats, Probe, Restore) goes to `control`.
//
// Attaching: at the first data call after Register (or at Register itself with attach_at_register), the client
// asks the ps for an offer (`attach`, over the authenticated control channel) and connects its two lanes to the
// ps's host (the one in `address`) at the offered port; one log line says that this connection's data goes
// over TCP. When the lanes do not apply (a ps that offers none, --tls, a port the worker cannot reach), the client
// logs the reason and moves every data call to `control` (options.required = false: --transport=auto), or fails
// those calls with FailedPrecondition naming the reason (required: --transport=tcp). A lane that dies (the ps
// exited or restarted, the network failed) makes the call fail with Unavailable, which WorkerClient retries: the
// next call attaches again.
//
// Thread-safety: all methods may be called concurrently; one upload and one pull use the lanes at a time (they
// may overlap: a pull streams beside an upload), a second concurrent one goes to `control`.
#ifndef DTRAIN_PS_TCP_TCP_PS_CLIENT_H_
#define DTRAIN_PS_TCP_TCP_PS_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "ps/api/ps_interface.h"
#include "ps/tcp/tcp_offer.h"

namespace dtrain::ps::tcp {

// What the data calls of a client did (any thread; several clients may share one).
struct TcpCounters {
  std::atomic<int64_t> tcp_pushes{0}, tcp_pulls{0};          // over the lanes
  std::atomic<int64_t> control_pushes{0}, control_pulls{0};  // on the control PsInterface (gRPC)
  std::atomic<int64_t> bytes_sent{0}, bytes_received{0};     // tensor data over the lanes
  std::atomic<int64_t> attaches{0};
};

struct TcpClientOptions {
  // true (--transport=tcp): no fallback; data calls fail when the lanes do not apply.
  bool required = false;
  // Attach at Register (so that --transport=tcp fails at once, and the log says at once which transport a
  // connection uses); otherwise at the first data call (behind shared memory, which takes the data on one host).
  bool attach_at_register = true;
  // Non-empty: the lanes are not to be used, for this reason (e.g. the cluster uses TLS); logged once.
  std::string disabled_because;
  std::string address;  // the ps task's gRPC address "host:port": the lanes connect to its host
  int task = 0;         // the ps task's index, for logs and errors
  absl::Duration rpc_timeout = absl::Seconds(60);      // an upload's Finish; a pull's wait beyond its own timeout
  absl::Duration connect_timeout = absl::Seconds(10);  // connecting a lane and its Hello
  TcpCounters* counters = nullptr;  // not owned
};

std::unique_ptr<PsInterface> NewTcpPsClient(std::unique_ptr<PsInterface> control, TcpAttachFn attach,
                                            TcpClientOptions options);

}  // namespace dtrain::ps::tcp

#endif  // DTRAIN_PS_TCP_TCP_PS_CLIENT_H_
