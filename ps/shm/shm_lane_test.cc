// Lanes over a socket pair: the doorbells that let a waiting end spin without system calls.
#include "ps/shm/shm_lane.h"

#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace dtrain::ps::shm {
namespace {

// Two connected lanes that have exchanged a Hello and its Welcome over the socket (as a worker and a ps do)
// and then share doorbells, each spinning `spin_us` before it sleeps.
struct LanePair {
  std::unique_ptr<Lane> worker, ps;
  LaneDoorbells bells;

  explicit LanePair(int spin_us) {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    worker = std::make_unique<Lane>(sv[0]);
    ps = std::make_unique<Lane>(sv[1]);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    EXPECT_TRUE(worker->Send(FrameType::kHello, "hello").ok());
    EXPECT_TRUE(ps->Receive(deadline).ok());
    EXPECT_TRUE(ps->Send(FrameType::kWelcome, "welcome").ok());
    ps->set_doorbells(&bells.ps_sent, &bells.worker_sent);
    EXPECT_TRUE(worker->Receive(deadline).ok());
    worker->set_doorbells(&bells.worker_sent, &bells.ps_sent);
    worker->set_spin(spin_us);
    ps->set_spin(spin_us);
  }
};

// A lone frame shows on the doorbell: a Receive that spins (here up to 2 s) returns as soon as it is sent, in
// both directions, for many frames in a row. (Counting the Hello or Welcome, as once, made each spin run its
// full length whenever one frame was pending.)
TEST(ShmLaneTest, ASpinningReceiveSeesALoneFrameAtOnce) {
  LanePair p(/*spin_us=*/2'000'000);
  const absl::Time start = absl::Now();
  for (int i = 0; i < 5; ++i) {
    std::thread sender([&] {
      absl::SleepFor(absl::Milliseconds(1));
      ASSERT_TRUE(p.worker->Send(FrameType::kPushFinish, "").ok());
    });
    absl::StatusOr<Frame> f = p.ps->Receive(absl::Now() + absl::Seconds(60));
    sender.join();
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->type, FrameType::kPushFinish);
    ASSERT_TRUE(p.ps->Send(FrameType::kPushResult, "r").ok());
    absl::StatusOr<Frame> r = p.worker->Receive(absl::Now() + absl::Seconds(60));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->type, FrameType::kPushResult);
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(ShmLaneTest, ASpinningWaitAnySeesALoneFrameAtOnce) {
  LanePair a(0), b(0);
  Lane* lanes[2] = {a.ps.get(), b.ps.get()};
  const absl::Time start = absl::Now();
  for (int i = 0; i < 5; ++i) {
    Lane* to = i % 2 == 0 ? b.worker.get() : a.worker.get();
    std::thread sender([&] {
      absl::SleepFor(absl::Milliseconds(1));
      ASSERT_TRUE(to->Send(FrameType::kPushFinish, "").ok());
    });
    absl::StatusOr<int> ready = Lane::WaitAny(lanes, 2, absl::Now() + absl::Seconds(60), /*spin_us=*/2'000'000);
    sender.join();
    ASSERT_TRUE(ready.ok()) << ready.status();
    EXPECT_EQ(*ready, i % 2 == 0 ? 1 : 0);
    ASSERT_TRUE(lanes[*ready]->Receive(absl::Now() + absl::Seconds(60)).ok());
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

// Past its first 20 µs a spin yields its core (sched_yield): a thread with work on the same core gets it
// while a Receive spins there for 300 ms. (A spin that only paused would share the core half and half.)
TEST(ShmLaneTest, ALongSpinGivesItsCoreToAThreadWithWork) {
  LanePair p(/*spin_us=*/0);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  auto pin = [&one] { return pthread_setaffinity_np(pthread_self(), sizeof(one), &one) == 0; };
  auto thread_cpu = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return absl::DurationFromTimespec(ts);
  };
  if (!pin()) GTEST_SKIP() << "cannot pin a thread to one core here";
  std::atomic<bool> started{false};
  absl::Duration busy_cpu;
  std::thread busy([&] {
    if (!pin()) return;
    started = true;
    const absl::Duration cpu0 = thread_cpu();
    const absl::Time until = absl::Now() + absl::Milliseconds(300);
    volatile uint64_t sink = 0;
    while (absl::Now() < until) {
      for (int i = 0; i < 1000; ++i) sink = sink + i;
    }
    busy_cpu = thread_cpu() - cpu0;
  });
  while (!started) std::this_thread::yield();
  const absl::Duration cpu0 = thread_cpu();
  absl::StatusOr<Frame> f = p.ps->Receive(absl::Now() + absl::Milliseconds(300), nullptr, /*spin_us=*/300'000);
  const absl::Duration spin_cpu = thread_cpu() - cpu0;
  busy.join();
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(spin_cpu, busy_cpu / 4) << "spinning took " << spin_cpu << " of the core, the busy thread " << busy_cpu;
}

// Without doorbells a spin polls the socket, and sees the frame as well.
TEST(ShmLaneTest, WithoutDoorbellsASpinPollsTheSocket) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  Lane worker(sv[0]), ps(sv[1]);
  ps.set_spin(2'000'000);
  const absl::Time start = absl::Now();
  std::thread sender([&] {
    absl::SleepFor(absl::Milliseconds(1));
    ASSERT_TRUE(worker.Send(FrameType::kPushFinish, "").ok());
  });
  absl::StatusOr<Frame> f = ps.Receive(absl::Now() + absl::Seconds(60));
  sender.join();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

}  // namespace
}  // namespace dtrain::ps::shm
