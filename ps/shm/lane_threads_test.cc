// LaneThreads: the limit, the refused connections' descriptors, and StopAll shutting the lanes still served.
#include "ps/shm/lane_threads.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace dtrain::ps::shm {
namespace {

// A lane that blocks its thread until Shutdown.
struct FakeLane {
  absl::Notification shut;
  std::atomic<int> shutdowns{0};
  int64_t bytes = 0;
  void Shutdown() {
    if (shutdowns.fetch_add(1) == 0) shut.Notify();
  }
};

int OpenFd() {
  int p[2];
  EXPECT_EQ(pipe(p), 0);
  close(p[1]);
  return p[0];
}

bool IsOpen(int fd) { return fcntl(fd, F_GETFD) != -1; }

TEST(LaneThreadsTest, RefusesPastTheLimitAndStopAllShutsTheLanesItServes) {
  LaneThreads<FakeLane> threads(2);
  FakeLane lanes[2];
  absl::Notification marked[2];
  std::atomic<int> served{0};
  for (int i = 0; i < 2; ++i) {
    const int fd = OpenFd();
    ASSERT_TRUE(threads.Start(fd, [&, i](int socket, LaneThreads<FakeLane>::Slot* slot) {
      ASSERT_TRUE(threads.Serve(slot, &lanes[i]));
      marked[i].Notify();
      lanes[i].shut.WaitForNotification();  // serves until shut
      close(socket);
      served.fetch_add(1);
    }));
  }
  for (auto& m : marked) ASSERT_TRUE(m.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(threads.active(), 2);

  // A third connection while two are served: closed here and counted.
  const int third = OpenFd();
  bool ran = false;
  EXPECT_FALSE(threads.Start(third, [&](int, LaneThreads<FakeLane>::Slot*) { ran = true; }));
  EXPECT_FALSE(IsOpen(third));
  EXPECT_EQ(threads.refused(), 1);

  lanes[0].bytes = 5;
  lanes[1].bytes = 7;
  int64_t seen = 0;
  threads.ForEachServing([&](const FakeLane& l) { seen += l.bytes; });
  EXPECT_EQ(seen, 12);

  threads.StopAll();  // returns only when both threads are done, each lane shut (maybe again while it ends)
  EXPECT_EQ(served.load(), 2);
  EXPECT_GE(lanes[0].shutdowns.load(), 1);
  EXPECT_GE(lanes[1].shutdowns.load(), 1);
  EXPECT_EQ(threads.active(), 0);
  EXPECT_FALSE(ran);

  // Stopped: nothing starts, nothing is marked.
  const int late = OpenFd();
  EXPECT_FALSE(threads.Start(late, [&](int, LaneThreads<FakeLane>::Slot*) { ran = true; }));
  EXPECT_FALSE(IsOpen(late));
  EXPECT_EQ(threads.refused(), 2);
  threads.StopAll();  // idempotent
  EXPECT_FALSE(ran);
}

TEST(LaneThreadsTest, FinishedThreadsFreeTheirPlaceAndAreJoined) {
  LaneThreads<FakeLane> threads(1);
  for (int round = 0; round < 20; ++round) {
    absl::Notification done;
    ASSERT_TRUE(threads.Start(OpenFd(), [&](int socket, LaneThreads<FakeLane>::Slot* slot) {
      FakeLane lane;
      EXPECT_TRUE(threads.Serve(slot, &lane));
      threads.Release(slot);  // unmarked: StopAll would not reach it
      close(socket);
      done.Notify();
    })) << round;
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    for (int i = 0; i < 1000 && threads.active() > 0; ++i) absl::SleepFor(absl::Milliseconds(1));
    EXPECT_EQ(threads.active(), 0) << round;  // the limit of 1 lets the next round in
  }
  int64_t marked = 0;
  threads.ForEachServing([&](const FakeLane&) { ++marked; });
  EXPECT_EQ(marked, 0);
  EXPECT_EQ(threads.refused(), 0);
}

// A thread that marks its lane after StopAll began is told so (Serve: false) and ends without serving.
TEST(LaneThreadsTest, ServeAfterStopIsRefused) {
  LaneThreads<FakeLane> threads(4);
  absl::Notification started, go;
  std::atomic<bool> serve_result{true};
  ASSERT_TRUE(threads.Start(OpenFd(), [&](int socket, LaneThreads<FakeLane>::Slot* slot) {
    started.Notify();
    go.WaitForNotification();
    FakeLane lane;
    serve_result = threads.Serve(slot, &lane);
    close(socket);
  }));
  started.WaitForNotification();
  std::thread stopper([&] { threads.StopAll(); });
  absl::SleepFor(absl::Milliseconds(50));  // StopAll is waiting for the thread
  go.Notify();
  stopper.join();
  EXPECT_FALSE(serve_result.load());
}

}  // namespace
}  // namespace dtrain::ps::shm
