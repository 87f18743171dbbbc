// dtrain_bench_ps: the data path alone. One ps task (a gRPC server on 127.0.0.1) and one worker-side client
// (the WorkerClient that dtrain_worker uses) move a model's parameters (--model=cnn; or one variable of
// --bytes=N): each step pushes the gradients and pulls the updated parameters, overlapped as in training (the
// pull starts right after the commit and streams each slice as the ps has applied it). Every pulled buffer is
// checked against its expected CRC32C. In the same run, a plain TCP round trip of the same bytes (send N, get
// N back, on 127.0.0.1) is the reference.
//
//   dtrain_bench_ps --model=cnn
//   → ... push+pull median_ms=9.8 raw_tcp median_ms=8.1 ratio=1.21
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/denormals.h"
#include "common/malloc_tuning.h"
#include "common/mutex_config.h"
#include "ps/rpc/grpc_ps_client.h"
#include "ps/client/placement.h"
#include "ps/rpc/server.h"
#include "ps/client/worker_client.h"
#include "worker/models/model.h"
#include "worker/models/registry.h"

ABSL_FLAG(std::string, model, "cnn", "Move this model's parameters (mlp | cnn | convnet | cifar10 | PATH.onnx)");
ABSL_FLAG(int64_t, bytes, 0, "Instead of a model: one variable of this many bytes");
ABSL_FLAG(int, steps, 40, "Timed steps (push + pull each)");
ABSL_FLAG(int, warmup_steps, 5, "Steps before timing");
ABSL_FLAG(std::string, wire_dtype, "fp32", "fp32 | bf16 | fp16 on the wire");

namespace dtrain {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "dtrain_bench_ps: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

// Reads or writes exactly n bytes; false on a closed or broken socket.
bool SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
bool RecvAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = recv(fd, p, n, 0);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Median milliseconds of `rounds` round trips of `n` bytes each way over TCP on 127.0.0.1 (an echo server
// thread answering from its own buffer), or -1 on a socket error.
double RawTcpRoundTripMs(size_t n, int warmup, int rounds) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 || getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return -1;
  }
  const int total = warmup + rounds;
  std::thread server([&] {
    const int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::vector<char> in(n), out(n, 'p');
    for (int i = 0; i < total; ++i) {
      if (!RecvAll(fd, in.data(), n) || !SendAll(fd, out.data(), n)) break;
    }
    close(fd);
  });
  std::vector<double> ms;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  std::vector<char> out(n, 'w'), in(n);
  for (int i = 0; ok && i < total; ++i) {
    const absl::Time t0 = absl::Now();
    ok = SendAll(fd, out.data(), n) && RecvAll(fd, in.data(), n);
    if (i >= warmup) ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
  }
  close(fd);
  server.join();
  close(listener);
  return ok ? Median(ms) : -1;
}

int Main() {
  SetFlushDenormals();
  DisableMutexDeadlockDetection();
  absl::StatusOr<ps::WireDtype> dtype = ps::ParseWireDtype(absl::GetFlag(FLAGS_wire_dtype));
  if (!dtype.ok()) return Fail("flags", dtype.status());
  std::vector<ps::VariableInfo> vars;
  std::string what;
  if (absl::GetFlag(FLAGS_bytes) > 0) {
    vars.push_back({"bytes", std::max<int64_t>(1, absl::GetFlag(FLAGS_bytes) / 4)});
    what = absl::StrCat("bytes=", vars[0].size * 4);
  } else {
    absl::StatusOr<models::ModelRef> spec = models::ResolveModel(absl::GetFlag(FLAGS_model));
    if (!spec.ok()) return Fail("--model", spec.status());
    // The model's own input (its defaults: the data it is made for, cropped as it crops).
    const models::ModelDefaults& d = (*spec)->defaults;
    models::ModelOptions mo;
    models::SetInputGeometry(d, d.data_height, d.data_width, d.data_channels, &mo);
    absl::StatusOr<std::vector<models::VariableInfo>> mv = models::ModelVariables(**spec, mo);
    if (!mv.ok()) return Fail("--model", mv.status());
    for (const models::VariableInfo& v : *mv) vars.push_back({v.name, v.size(), v.trainable});
    what = absl::StrCat("model=", absl::GetFlag(FLAGS_model));
  }
  absl::StatusOr<ps::Placement> placement = ps::PlaceVariables(vars, 1);
  if (!placement.ok()) return Fail("placement", placement.status());
  int64_t n = 0;
  for (const ps::VariableInfo& v : vars) n += v.size;
  const int64_t bytes = n * 4;

  ps::PsServerOptions so;
  so.listen_address = "127.0.0.1:0";
  so.ps.num_workers = 1;
  absl::StatusOr<std::unique_ptr<ps::PsServer>> server = ps::PsServer::Start(so);
  if (!server.ok()) return Fail("ps server", server.status());
  absl::StatusOr<std::unique_ptr<ps::PsInterface>> task = ps::NewGrpcPsClient((*server)->address(), {});
  if (!task.ok()) return Fail("ps client", task.status());
  ps::WorkerClientOptions wo;
  wo.wire_dtype = *dtype;
  ps::WorkerClient client({task->get()}, placement->task_slices, 0, /*is_chief=*/true, wo);
  ps::TrainConfig config;
  config.model_signature = "dtrain_bench_ps";
  config.num_workers = 1;
  config.optimizer.name = "sgd";
  config.optimizer.learning_rate = 1.0f;
  // Small integers and an alternating +d/-d gradient: every update is exact, so the values alternate between
  // two known buffers whose checksums are computed once (in any wire type: they are exact in bf16 and fp16).
  std::vector<float> initial(n), params(n), plus(n), minus(n), after_plus(n);
  for (int64_t i = 0; i < n; ++i) {
    initial[i] = static_cast<float>(i % 64);
    plus[i] = static_cast<float>(1 + i % 3);
    minus[i] = -plus[i];
    after_plus[i] = initial[i] - plus[i];
  }
  const uint32_t crc[2] = {crc32c::Value(reinterpret_cast<const char*>(initial.data()), bytes),
                           crc32c::Value(reinterpret_cast<const char*>(after_plus.data()), bytes)};
  if (absl::Status s = client.Connect(config, initial.data(), absl::Seconds(10)); !s.ok()) return Fail("connect", s);

  const int warmup = absl::GetFlag(FLAGS_warmup_steps), steps = absl::GetFlag(FLAGS_steps);
  std::vector<double> step_ms, push_ms, pull_ms;
  int bad = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    const float* grads = s % 2 == 0 ? plus.data() : minus.data();
    const absl::Time t0 = absl::Now();
    if (absl::Status st = client.BeginPush(s, grads); !st.ok()) return Fail("push", st);
    client.FinishPush();
    client.StartPull(s + 1, s, params.data());
    absl::StatusOr<ps::PullResult> pulled = client.FinishPull();
    if (!pulled.ok()) return Fail("pull", pulled.status());
    absl::StatusOr<ps::PushResponse> pushed = client.WaitPush();
    if (!pushed.ok()) return Fail("push", pushed.status());
    const absl::Time t1 = absl::Now();
    if (s >= warmup) step_ms.push_back(absl::ToDoubleMilliseconds(t1 - t0));
    bad += crc32c::Value(reinterpret_cast<const char*>(params.data()), bytes) != crc[(s + 1) % 2];
  }
  // Pushes alone (each one a full step on the ps), then pulls alone (of the step just applied).
  for (int s = warmup + steps; s < warmup + steps + std::max(5, steps / 4); ++s) {
    const float* grads = s % 2 == 0 ? plus.data() : minus.data();
    const absl::Time t0 = absl::Now();
    absl::StatusOr<ps::PushResponse> pushed = client.Push(s, grads);
    if (!pushed.ok()) return Fail("push", pushed.status());
    const absl::Time t1 = absl::Now();
    push_ms.push_back(absl::ToDoubleMilliseconds(t1 - t0));
    absl::StatusOr<ps::PullResult> pulled = client.Pull(s + 1, s, params.data());
    if (!pulled.ok()) return Fail("pull", pulled.status());
    pull_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t1));
    bad += crc32c::Value(reinterpret_cast<const char*>(params.data()), bytes) != crc[(s + 1) % 2];
  }
  if (absl::Status s = client.Done(); !s.ok()) return Fail("done", s);
  (*server)->Wait(absl::Seconds(10));

  const double tcp = RawTcpRoundTripMs(static_cast<size_t>(bytes), warmup, steps);
  const double wire_bytes = static_cast<double>(bytes) * ps::DtypeBytes(*dtype) / 4;
  const double med = Median(step_ms);
  std::printf("dtrain_bench_ps: %s slices=%zu wire=%s %.1f MB each way, %d steps, checksums %s\n", what.c_str(),
              placement->slices.size(), std::string(ps::DtypeName(*dtype)).c_str(), wire_bytes / 1e6, steps,
              bad == 0 ? "ok" : absl::StrCat(bad, " BAD").c_str());
  std::printf("  push alone median_ms=%.2f, pull alone %.2f; push+pull %.2f GB/s; raw TCP %.2f GB/s\n",
              Median(push_ms), Median(pull_ms),
              2 * wire_bytes / (med * 1e6), tcp > 0 ? 2 * static_cast<double>(bytes) / (tcp * 1e6) : 0.0);
  std::printf("dtrain_bench_ps: %s push+pull median_ms=%.2f raw_tcp median_ms=%.2f ratio=%.2f\n", what.c_str(), med,
              tcp, tcp > 0 ? med / tcp : 0.0);
  return bad == 0 && tcp > 0 ? 0 : 1;
}

}  // namespace
}  // namespace dtrain

int main(int argc, char** argv) {
  dtrain::TuneMallocForLargeReusedBuffers();
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  google::InitGoogleLogging(argv[0]);
  return dtrain::Main();
}
