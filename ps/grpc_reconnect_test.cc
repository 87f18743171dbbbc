// A ps task that dies and comes back on the same address is reached again within about a second of its
// return: the client's channel reconnects by itself (workers of a restarted ps then hear "register again" and
// recover; see tests/fault_process_test.cc for the whole cluster).
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ps/grpc_ps_client.h"
#include "ps/server.h"

namespace dtrain::ps {
namespace {

absl::StatusOr<std::unique_ptr<PsServer>> StartServer(const std::string& address) {
  PsServerOptions so;
  so.listen_address = address;
  so.ps.num_workers = 1;
  so.linger = absl::ZeroDuration();
  return PsServer::Start(so);
}

// Heartbeat is one attempt, and answers anything but Unavailable once the task is reachable (here Aborted: it
// has no config and no session for the worker).
bool Reachable(PsInterface& ps) {
  return ps.Heartbeat(0, 1).status().code() != absl::StatusCode::kUnavailable;
}

TEST(GrpcReconnectTest, RestartedTaskIsReachedAgainWithinASecondOrTwo) {
  absl::StatusOr<std::unique_ptr<PsServer>> server = StartServer("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  absl::StatusOr<std::unique_ptr<PsInterface>> client = NewGrpcPsClient(address, {});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(Reachable(**client));

  // The task dies; the worker keeps trying for a while (as its retries of pushes and pulls do), so that the
  // channel goes through its failed connection attempts and asks its resolver again.
  server->reset();
  const absl::Time down_until = absl::Now() + absl::Milliseconds(2500);
  while (absl::Now() < down_until) {
    EXPECT_FALSE(Reachable(**client));
    absl::SleepFor(absl::Milliseconds(100));
  }

  // The task comes back on the same address.
  absl::StatusOr<std::unique_ptr<PsServer>> again = StartServer(address);
  ASSERT_TRUE(again.ok()) << again.status();
  const absl::Time back = absl::Now();
  bool reached = false;
  while (!reached && absl::Now() - back < absl::Seconds(30)) {
    reached = Reachable(**client);
    if (!reached) absl::SleepFor(absl::Milliseconds(50));
  }
  const absl::Duration took = absl::Now() - back;
  ASSERT_TRUE(reached) << "ps task at " << address << " not reached within 30 s of its restart";
  // gRPC retries a refused connection after at most GRPC_ARG_MAX_RECONNECT_BACKOFF_MS (1 s, plus jitter); the
  // resolver is asked again at most every 100 ms. Left at gRPC's defaults this took 5-10 s.
  EXPECT_LT(took, absl::Seconds(3)) << "reached " << absl::FormatDuration(took) << " after the restart";
}

}  // namespace
}  // namespace dtrain::ps
