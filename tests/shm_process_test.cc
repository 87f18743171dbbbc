// The shared-memory data plane (ps/shm) with real dtrain_ps and dtrain_worker processes on 127.0.0.1, keeping
// every promise of the ps (issue 20):
// - a sync worker killed (SIGKILL) in the middle of writing a push: the ps drops the unfinished upload (nothing
//   of it applied, counted), unmaps the dead worker's segments at once, declares it lost after its lease; the
//   other worker trains to the end (a degraded run: exit 3) and the push accounting balances;
// - a ps task killed mid-run and started again: the worker attaches to the new process (two "data through
//   shared memory" lines naming two ps pids) and the run ends at --train_steps;
// - a stranger on the ps's abstract socket (no ticket from the authenticated gRPC handshake) is refused, and a
//   worker with the wrong token never gets an offer;
// - --transport=shm against a ps that offers none (--transport=grpc): the worker exits naming why;
// - nothing is left behind: no socket of the ps in /proc/net/unix once it exited, no file in /dev/shm.
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "ps/rpc/grpc_ps_client.h"
#include "ps/shm/shm_frame.h"
#include "ps/shm/shm_lane.h"
#include "ps/shm/shm_segment.h"
#include "tests/subprocess.h"

namespace dtrain::testing {
namespace {

const char kFashion[] = "/usr/share/datasets/fashion-mnist";

bool HaveFashionMnist() {
  struct stat st;
  return stat(absl::StrCat(kFashion, "/train-images-idx3-ubyte.gz").c_str(), &st) == 0;
}

std::string LogPath(const std::string& name) { return absl::StrCat(::testing::TempDir(), "/shm_", name, ".log"); }

// The abstract sockets (without the leading '@') of /proc/net/unix whose name starts with `prefix`.
std::vector<std::string> AbstractSockets(const std::string& prefix) {
  std::vector<std::string> found;
  std::ifstream in("/proc/net/unix");
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find(" @" + prefix);
    if (at != std::string::npos) found.push_back(line.substr(at + 2));
  }
  return found;
}

std::set<std::string> DevShmFiles() {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) names.insert(e.path().filename());
  return names;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class Cluster {
 public:
  Cluster(int num_workers, std::string tag) : tag_(std::move(tag)) {
    const std::vector<int> ports = FreePorts(1 + num_workers);
    ps_ = absl::StrCat("127.0.0.1:", ports[0]);
    for (int i = 0; i < num_workers; ++i) workers_.push_back(absl::StrCat("127.0.0.1:", ports[1 + i]));
  }
  std::vector<std::string> ClusterFlags() const {
    return {"--ps_hosts=" + ps_, "--worker_hosts=" + absl::StrJoin(workers_, ",")};
  }
  std::unique_ptr<Subprocess> StartPs(const std::vector<std::string>& extra, int incarnation = 0) {
    std::vector<std::string> argv = {BinPath("dtrain_ps"), "--job_name=ps", "--task_index=0",
                                     "--worker_timeout_secs=3"};
    Append(ClusterFlags(), &argv);
    Append(extra, &argv);
    return std::make_unique<Subprocess>(argv, LogPath(absl::StrCat(tag_, "_ps_", incarnation)));
  }
  std::unique_ptr<Subprocess> StartWorker(int i, const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {BinPath("dtrain_worker"), "--job_name=worker",
                                     absl::StrCat("--task_index=", i), "--model=mlp", "--threads=1",
                                     "--log_every=100", "--mode=sync", "--seed=7"};
    Append(ClusterFlags(), &argv);
    Append(extra, &argv);
    return std::make_unique<Subprocess>(argv, LogPath(absl::StrCat(tag_, "_worker", i)));
  }
  std::unique_ptr<ps::PsInterface> Monitor() const {
    ps::GrpcClientOptions o;
    o.retry_window = absl::Milliseconds(200);
    o.rpc_timeout = absl::Seconds(2);
    absl::StatusOr<std::unique_ptr<ps::PsInterface>> c = ps::NewGrpcPsClient(ps_, o);
    return c.ok() ? std::move(*c) : nullptr;
  }

 private:
  static void Append(const std::vector<std::string>& from, std::vector<std::string>* to) {
    to->insert(to->end(), from.begin(), from.end());
  }
  std::string tag_;
  std::string ps_;
  std::vector<std::string> workers_;
};

int64_t GlobalStep(ps::PsInterface& monitor) {
  absl::StatusOr<ps::TrainingStats> s = monitor.GetStats();
  return s.ok() ? s->global_step : -1;
}

bool WaitForStep(ps::PsInterface& monitor, int64_t step, absl::Time deadline) {
  while (absl::Now() < deadline) {
    if (GlobalStep(monitor) >= step) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

// Polls `pred` every 20 ms until `deadline`.
template <typename Pred>
bool Eventually(Pred pred, absl::Time deadline) {
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return pred();
}

#define SKIP_WITHOUT_DATA() \
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist not installed (scripts/install_deps.sh)"

TEST(ShmProcess, WorkerKilledMidPushIsNeverHalfAppliedAndItsSegmentsAreUnmapped) {
  SKIP_WITHOUT_DATA();
  const std::set<std::string> shm_files = DevShmFiles();
  Cluster c(2, "mid_push");
  auto ps = c.StartPs({"--transport=shm"});
  auto w0 = c.StartWorker(0, {"--transport=shm", "--train_steps=300"});
  auto w1 = c.StartWorker(1, {"--transport=shm", "--train_steps=300", "--debug_kill_mid_push_at_step=80"});
  auto monitor = c.Monitor();
  ASSERT_NE(monitor, nullptr);
  ASSERT_TRUE(WaitForStep(*monitor, 40, absl::Now() + absl::Minutes(1))) << ps->Output();
  // Both workers attached: the ps maps the segments of both, more than worker 0 shares alone.
  const int both = ps::shm::CountSegments(ps->pid());
  const int of_w0 = ps::shm::CountSegments(w0->pid());
  EXPECT_GT(of_w0, 0);
  EXPECT_GT(both, of_w0) << "the ps should map both workers' segments";

  ASSERT_EQ(w1->Wait(absl::Minutes(1)), -9) << w1->Output();
  ASSERT_NE(w1->Output().find("killing this worker in the middle of the push of step 80"), std::string::npos)
      << w1->Output();
  // Its lanes closed with it: the ps unmaps its segments at once, without waiting for the lease.
  EXPECT_TRUE(Eventually([&] { return ps::shm::CountSegments(ps->pid()) == ps::shm::CountSegments(w0->pid()); },
                         absl::Now() + absl::Seconds(2)))
      << ps::shm::CountSegments(ps->pid()) << " segments mapped by the ps, worker 0 shares "
      << ps::shm::CountSegments(w0->pid());

  // The run reaches its end without worker 1: degraded (exit 3, docs/faults_and_endings.md).
  EXPECT_EQ(w0->Wait(absl::Minutes(2)), 3) << w0->Output();
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 3) << ps->Output();
  const std::string out = ps->Output();
  EXPECT_NE(out.find("worker 1's upload (request"), std::string::npos) << out;
  EXPECT_NE(out.find("ended unfinished with its lane: dropped, nothing of it applied"), std::string::npos) << out;
  EXPECT_NE(out.find("1 uploads cut off (none of them applied)"), std::string::npos) << out;
  EXPECT_NE(out.find("run degraded: training reached step 300 of 300 without worker 1 (lost"), std::string::npos)
      << out;
  EXPECT_NE(out.find("(balanced)"), std::string::npos) << out;
  EXPECT_GT(Count(w0->Output(), "data through shared memory"), 0) << w0->Output();
  EXPECT_TRUE(AbstractSockets(absl::StrCat("dtrain-ps0-", ps->pid(), "-")).empty());
  EXPECT_EQ(DevShmFiles(), shm_files) << "nothing may be left in /dev/shm";
}

TEST(ShmProcess, PsKilledAndStartedAgainWorkersAttachToTheNewProcess) {
  SKIP_WITHOUT_DATA();
  const std::string dir = absl::StrCat(::testing::TempDir(), "/shm_ckpt_restart");
  std::filesystem::remove_all(dir);
  Cluster c(1, "ps_restart");
  const std::vector<std::string> ps_flags = {"--transport=shm", "--checkpoint_dir=" + dir,
                                             "--save_checkpoint_steps=50"};
  auto ps = c.StartPs(ps_flags);
  auto w = c.StartWorker(0, {"--transport=shm", "--train_steps=400"});
  auto monitor = c.Monitor();
  ASSERT_NE(monitor, nullptr);
  ASSERT_TRUE(WaitForStep(*monitor, 120, absl::Now() + absl::Minutes(1))) << ps->Output();
  const int first_pid = ps->pid();
  ps->Kill();
  ps = c.StartPs(ps_flags, /*incarnation=*/1);
  EXPECT_EQ(w->Wait(absl::Minutes(2)), 0) << w->Output();
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 0) << ps->Output();
  const std::string out = w->Output();
  EXPECT_NE(out.find(absl::StrCat("data through shared memory (same host and user, ps pid ", first_pid, ")")),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(absl::StrCat("data through shared memory (same host and user, ps pid ", ps->pid(), ")")),
            std::string::npos)
      << out;
  EXPECT_NE(ps->Output().find("training reached step 400 of 400"), std::string::npos) << ps->Output();
  EXPECT_TRUE(AbstractSockets(absl::StrCat("dtrain-ps0-", first_pid, "-")).empty());
  EXPECT_TRUE(AbstractSockets(absl::StrCat("dtrain-ps0-", ps->pid(), "-")).empty());
  std::filesystem::remove_all(dir);
}

TEST(ShmProcess, StrangersGetNoRegion) {
  SKIP_WITHOUT_DATA();
  const std::string token = absl::StrCat(::testing::TempDir(), "/shm_token");
  const std::string wrong = absl::StrCat(::testing::TempDir(), "/shm_wrong_token");
  std::ofstream(token) << "the-cluster-secret-7f3a\n";
  std::ofstream(wrong) << "a-guess\n";
  Cluster c(1, "stranger");
  auto ps = c.StartPs({"--transport=shm", "--auth_token_file=" + token, "--registration_timeout_secs=20"});
  std::vector<std::string> sockets;
  ASSERT_TRUE(Eventually(
      [&] {
        sockets = AbstractSockets(absl::StrCat("dtrain-ps0-", ps->pid(), "-"));
        return !sockets.empty();
      },
      absl::Now() + absl::Seconds(20)))
      << ps->Output();

  // A process that skipped the gRPC handshake connects to the socket and presents a made-up ticket.
  absl::StatusOr<std::unique_ptr<ps::shm::Lane>> lane = ps::shm::Lane::Connect(sockets[0]);
  ASSERT_TRUE(lane.ok()) << lane.status();
  ps::shm::Hello hello{ps::shm::LaneKind::kPush, 0, std::string(32, 'a')};
  ASSERT_TRUE((*lane)->Send(ps::shm::FrameType::kHello, ps::shm::EncodeHello(hello)).ok());
  absl::StatusOr<ps::shm::Frame> welcome = (*lane)->Receive(absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  absl::StatusOr<ps::shm::PushResult> verdict = ps::shm::DecodePushResult(welcome->payload);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(verdict->status.code(), absl::StatusCode::kPermissionDenied) << verdict->status;
  // ... and the ps closed it.
  absl::StatusOr<ps::shm::Frame> after = (*lane)->Receive(absl::Now() + absl::Seconds(10));
  EXPECT_FALSE(after.ok());
  EXPECT_NE(after.status().code(), absl::StatusCode::kDeadlineExceeded) << after.status();

  // A worker with the wrong token is refused at its first call: it never gets an offer.
  auto w = c.StartWorker(0, {"--transport=shm", "--train_steps=50", "--auth_token_file=" + wrong,
                             "--startup_wait_secs=5"});
  EXPECT_NE(w->Wait(absl::Minutes(1)), 0) << w->Output();
  EXPECT_EQ(Count(w->Output(), "data through shared memory"), 0) << w->Output();
  ps->Kill();
  const std::string out = ps->Output();
  EXPECT_NE(out.find("refused a shared-memory connection"), std::string::npos) << out;
  EXPECT_NE(out.find("presented no valid ticket"), std::string::npos) << out;
}

TEST(ShmProcess, ShmRequiredAgainstAPsThatOffersNoneFailsSayingWhy) {
  SKIP_WITHOUT_DATA();
  Cluster c(1, "required");
  auto ps = c.StartPs({"--transport=grpc", "--registration_timeout_secs=20"});
  auto w = c.StartWorker(0, {"--transport=shm", "--train_steps=50"});
  const int code = w->Wait(absl::Minutes(1));
  EXPECT_NE(code, 0) << w->Output();
  EXPECT_NE(code, -9) << "it must end by itself\n" << w->Output();
  EXPECT_NE(w->Output().find("--transport=shm"), std::string::npos) << w->Output();
  ps->Kill();
}

}  // namespace
}  // namespace dtrain::testing
