// A ps task (a real dtrain_ps process) killed with SIGKILL and started again on the same address is reached
// again by an existing client within a second or two of its return (ps/rpc/grpc_ps_client.cc: AwaitConnection
// and the channel's reconnect backoff). The server must be another process: a server in the test's own process
// polls the same file descriptors as the client and would hide a client that never polls its broken channel.
#include <iostream>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ps/rpc/grpc_ps_client.h"
#include "tests/subprocess.h"

namespace dtrain::testing {
namespace {

std::string LogPath(const std::string& name) { return absl::StrCat(::testing::TempDir(), "/", name, ".log"); }

// Heartbeat is one attempt, and answers anything but Unavailable once the task is reachable (here Aborted: the
// task has no config and no session for the worker).
bool Reachable(ps::PsInterface& ps) { return ps.Heartbeat(0, 1).status().code() != absl::StatusCode::kUnavailable; }

// Polls until `ps` is reachable or `limit` passed; returns how long it took (limit + 1 s when never).
absl::Duration TimeToReach(ps::PsInterface& ps, absl::Duration limit) {
  const absl::Time start = absl::Now();
  while (absl::Now() - start < limit) {
    if (Reachable(ps)) return absl::Now() - start;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return limit + absl::Seconds(1);
}

TEST(GrpcReconnectTest, KilledAndRestartedPsProcessIsReachedAgainQuickly) {
  const std::vector<int> ports = FreePorts(2);
  const std::string address = absl::StrCat("127.0.0.1:", ports[0]);
  const std::vector<std::string> argv = {BinPath("dtrain_ps"), "--job_name=ps", "--task_index=0",
                                         "--ps_hosts=" + address,
                                         absl::StrCat("--worker_hosts=127.0.0.1:", ports[1]), "--max_run_secs=120"};
  auto ps = std::make_unique<Subprocess>(argv, LogPath("reconnect_ps_a"));
  absl::StatusOr<std::unique_ptr<ps::PsInterface>> client = ps::NewGrpcPsClient(address, {});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_LT(TimeToReach(**client, absl::Seconds(30)), absl::Seconds(30)) << ps->Output();

  // The task dies; the worker keeps trying for a while (as its retries of pushes and pulls do), so that the
  // channel goes through failed connection attempts and backs off.
  ps->Kill();
  const absl::Time down_until = absl::Now() + absl::Milliseconds(2500);
  while (absl::Now() < down_until) {
    EXPECT_FALSE(Reachable(**client));
    absl::SleepFor(absl::Milliseconds(100));
  }

  // The task comes back on the same address. Left to gRPC's defaults (no polling of a channel in
  // TRANSIENT_FAILURE but the 5 s backup poller, backoff up to 120 s) this took 5-10 s or more.
  ps = std::make_unique<Subprocess>(argv, LogPath("reconnect_ps_b"));
  const absl::Duration took = TimeToReach(**client, absl::Seconds(30));
  std::cout << "reconnect: a restarted ps process reached " << absl::FormatDuration(took) << " after its start\n";
  // dtrain_ps itself needs some 100-300 ms to start listening; the channel retries a refused connection after
  // at most GRPC_ARG_MAX_RECONNECT_BACKOFF_MS (1 s) plus jitter.
  EXPECT_LT(took, absl::Seconds(3)) << ps->Output();
  ps->Kill();
}

}  // namespace
}  // namespace dtrain::testing
