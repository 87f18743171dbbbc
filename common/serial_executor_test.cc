#include "common/serial_executor.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/cancellation.h"
#include "common/denormals.h"
#include "gtest/gtest.h"

namespace dtrain {
namespace {

TEST(SerialExecutorTest, RunsInOrderOnItsThreadWithDenormalsFlushed) {
  std::vector<int> order;
  std::atomic<bool> ftz{false};
  std::thread::id lane_thread;
  {
    SerialExecutor lane(/*threaded=*/true, "test-lane");
    for (int i = 0; i < 100; ++i) {
      lane.Run([&, i] {
        order.push_back(i);
        lane_thread = std::this_thread::get_id();
        ftz = FlushDenormalsEnabled();
      });
    }
  }  // the destructor runs what is queued, then joins
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_NE(lane_thread, std::this_thread::get_id());
  EXPECT_TRUE(ftz);
}

TEST(SerialExecutorTest, InlineRunsBeforeReturning) {
  SerialExecutor inline_lane(/*threaded=*/false, "inline");
  bool ran = false;
  inline_lane.Run([&] { ran = true; });
  EXPECT_TRUE(ran);
}

TEST(CancellationTest, CallbacksRunOnceAndDeregisterWaits) {
  Cancellation cancel;
  std::atomic<int> calls{0};
  const int64_t id = cancel.Register([&] { ++calls; });
  cancel.Register([&] { ++calls; });
  const int64_t gone = cancel.Register([&] { calls += 100; });
  cancel.Deregister(gone);
  EXPECT_FALSE(cancel.cancelled());
  cancel.Cancel();
  cancel.Cancel();
  EXPECT_TRUE(cancel.cancelled());
  EXPECT_EQ(calls, 2);
  cancel.Deregister(id);  // after it ran: harmless
  const int64_t late = cancel.Register([&] { ++calls; });  // already cancelled: runs at once
  EXPECT_EQ(calls, 3);
  cancel.Deregister(late);  // returns (it once waited forever for a callback "running" under id 0)
}

}  // namespace
}  // namespace dtrain
