#include "ps/rpc/server.h"

#include <algorithm>
#include <utility>

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/cancellation.h"
#include "common/status_macros.h"
#include "ps/rpc/grpc_ps_service.h"
#include "ps/rpc/peer_address.h"

namespace dtrain::ps {
namespace {

// What gRPC serves: the ParameterServer, with a count of the answers that told a worker how the run ended
// (its statistics with every worker gone). Thread-safe, as the ParameterServer is.
class OutcomeWatch : public ForwardingPs {
 public:
  OutcomeWatch(ParameterServer* ps, int task_index) : ForwardingPs(ps), task_index_(task_index) {}

  absl::StatusOr<TrainingStats> GetStats() override {
    absl::StatusOr<TrainingStats> s = target()->GetStats();
    if (s.ok() && EveryWorkerGone(*s)) {
      absl::MutexLock l(&mu_);
      ++outcome_answers_;
      answered_.SignalAll();
    }
    return s;
  }

  // After the ParameterServer finished: blocks until no worker needs this task any more
  // (PsServerOptions::linger) or `deadline`. Returns what is still awaited, empty when nothing is.
  std::string AwaitNobodyWaiting(absl::Time deadline) {
    while (true) {
      int64_t answers = 0;
      const std::string waiting = Waiting(&answers);
      if (waiting.empty() || absl::Now() >= deadline) return waiting;
      // An answer wakes it at once; a lost worker's return is looked for every 20 ms.
      absl::MutexLock l(&mu_);
      if (outcome_answers_ == answers) {
        answered_.WaitWithDeadline(&mu_, std::min(deadline, absl::Now() + absl::Milliseconds(20)));
      }
    }
  }

 private:
  static bool EveryWorkerGone(const TrainingStats& s) {
    return std::all_of(s.workers.begin(), s.workers.end(),
                       [](const WorkerStats& w) { return w.done || w.lost; });
  }

  // Who still needs this task: the workers that completed and were not yet told how the run ended (ps task
  // 0), and lost workers. Empty: nobody. `answers`: the count of answers it went by.
  std::string Waiting(int64_t* answers) {
    absl::StatusOr<TrainingStats> s = target()->GetStats();
    if (!s.ok()) return "";
    int completed = 0, lost = 0;
    for (const WorkerStats& w : s->workers) {
      if (w.lost) ++lost;
      if (w.done && !w.lost && w.leaving == Leaving::kCompleted) ++completed;
    }
    {
      absl::MutexLock l(&mu_);
      *answers = outcome_answers_;
    }
    std::string waiting;
    if (task_index_ == 0 && *answers < completed) {
      waiting = absl::StrCat(completed - *answers, " of the ", completed,
                             " workers that completed not yet told how the run ended");
    }
    if (lost > 0) {
      absl::StrAppend(&waiting, waiting.empty() ? "" : "; ", lost, " lost worker(s) that may come back");
    }
    return waiting;
  }

  const int task_index_;
  absl::Mutex mu_;
  absl::CondVar answered_;  // signalled when outcome_answers_ grows
  int64_t outcome_answers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

struct PsServer::State {
  std::string host;
  int port = 0;
  std::unique_ptr<ParameterServer> ps;
  std::unique_ptr<OutcomeWatch> watch;  // what the gRPC service serves: ps
  int task_index = 0;
  Cancellation shutdown;  // ends the pulls still waiting when the server shuts down
  std::unique_ptr<shm::ShmServer> shm;
  std::unique_ptr<tcp::TcpServer> tcp;
  GrpcStreamCounters grpc_counters;  // the service's tensor streams
  std::unique_ptr<grpc::Service> service;
  std::unique_ptr<grpc::Server> server;
  absl::Duration linger;
  absl::Mutex mu;
  bool shut_down ABSL_GUARDED_BY(mu) = false;
};

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(const PsServerOptions& options) {
  const std::string& addr = options.listen_address;
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("listen address '", addr, "' has no port"));
  }
  std::unique_ptr<PsServer> s(new PsServer());
  s->state_ = std::make_unique<State>();
  State& st = *s->state_;
  st.host = addr.substr(0, colon);
  st.linger = options.linger;
  ASSIGN_OR_RETURN(st.ps, ParameterServer::Create(options.ps));
  st.task_index = options.ps.task_index;
  st.watch = std::make_unique<OutcomeWatch>(st.ps.get(), options.ps.task_index);
  if (options.offer_shm) {
    shm::ShmServerOptions so;
    so.task_index = options.ps.task_index;
    so.spin_us = options.shm_spin_us;
    so.shutdown = &st.shutdown;
    so.max_lanes = std::max(64, 8 * options.ps.num_workers + 16);
    so.max_pull_rows = options.ps.max_pull_rows;
    ASSIGN_OR_RETURN(st.shm, shm::ShmServer::Start(st.ps.get(), so));
  }
  absl::Status tcp_refusal;
  if (options.offer_tcp && options.security.tls()) {
    tcp_refusal = absl::FailedPreconditionError(
        "this ps task uses TLS: its TCP lanes are not encrypted, so the data stays on gRPC");
    LOG(INFO) << "ps task " << options.ps.task_index << ": no TCP data lanes with --tls (they are not encrypted): "
              << "data from other hosts stays on gRPC";
  } else if (options.offer_tcp) {
    tcp::TcpServerOptions to;
    to.task_index = options.ps.task_index;
    to.host = st.host;
    to.port = options.tcp_port;
    to.shutdown = &st.shutdown;
    to.max_lanes = std::max(64, 8 * options.ps.num_workers + 16);
    to.max_pull_rows = options.ps.max_pull_rows;
    to.max_push_rows = options.ps.max_push_rows;
    // A worker's received gradients wait in their blocks until their step is applied: two steps' worth.
    to.max_receive_bytes = 2 * options.ps.max_model_bytes + (int64_t{64} << 20);
    to.apply_early_remote = options.apply_early != ApplyEarly::kOff;
    to.apply_early_local = options.apply_early == ApplyEarly::kOn;
    to.is_local_ip = [](const std::string& ip) {
      return PeerOnThisHost(ip.find(':') != std::string::npos ? absl::StrCat("ipv6:[", ip, "]:0")
                                                              : absl::StrCat("ipv4:", ip, ":0"));
    };
    ASSIGN_OR_RETURN(st.tcp, tcp::TcpServer::Start(st.ps.get(), to));
  }
  st.service = NewGrpcPsService(st.watch.get(), &st.shutdown, options.security.auth_token, st.shm.get(),
                                options.apply_early, st.tcp.get(), tcp_refusal, &st.grpc_counters);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(addr, ServerCredentials(options.security), &st.port);
  builder.RegisterService(st.service.get());
  // Our messages are at most a megabyte of tensor data (ps/rpc/tensor_coding.h) plus framing.
  builder.SetMaxReceiveMessageSize(8 << 20);
  grpc::ResourceQuota quota("dtrain_ps");
  quota.Resize(static_cast<size_t>(options.max_inflight_bytes));
  builder.SetResourceQuota(quota);
  // A worker uses a handful of streams per task (push, pull, heartbeat, unary calls).
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 32);
  // Megabyte tensors: large HTTP/2 frames and flow-control windows mean fewer frames and window updates.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (16 << 20) - 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                             static_cast<int>(std::min<int64_t>(64 << 20, options.max_inflight_bytes / 16)));
  builder.SetMaxSendMessageSize(64 << 20);
  st.server = builder.BuildAndStart();
  if (!st.server || st.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", addr, " (address in use or not local?)"));
  }
  return s;
}

PsServer::~PsServer() { Shutdown(); }

std::string PsServer::address() const { return absl::StrCat(state_->host, ":", state_->port); }
int PsServer::port() const { return state_->port; }
ParameterServer* PsServer::parameter_server() { return state_->ps.get(); }
shm::ShmServer* PsServer::shm_server() { return state_->shm.get(); }
tcp::TcpServer* PsServer::tcp_server() { return state_->tcp.get(); }
PsServer::GrpcBytes PsServer::grpc_bytes() const {
  return {state_->grpc_counters.bytes_received.load(std::memory_order_relaxed),
          state_->grpc_counters.bytes_sent.load(std::memory_order_relaxed)};
}

bool PsServer::Wait(absl::Duration timeout) {
  const bool finished = state_->ps->WaitUntilFinished(timeout);
  if (finished && state_->linger > absl::ZeroDuration()) {
    const std::string waiting = state_->watch->AwaitNobodyWaiting(absl::Now() + state_->linger);
    if (!waiting.empty()) {
      LOG(INFO) << "ps task " << state_->task_index << ": shutting down after "
                << absl::FormatDuration(state_->linger) << " with " << waiting;
    }
  }
  Shutdown();
  return finished;
}

void PsServer::Shutdown() {
  {
    absl::MutexLock l(&state_->mu);
    if (state_->shut_down) return;
    state_->shut_down = true;
  }
  // Pulls still waiting end at once; other calls get a bounded grace period.
  state_->shutdown.Cancel();
  // What became of the uploads cut off: nothing applied, but under async --nonfinite=apply (each slice applied
  // as it arrives whole: PushAccounting::partly_applied, of any transport).
  const auto cut_off_fate = [this] {
    const int64_t partly = state_->ps->accounting().partly_applied;
    return partly == 0 ? std::string("none of them applied")
                       : absl::StrCat(partly, " uploads of any transport partly applied: async --nonfinite=apply");
  };
  if (state_->shm != nullptr) {
    state_->shm->Shutdown();
    const shm::ShmServerCounters c = state_->shm->counters();
    LOG(INFO) << "shared memory: " << c.offers << " attachments offered, " << c.lanes_accepted << " lanes accepted, "
              << c.lanes_refused << " refused, " << c.uploads_cut_off << " uploads cut off (" << cut_off_fate()
              << ")";
  }
  if (state_->tcp != nullptr) {
    state_->tcp->Shutdown();
    const tcp::TcpServerCounters c = state_->tcp->counters();
    if (c.offers > 0 || c.lanes_refused > 0) {
      LOG(INFO) << "TCP lanes: " << c.offers << " attachments offered, " << c.lanes_accepted << " lanes accepted, "
                << c.lanes_refused << " refused, " << c.uploads_cut_off << " uploads cut off (" << cut_off_fate()
                << "), " << c.bytes_received << " bytes received, " << c.bytes_sent << " sent";
    }
  }
  state_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  state_->server->Wait();
}

}  // namespace dtrain::ps
