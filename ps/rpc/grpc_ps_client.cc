#include "ps/rpc/grpc_ps_client.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/strings/str_cat.h"
#include "common/cancellation.h"
#include "common/status_macros.h"
#include "dtrain.pb.h"
#include "ps/rpc/grpc_methods.h"
#include "ps/rpc/tensor_coding.h"
#include "ps/rpc/wire_format.h"

namespace dtrain::ps {
namespace {

namespace pb = ::dtrain::wire;
using grpc::internal::RpcMethod;

// Registers `fn` with `cancel` (may be null) for the lifetime of the object.
class CancelScope {
 public:
  CancelScope(Cancellation* cancel, std::function<void()> fn) : cancel_(cancel) {
    if (cancel_ != nullptr) id_ = cancel_->Register(std::move(fn));
  }
  ~CancelScope() {
    if (cancel_ != nullptr) cancel_->Deregister(id_);
  }

 private:
  Cancellation* cancel_;
  int64_t id_ = 0;
};

// An upload over a client-streaming call. Slice data is referenced, not copied: it must stay unchanged until
// Finish returns (which waits until gRPC has let go of it).
class GrpcUpload : public SliceUpload {
 public:
  GrpcUpload(const std::string& address, const char* what, const GrpcClientOptions& options, Cancellation* cancel)
      : address_(address), what_(what), counters_(options.counters),
        cancel_scope_(cancel, [this] { context_.TryCancel(); }) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
    AttachCallToken(options.security, &context_);
  }
  ~GrpcUpload() override {
    if (writer_ && !finished_) {
      context_.TryCancel();
      writer_->Finish().ok();
    }
    // gRPC may still hold references to the caller's memory until the call is torn down.
    tracker_.WaitIdle(absl::Now() + absl::Seconds(5));
  }

  // Opens the stream and sends the first message (the header, or the worker id).
  template <typename Response>
  absl::Status Open(const std::shared_ptr<grpc::Channel>& channel, const RpcMethod& method, Response* response,
                    coding::MessageBuilder first) {
    writer_.reset(grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel.get(), method, &context_,
                                                                                 response));
    return Send(first.Build());
  }

  int64_t ChunkValues(WireDtype dtype) const override {
    return std::max<int64_t>(1, coding::kMaxChunkBytes / DtypeBytes(dtype));
  }

  absl::Status Write(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) override {
    const int el = DtypeBytes(dtype);
    const int64_t per_chunk = ChunkValues(dtype);
    const char* bytes = static_cast<const char*>(data);
    for (int64_t done = 0; done < n || (n == 0 && done == 0);) {
      const int64_t m = std::min(per_chunk, n - done);
      coding::MessageBuilder b;
      b.AddChunkRef(key, offset + done, dtype, bytes + done * el, m, &tracker_);
      RETURN_IF_ERROR(Send(b.Build()));
      done += std::max<int64_t>(m, 1);
    }
    return absl::OkStatus();
  }

  absl::Status WriteSparse(uint32_t table, const int64_t* ids, int64_t n, int dim, WireDtype dtype,
                           const void* rows) override {
    if (dim < 1 || n < 0) return absl::InvalidArgumentError(absl::StrCat("sparse rows of width ", dim));
    const int64_t row_bytes = int64_t{dim} * DtypeBytes(dtype);
    const int64_t per_chunk = std::max<int64_t>(1, coding::kMaxChunkBytes / (row_bytes + 8));
    const char* bytes = static_cast<const char*>(rows);
    for (int64_t done = 0; done < n;) {
      const int64_t m = std::min(per_chunk, n - done);
      coding::MessageBuilder b;
      b.AddRowGradientsRef(table, ids + done, m, dim, dtype, bytes + done * row_bytes, &tracker_);
      RETURN_IF_ERROR(Send(b.Build()));
      done += m;
    }
    return absl::OkStatus();
  }

  absl::Status SetGradientNorm(double norm) override {
    ::dtrain::wire::PushTrailer trailer;
    trailer.set_gradient_norm(norm);
    coding::MessageBuilder b;
    b.SetTrailer(trailer.SerializeAsString());
    return Send(b.Build());
  }

  absl::StatusOr<PushResponse> Finish() override {
    finished_ = true;
    writer_->WritesDone();
    absl::Status s = wire::FromGrpc(writer_->Finish());
    tracker_.WaitIdle(absl::Now() + absl::Seconds(5));
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("ps ", address_, ": ", what_, ": ", s.message()));
    return result_();
  }

  std::function<PushResponse()> result_;

 private:
  absl::Status Send(grpc::ByteBuffer message) {
    if (counters_ != nullptr) counters_->sent += static_cast<int64_t>(message.Length());
    if (writer_->Write(message)) return absl::OkStatus();
    // The stream is broken: the server's status says why.
    finished_ = true;
    absl::Status s = wire::FromGrpc(writer_->Finish());
    if (s.ok()) s = absl::UnavailableError("stream closed");
    return absl::Status(s.code(), absl::StrCat("ps ", address_, ": ", what_, ": ", s.message()));
  }

  const std::string address_;
  const char* what_;
  WireCounters* const counters_;
  grpc::ClientContext context_;
  CancelScope cancel_scope_;
  coding::SendTracker tracker_;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer_;
  bool finished_ = false;
};

// A push striped by slice over several streams: slice key k goes on stream k mod N (stream 0 is the Push stream,
// which also carries the sparse rows and the trailer; the others are PushPart streams). Finish ends the part
// streams first: the ps finishes the upload when the Push stream ends, and only if every part arrived whole.
class StripedUpload : public SliceUpload {
 public:
  explicit StripedUpload(std::vector<std::unique_ptr<GrpcUpload>> streams) : streams_(std::move(streams)) {}

  absl::Status Write(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) override {
    return streams_[key % streams_.size()]->Write(key, offset, n, dtype, data);
  }
  int64_t ChunkValues(WireDtype dtype) const override { return streams_[0]->ChunkValues(dtype); }
  absl::Status WriteSparse(uint32_t table, const int64_t* ids, int64_t n, int dim, WireDtype dtype,
                           const void* rows) override {
    return streams_[0]->WriteSparse(table, ids, n, dim, dtype, rows);
  }
  absl::Status SetGradientNorm(double norm) override { return streams_[0]->SetGradientNorm(norm); }
  absl::StatusOr<PushResponse> Finish() override {
    for (size_t k = 1; k < streams_.size(); ++k) {
      // A part that failed cancels the Push stream (destroyed unfinished): nothing of the push is applied.
      RETURN_IF_ERROR(streams_[k]->Finish().status());
    }
    return streams_[0]->Finish();
  }

 private:
  std::vector<std::unique_ptr<GrpcUpload>> streams_;
};

// Calls of several pulls into one PullReceiver, one at a time (the data is decoded into the receiver's buffers
// outside the lock: the parts deliver different slices). The first header to arrive is delivered; the parts
// of a sync pull all read the same step.
class SerializedReceiver : public PullReceiver {
 public:
  explicit SerializedReceiver(PullReceiver* receiver) : receiver_(receiver) {}
  absl::Status OnHeader(const PullHeader& header) override {
    absl::MutexLock lock(&mu_);
    if (header_seen_) return absl::OkStatus();
    header_seen_ = true;
    absl::Status s = receiver_->OnHeader(header);
    if (s.ok()) header_arrived_.Notify();
    return s;
  }
  // Whether a header was delivered (waiting up to `timeout` for one).
  bool WaitForHeader(absl::Duration timeout) { return header_arrived_.WaitForNotificationWithTimeout(timeout); }
  absl::StatusOr<Buffer> Destination(uint32_t key, int64_t offset, int64_t n) override {
    absl::MutexLock lock(&mu_);
    return receiver_->Destination(key, offset, n);
  }
  absl::Status Written(uint32_t key, int64_t offset, int64_t n) override {
    absl::MutexLock lock(&mu_);
    return receiver_->Written(key, offset, n);
  }
  absl::StatusOr<Buffer> SparseDestination(uint32_t table, int64_t first, int64_t n, int dim) override {
    absl::MutexLock lock(&mu_);
    return receiver_->SparseDestination(table, first, n, dim);
  }
  absl::Status SparseWritten(uint32_t table, int64_t first, int64_t n) override {
    absl::MutexLock lock(&mu_);
    return receiver_->SparseWritten(table, first, n);
  }

 private:
  PullReceiver* const receiver_;
  absl::Mutex mu_;
  bool header_seen_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification header_arrived_;
};

// Hands the chunks of pulled messages to a PullReceiver, decoding from the wire type into its destination.
class PullFeeder : public coding::ChunkHandler {
 public:
  explicit PullFeeder(PullReceiver* receiver) : receiver_(receiver) {}
  absl::Status OnHeader(const std::string& bytes) override {
    pb::PullHeader header;
    if (!header.ParseFromString(bytes)) return absl::DataLossError("Pull: malformed header");
    got_header_ = true;
    return receiver_->OnHeader(wire::FromProto(header));
  }
  absl::Status OnData(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) override {
    if (!got_header_) return absl::DataLossError("Pull: slice data before the header");
    ASSIGN_OR_RETURN(PullReceiver::Buffer dst, receiver_->Destination(key, offset, n));
    RETURN_IF_ERROR(CopyInto(dst, dtype, data, n));
    return receiver_->Written(key, offset, n);
  }
  absl::Status OnRows(uint32_t table, int64_t first, int64_t count, int dim, WireDtype dtype,
                      const void* data) override {
    if (!got_header_) return absl::DataLossError("Pull: sparse rows before the header");
    ASSIGN_OR_RETURN(PullReceiver::Buffer dst, receiver_->SparseDestination(table, first, count, dim));
    RETURN_IF_ERROR(CopyInto(dst, dtype, data, count * dim));
    return receiver_->SparseWritten(table, first, count);
  }
  bool got_header() const { return got_header_; }

 private:
  // n values of `dtype` at `data` into the receiver's buffer (decoded to fp32, or as they are).
  static absl::Status CopyInto(const PullReceiver::Buffer& dst, WireDtype dtype, const void* data, int64_t n) {
    if (dst.data == nullptr) return absl::OkStatus();
    if (dst.dtype == WireDtype::kF32) {
      DecodeFloats(dtype, data, n, static_cast<float*>(dst.data));
    } else if (dst.dtype == dtype) {
      std::memcpy(dst.data, data, n * DtypeBytes(dtype));
    } else {
      return absl::InternalError("Pull: a receiver asked for a narrow dtype the stream does not carry");
    }
    return absl::OkStatus();
  }

  PullReceiver* receiver_;
  bool got_header_ = false;
};

class GrpcPsClient final : public PsInterface {
 public:
  GrpcPsClient(std::string address, GrpcClientOptions options, std::vector<std::shared_ptr<grpc::Channel>> channels,
               std::shared_ptr<grpc::Channel> pull_channel)
      : address_(std::move(address)),
        options_(options),
        channels_(std::move(channels)),
        channel_(channels_[0]),
        register_(grpc_methods::kRegister, RpcMethod::NORMAL_RPC, channel_),
        initialize_(grpc_methods::kInitialize, RpcMethod::CLIENT_STREAMING, channel_),
        push_(grpc_methods::kPush, RpcMethod::CLIENT_STREAMING, channel_),
        pull_(grpc_methods::kPull, RpcMethod::SERVER_STREAMING, channel_),
        done_(grpc_methods::kDone, RpcMethod::NORMAL_RPC, channel_),
        stats_(grpc_methods::kGetStats, RpcMethod::NORMAL_RPC, channel_),
        heartbeat_(grpc_methods::kHeartbeat, RpcMethod::NORMAL_RPC, channel_),
        probe_(grpc_methods::kProbe, RpcMethod::NORMAL_RPC, channel_),
        restore_(grpc_methods::kRestore, RpcMethod::NORMAL_RPC, channel_),
        control_(grpc_methods::kControl, RpcMethod::NORMAL_RPC, channel_),
        pull_channel_(std::move(pull_channel)),
        beside_push_pull_(grpc_methods::kPull, RpcMethod::SERVER_STREAMING, pull_channel_) {
    for (size_t k = 0; k < channels_.size(); ++k) {
      push_parts_.emplace_back(grpc_methods::kPushPart, RpcMethod::CLIENT_STREAMING, channels_[k]);
      pulls_.emplace_back(grpc_methods::kPull, RpcMethod::SERVER_STREAMING, channels_[k]);
    }
  }

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request) override {
    pb::RegisterRequest req;
    req.set_worker_id(request.worker_id);
    req.set_is_chief(request.is_chief);
    wire::ToProto(request.config, req.mutable_config());
    if (request.restore_step != kRestoreNewest) req.set_restore_step(request.restore_step);
    pb::RegisterResponse resp;
    // One attempt: the caller (WorkerClient::Connect) waits for late ps tasks itself and logs what it waits for.
    RETURN_IF_ERROR(Unary("Register", register_, req, &resp, absl::ZeroDuration()));
    RegisterResponse out{resp.initialized(), resp.global_step(), resp.session(), resp.lease_ms(),
                         resp.input_position()};
    out.join_step = resp.join_step();
    out.max_workers = resp.max_workers();
    out.clock_ns = resp.clock_ns();
    return out;
  }

  absl::StatusOr<std::unique_ptr<SliceUpload>> StartInitialize(int worker_id) override {
    AwaitConnection(absl::Now() + kAwaitConnection);
    auto upload = std::make_unique<GrpcUpload>(address_, "Initialize", options_, nullptr);
    auto response = std::make_shared<pb::InitializeResponse>();
    upload->result_ = [response] { return PushResponse{PushResponse::Outcome::kAccepted, response->global_step()}; };
    coding::MessageBuilder first;
    first.SetWorkerId(worker_id);
    RETURN_IF_ERROR(upload->Open(channel_, initialize_, response.get(), std::move(first)));
    return std::unique_ptr<SliceUpload>(std::move(upload));
  }

  absl::StatusOr<std::unique_ptr<SliceUpload>> StartPush(const PushHeader& header) override {
    AwaitConnection(absl::Now() + kAwaitConnection, header.cancel);
    auto upload = std::make_unique<GrpcUpload>(address_, "Push", options_, header.cancel);
    auto response = std::make_shared<pb::PushResponse>();
    upload->result_ = [response, counters = options_.counters] {
      if (counters != nullptr) counters->received += static_cast<int64_t>(response->ByteSizeLong());
      return PushResponse{wire::FromProto(response->outcome()), response->global_step()};
    };
    pb::PushHeader h;
    wire::ToProto(header, &h);
    const int parts = static_cast<int>(channels_.size()) - 1;
    uint64_t stripe_id = 0;
    if (parts > 0) {
      thread_local absl::BitGen bitgen;  // not thread-safe: one per thread
      while (stripe_id == 0) stripe_id = absl::Uniform<uint64_t>(bitgen);
      h.set_stripe_id(stripe_id);
      h.set_stripe_parts(parts);
    }
    coding::MessageBuilder first;
    first.SetHeader(h.SerializeAsString());
    RETURN_IF_ERROR(upload->Open(channel_, push_, response.get(), std::move(first)));
    if (parts == 0) return std::unique_ptr<SliceUpload>(std::move(upload));
    std::vector<std::unique_ptr<GrpcUpload>> streams;
    streams.push_back(std::move(upload));
    for (int k = 1; k <= parts; ++k) {
      AwaitConnection(channels_[k], absl::Now() + kAwaitConnection, header.cancel);
      auto part = std::make_unique<GrpcUpload>(address_, "PushPart", options_, header.cancel);
      auto none = std::make_shared<pb::PushResponse>();
      part->result_ = [none] { return PushResponse{}; };
      pb::PushPartHeader ph;
      ph.set_worker_id(header.worker_id);
      ph.set_session(header.session);
      ph.set_request_id(header.request_id);
      ph.set_stripe_id(stripe_id);
      ph.set_part(k);
      coding::MessageBuilder part_first;
      part_first.SetHeader(ph.SerializeAsString());
      RETURN_IF_ERROR(part->Open(channels_[k], push_parts_[k], none.get(), std::move(part_first)));
      streams.push_back(std::move(part));
    }
    return std::unique_ptr<SliceUpload>(new StripedUpload(std::move(streams)));
  }

  absl::Status Pull(const PullRequest& request, PullReceiver* receiver) override {
    const int n = static_cast<int>(channels_.size());
    if (n == 1 && request.beside_push) {
      // A pull that streams while the push still uploads, on a connection of its own: sharing the push's, its
      // data queued ahead of the push's flow-control updates (and TCP acknowledgements) and slowed the push
      // (measured across a 1 Gbit link: push + pull of 13 MB in 129 ms on one connection, 108 ms on two).
      if (!beside_push_logged_.exchange(true)) {
        LOG(INFO) << "ps " << address_ << ": pulls that stream beside a push (the early apply) get a connection of "
                  << "their own";
      }
      return PullOnChannel(pull_channel_, beside_push_pull_, request, receiver, nullptr);
    }
    if (n == 1) return PullOn(0, request, receiver, nullptr);
    // Striped: part k on connection k; the first to fail ends the others. Part 0 waits for the step; the others
    // start once its header came (the step is there), so that they do not wait on the ps beside a push still in
    // flight (measured: pulls all waiting at once made the step 1.3x slower on 2 cores).
    SerializedReceiver serialized(receiver);
    Cancellation abort;
    std::vector<absl::Status> status(n);
    auto run = [&](int k) {
      PullRequest part = request;
      part.part = k;
      part.parts = n;
      if (k > 0) {
        part.sparse.clear();  // rows come with part 0
        while (!serialized.WaitForHeader(absl::Milliseconds(50))) {
          if (abort.cancelled() || (request.cancel != nullptr && request.cancel->cancelled())) {
            status[k] = absl::CancelledError("Pull: another part failed");
            return;
          }
        }
      }
      status[k] = PullOn(k, part, &serialized, &abort);
      if (!status[k].ok()) abort.Cancel();
    };
    std::vector<std::thread> threads;
    for (int k = 1; k < n; ++k) threads.emplace_back(run, k);
    run(0);
    for (std::thread& t : threads) t.join();
    // The first error that is not the others' cancellation.
    for (const absl::Status& st : status) {
      if (!st.ok() && st.code() != absl::StatusCode::kCancelled) return st;
    }
    for (const absl::Status& st : status) RETURN_IF_ERROR(st);
    return absl::OkStatus();
  }

  absl::Status Done(const DoneRequest& request) override {
    pb::DoneRequest req;
    wire::ToProto(request, &req);
    pb::DoneResponse resp;
    return Unary("Done", done_, req, &resp,
                 request.retry_ms > 0 ? absl::Milliseconds(request.retry_ms) : absl::InfiniteDuration());
  }

  absl::StatusOr<int64_t> Heartbeat(int worker_id, uint64_t session) override {
    pb::HeartbeatRequest req;
    req.set_worker_id(worker_id);
    req.set_session(session);
    pb::HeartbeatResponse resp;
    // One attempt: the next heartbeat is soon.
    RETURN_IF_ERROR(Unary("Heartbeat", heartbeat_, req, &resp, absl::ZeroDuration()));
    return resp.step();
  }

  absl::StatusOr<CheckpointProbe> Probe(const TrainConfig& config) override {
    pb::ProbeRequest req;
    wire::ToProto(config, req.mutable_config());
    pb::ProbeResponse resp;
    RETURN_IF_ERROR(Unary("Probe", probe_, req, &resp, absl::ZeroDuration()));
    CheckpointProbe probe;
    probe.configured = resp.configured();
    probe.initialized = resp.initialized();
    probe.step = resp.step();
    probe.restorable_steps.assign(resp.restorable_steps().begin(), resp.restorable_steps().end());
    probe.first_relayable_step = resp.first_relayable_step();
    probe.num_ps = resp.num_ps();
    return probe;
  }

  absl::Status Restore(const TrainConfig& config, int worker_id, int64_t step) override {
    pb::RestoreRequest req;
    wire::ToProto(config, req.mutable_config());
    req.set_worker_id(worker_id);
    req.set_step(step);
    pb::RestoreResponse resp;
    return Unary("Restore", restore_, req, &resp, absl::ZeroDuration());
  }

  absl::StatusOr<std::string> Control(const ControlRequest& request) override {
    pb::ControlRequest req;
    req.set_command(request.command);
    req.set_worker(request.worker);
    req.set_reason(request.reason);
    req.set_address(request.address);
    req.set_ps(request.ps);
    req.set_step(request.step);
    pb::ControlResponse resp;
    // One attempt: an operator's command is not repeated behind their back.
    RETURN_IF_ERROR(Unary("Control", control_, req, &resp, absl::ZeroDuration()));
    return resp.message();
  }

  absl::StatusOr<TrainingStats> GetStats() override {
    pb::StatsRequest req;
    pb::StatsResponse resp;
    RETURN_IF_ERROR(Unary("GetStats", stats_, req, &resp));
    return wire::FromProto(resp);
  }

 private:
  // One pull over connection k; `abort` (may be null), like request.cancel, cancels it.
  absl::Status PullOn(int k, const PullRequest& request, PullReceiver* receiver, Cancellation* abort) {
    return PullOnChannel(channels_[k], pulls_[k], request, receiver, abort);
  }

  absl::Status PullOnChannel(const std::shared_ptr<grpc::Channel>& channel, const RpcMethod& method,
                             const PullRequest& request, PullReceiver* receiver, Cancellation* abort) {
    AwaitConnection(channel, absl::Now() + kAwaitConnection, request.cancel);
    pb::PullRequest req;
    wire::ToProto(request, &req);
    if (options_.counters != nullptr) options_.counters->sent += static_cast<int64_t>(req.ByteSizeLong());
    grpc::ClientContext context;
    AttachCallToken(options_.security, &context);
    // The server may legitimately wait up to timeout_ms before answering.
    context.set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Milliseconds(request.timeout_ms) + options_.rpc_timeout));
    CancelScope cancel(request.cancel, [&context] { context.TryCancel(); });
    CancelScope aborted(abort, [&context] { context.TryCancel(); });
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel.get(), method, &context, req));
    PullFeeder feeder(receiver);
    grpc::ByteBuffer message;
    absl::Status bad;
    while (reader->Read(&message)) {
      if (options_.counters != nullptr) options_.counters->received += static_cast<int64_t>(message.Length());
      bad = coding::DecodeMessage(message, &feeder);
      if (!bad.ok()) {
        context.TryCancel();
        while (reader->Read(&message)) {
        }
        break;
      }
    }
    absl::Status s = wire::FromGrpc(reader->Finish());
    if (!bad.ok()) return bad;
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("ps ", address_, ": Pull: ", s.message()));
    if (!feeder.got_header()) return absl::DataLossError(absl::StrCat("ps ", address_, ": Pull: no header"));
    return absl::OkStatus();
  }

  void AwaitConnection(absl::Time deadline, const Cancellation* cancel = nullptr) {
    AwaitConnection(channel_, deadline, cancel);
  }

  // A channel whose connection broke (the ps task died, or is not up yet) reconnects in the background, but gRPC
  // sees the outcome of a connection attempt only when some thread of this process polls the channel: calls on
  // a channel in TRANSIENT_FAILURE fail at once without polling, and the channel's backup poller runs every 5 s.
  // Without this a restarted ps process was reached only 5-10 s after it was back (tests/grpc_reconnect_test.cc).
  // So before a call on a channel that is not connected, wait on its state (which polls it) until it is READY,
  // `deadline` has passed or `cancel` (may be null) is cancelled: the attempt in progress completes as soon as
  // the task accepts it. A connected channel (the normal path) costs one state read.
  static void AwaitConnection(const std::shared_ptr<grpc::Channel>& channel, absl::Time deadline,
                              const Cancellation* cancel) {
    grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
    while (state != GRPC_CHANNEL_READY && state != GRPC_CHANNEL_SHUTDOWN) {
      const absl::Time now = absl::Now();
      if (now >= deadline || (cancel != nullptr && cancel->cancelled())) return;
      // Wakes up on a state change, and every 100 ms to look at the cancellation.
      channel->WaitForStateChange(state, absl::ToChronoTime(std::min(deadline, now + absl::Milliseconds(100))));
      state = channel->GetState(/*try_to_connect=*/true);
    }
  }
  // How long one call waits for a connection in progress (a refused one is retried after at most 1 s plus
  // jitter: GRPC_ARG_MAX_RECONNECT_BACKOFF_MS below).
  static constexpr absl::Duration kAwaitConnection = absl::Milliseconds(1200);

  // A unary call with a fresh context per attempt; retries Unavailable until the retry window is spent.
  template <typename Request, typename Response>
  absl::Status Unary(const char* what, const RpcMethod& method, const Request& request, Response* response,
                     absl::Duration retry_window = absl::InfiniteDuration()) {
    if (retry_window == absl::InfiniteDuration()) retry_window = options_.retry_window;
    const absl::Time give_up = absl::Now() + retry_window;
    absl::Duration backoff = options_.initial_backoff;
    while (true) {
      // A retried call never waits past its retry window; a single attempt waits like a connect timeout.
      const absl::Time await_until = absl::Now() + kAwaitConnection;
      AwaitConnection(retry_window == absl::ZeroDuration() ? await_until : std::min(await_until, give_up));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
      AttachCallToken(options_.security, &ctx);
      absl::Status s =
          wire::FromGrpc(grpc::internal::BlockingUnaryCall(channel_.get(), method, &ctx, request, response));
      if (options_.counters != nullptr) {
        options_.counters->sent += static_cast<int64_t>(request.ByteSizeLong());
        if (s.ok()) options_.counters->received += static_cast<int64_t>(response->ByteSizeLong());
      }
      if (s.ok()) return s;
      if (s.code() != absl::StatusCode::kUnavailable || absl::Now() + backoff > give_up) {
        return absl::Status(s.code(), absl::StrCat("ps ", address_, ": ", what, ": ", s.message()));
      }
      VLOG(1) << "ps " << address_ << ": " << what << " unavailable (" << s.message() << "), retrying";
      std::this_thread::sleep_for(absl::ToChronoMilliseconds(backoff));
      backoff = std::min(backoff * 2, options_.max_backoff);
    }
  }

  const std::string address_;
  const GrpcClientOptions options_;
  const std::vector<std::shared_ptr<grpc::Channel>> channels_;  // [0]: the control calls' too
  const std::shared_ptr<grpc::Channel> channel_;
  const RpcMethod register_, initialize_, push_, pull_, done_, stats_, heartbeat_, probe_, restore_, control_;
  std::vector<RpcMethod> push_parts_, pulls_;  // [k]: on channels_[k]
  // With one connection: the pulls that stream beside a push (PullRequest::beside_push) get this one, opened on
  // their first use.
  const std::shared_ptr<grpc::Channel> pull_channel_;
  const RpcMethod beside_push_pull_;
  std::atomic<bool> beside_push_logged_{false};
};

}  // namespace

namespace {

// The connection of the pulls that stream beside a push (PullRequest::beside_push) with --channels_per_ps=1.
constexpr int kPullConnection = -1;

// A channel to `address` with the data path's arguments. Channels made with equal arguments share one
// connection (gRPC's subchannel pool), so the shared-memory attach below adds no connection of its own.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const GrpcClientOptions& options,
                                          int connection = 0) {
  grpc::ChannelArguments args;
  // Channels whose arguments differ get connections of their own: the stripes of --channels_per_ps.
  if (connection != 0) args.SetInt("dtrain.connection", connection);
  if (options.connection_group != 0) args.SetInt("dtrain.connection_group", options.connection_group);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  // Megabyte tensors: large HTTP/2 frames and flow-control windows mean fewer frames and window updates.
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (16 << 20) - 1);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  // Reconnect quickly when a ps comes up late.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<grpc::ChannelCredentials> credentials = ChannelCredentials(options.security, &args);
  return grpc::CreateCustomChannel(address, credentials, args);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PsInterface>> NewGrpcPsClient(const std::string& address,
                                                             const GrpcClientOptions& options) {
  if (address.empty()) return absl::InvalidArgumentError("empty ps address");
  if (options.channels < 1 || options.channels > kMaxPullParts) {
    return absl::InvalidArgumentError(
        absl::StrCat("--channels_per_ps must be in [1, ", kMaxPullParts, "], got ", options.channels));
  }
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int k = 0; k < options.channels; ++k) channels.push_back(MakeChannel(address, options, k));
  // A channel connects on its first call: a client whose pulls never stream beside a push opens none.
  std::shared_ptr<grpc::Channel> pull_channel = MakeChannel(address, options, kPullConnection);
  return std::unique_ptr<PsInterface>(
      new GrpcPsClient(address, options, std::move(channels), std::move(pull_channel)));
}

shm::ShmAttachFn NewGrpcShmAttach(const std::string& address, const GrpcClientOptions& options) {
  std::shared_ptr<grpc::Channel> channel = MakeChannel(address, options);
  auto method = std::make_shared<RpcMethod>(grpc_methods::kAttachShm, RpcMethod::NORMAL_RPC, channel);
  return [channel, method, address, options](const shm::ShmAttachRequest& r) -> absl::StatusOr<shm::ShmOffer> {
    pb::ShmAttachRequest req;
    req.set_worker_id(r.worker_id);
    req.set_boot_id(r.boot_id);
    req.set_uid(r.uid);
    req.set_session(r.session);
    pb::ShmAttachResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + std::min(options.rpc_timeout, absl::Seconds(20))));
    AttachCallToken(options.security, &ctx);
    absl::Status s = wire::FromGrpc(grpc::internal::BlockingUnaryCall(channel.get(), *method, &ctx, req, &resp));
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("ps ", address, ": AttachShm: ", s.message()));
    shm::ShmOffer offer;
    offer.socket_name = resp.socket_name();
    offer.push_ticket = resp.push_ticket();
    offer.pull_ticket = resp.pull_ticket();
    offer.boot_id = resp.boot_id();
    offer.uid = resp.uid();
    offer.pid = resp.pid();
    return offer;
  };
}

tcp::TcpAttachFn NewGrpcTcpAttach(const std::string& address, const GrpcClientOptions& options) {
  std::shared_ptr<grpc::Channel> channel = MakeChannel(address, options);
  auto method = std::make_shared<RpcMethod>(grpc_methods::kAttachTcp, RpcMethod::NORMAL_RPC, channel);
  return [channel, method, address, options](const tcp::TcpAttachRequest& r) -> absl::StatusOr<tcp::TcpOffer> {
    pb::TcpAttachRequest req;
    req.set_worker_id(r.worker_id);
    req.set_session(r.session);
    pb::TcpAttachResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + std::min(options.rpc_timeout, absl::Seconds(20))));
    AttachCallToken(options.security, &ctx);
    absl::Status s = wire::FromGrpc(grpc::internal::BlockingUnaryCall(channel.get(), *method, &ctx, req, &resp));
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("ps ", address, ": AttachTcp: ", s.message()));
    if (resp.port() <= 0 || resp.port() > 65535) {
      return absl::DataLossError(absl::StrCat("ps ", address, ": AttachTcp: offered port ", resp.port()));
    }
    tcp::TcpOffer offer;
    offer.port = resp.port();
    offer.push_ticket = resp.push_ticket();
    offer.pull_ticket = resp.pull_ticket();
    offer.pid = resp.pid();
    return offer;
  };
}

}  // namespace dtrain::ps
