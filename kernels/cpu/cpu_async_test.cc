// The CPU backend's side of the asynchronous / device-resident interface (kernels/device.h): its queues are
// one synchronous queue, counters live in host memory, dropout can read its counter from "device" memory, the
// device optimizer applies the shared optimizer arithmetic, and graph capture is refused with a reason.
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/async_readback.h"
#include "kernels/cpu/cpu_test_util.h"
#include "kernels/optimizer_math.h"
#include "kernels/reference_ops.h"

namespace dtrain::kernels::testing {
namespace {

class CpuAsyncTest : public CpuDeviceTest {};

TEST_P(CpuAsyncTest, CopiesAndEventsAreSynchronous) {
  const int64_t n = 1000;
  const std::vector<float> x = RandomVector(n, 1);
  auto pinned = dev_->AllocHostPinned(n);
  ASSERT_TRUE(pinned.ok());
  std::memcpy(*pinned, x.data(), n * sizeof(float));
  float* d = Zeros(n);
  ASSERT_TRUE(dev_->CopyToDeviceAsync(*pinned, d, n, Queue::kCopy).ok());
  auto e = dev_->MakeEvent();
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(dev_->RecordEvent(e->get(), Queue::kCopy).ok());
  ASSERT_TRUE(dev_->WaitEvent(e->get(), Queue::kCompute).ok());
  ASSERT_TRUE(dev_->Relu(d, d, n).ok());
  std::vector<float> back(n);
  ASSERT_TRUE(dev_->CopyToHostAsync(d, back.data(), n, Queue::kCompute).ok());
  ASSERT_TRUE(dev_->SynchronizeEvent(e->get()).ok());
  auto done = dev_->QueryEvent(e->get());
  ASSERT_TRUE(done.ok() && *done);
  std::vector<float> want(n);
  reference::Relu(x.data(), want.data(), n);
  EXPECT_EQ(back, want);
  dev_->FreeHostPinned(*pinned);

  // Another device's event is refused.
  auto other = CreateCpuDevice(DeviceSpec::Cpu(1));
  ASSERT_TRUE(other.ok());
  auto foreign = (*other)->MakeEvent();
  ASSERT_TRUE(foreign.ok());
  EXPECT_EQ(dev_->RecordEvent(foreign->get(), Queue::kCompute).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->RecordEvent(nullptr, Queue::kCompute).code(), absl::StatusCode::kInvalidArgument);
  // ... but may be waited on (cross-device ordering between towers; nothing to wait for on the CPU).
  EXPECT_TRUE(dev_->WaitEvent(foreign->get(), Queue::kCompute).ok());
  EXPECT_EQ(dev_->WaitEvent(nullptr, Queue::kCompute).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(CpuAsyncTest, GroupCaptureIsUnimplementedAndChecksItsDevices) {
  auto other = CreateDevice(DeviceSpec::Cpu(1));
  ASSERT_TRUE(other.ok());
  const absl::Status s = BeginCaptureGroup({dev_.get(), other->get()});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_EQ(EndCaptureGroup({dev_.get(), other->get()}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(BeginCaptureGroup({}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BeginCaptureGroup({dev_.get(), dev_.get()}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BeginCaptureGroup({dev_.get(), nullptr}).code(), absl::StatusCode::kInvalidArgument);
}

// The value lands in the slot the counter names when the op runs (a ring of recent losses).
TEST_P(CpuAsyncTest, CopyToCounterSlotWritesTheCountersSlot) {
  float* ring = Zeros(3);
  float* value = Upload({2.5f});
  auto counter = dev_->MakeCounter(7);
  ASSERT_TRUE(counter.ok());
  ASSERT_TRUE(dev_->CopyToCounterSlot(value, ring, 3, **counter).ok());  // 7 mod 3 = 1
  ASSERT_TRUE((*counter)->Increment().ok());
  ASSERT_TRUE(dev_->Fill(4.0f, value, 1).ok());
  ASSERT_TRUE(dev_->CopyToCounterSlot(value, ring, 3, **counter).ok());  // 8 mod 3 = 2
  EXPECT_EQ(Download(ring, 3), std::vector<float>({0.0f, 2.5f, 4.0f}));
  ASSERT_TRUE((*counter)->Set(-1).ok());
  ASSERT_TRUE(dev_->CopyToCounterSlot(value, ring, 3, **counter).ok());  // never a negative index
  EXPECT_EQ(Download(ring, 3)[2], 4.0f);
  EXPECT_EQ(dev_->CopyToCounterSlot(value, ring, 0, **counter).code(), absl::StatusCode::kInvalidArgument);
  auto other = CreateCpuDevice(DeviceSpec::Cpu(1));
  ASSERT_TRUE(other.ok());
  auto foreign = (*other)->MakeCounter(0);
  ASSERT_TRUE(foreign.ok());
  EXPECT_EQ(dev_->CopyToCounterSlot(value, ring, 3, **foreign).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(CpuAsyncTest, GraphCaptureIsUnimplementedWithAReason) {
  const absl::Status s = dev_->BeginCapture();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("CUDA"), std::string::npos) << s;
  EXPECT_EQ(dev_->EndCapture().status().code(), absl::StatusCode::kFailedPrecondition);
  // The device is unaffected.
  float* x = Zeros(4);
  EXPECT_TRUE(dev_->Fill(1.0f, x, 4).ok());
  EXPECT_EQ(Download(x, 4), std::vector<float>(4, 1.0f));
}

TEST_P(CpuAsyncTest, CountersAndAsyncReadback) {
  auto c = dev_->MakeCounter(7);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*(*c)->device_ptr(), 7);
  ASSERT_TRUE((*c)->Increment().ok());
  ASSERT_TRUE((*c)->Increment().ok());
  auto v = (*c)->Read();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 9);
  ASSERT_TRUE((*c)->Set(-1).ok());
  EXPECT_EQ(*(*c)->Read(), -1);

  auto reader = AsyncReadback::Create(dev_.get(), 2);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto not_yet = (*reader)->Ready();
  ASSERT_TRUE(not_yet.ok());
  EXPECT_FALSE(*not_yet);
  EXPECT_EQ((*reader)->Wait().status().code(), absl::StatusCode::kFailedPrecondition);
  float* loss = Upload({0.25f, 4.0f});
  ASSERT_TRUE((*reader)->Start(loss).ok());
  ASSERT_TRUE(dev_->Fill(9.0f, loss, 2).ok());  // later work does not change what was read
  auto got = (*reader)->Wait();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0], 0.25f);
  EXPECT_EQ((*got)[1], 4.0f);
  EXPECT_EQ(AsyncReadback::Create(dev_.get(), 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// The counter read from memory gives Dropout's mask for that counter, bit for bit; the next value a new mask.
TEST_P(CpuAsyncTest, DropoutDeviceCounterEqualsDropoutAtThatCounter) {
  const int64_t n = 100003;
  const std::vector<float> x = RandomVector(n, 2);
  float* dx = Upload(x);
  float *y = Zeros(n), *mask = Zeros(n), *y_ref = Zeros(n), *mask_ref = Zeros(n);
  auto counter = dev_->MakeCounter(11);
  ASSERT_TRUE(counter.ok());
  std::vector<float> previous;
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(dev_->DropoutDeviceCounter(dx, y, mask, n, 0.7f, 5, **counter, 64, 2).ok());
    ASSERT_TRUE(dev_->Dropout(dx, y_ref, mask_ref, n, 0.7f, 5, (11 + round) * 64 + 2).ok());
    const std::vector<float> m = Download(mask, n);
    EXPECT_EQ(m, Download(mask_ref, n)) << "round " << round;
    EXPECT_EQ(Download(y, n), Download(y_ref, n)) << "round " << round;
    std::vector<float> m_ref(n);
    reference::DropoutMask(n, 0.7f, 5, (11 + round) * 64 + 2, m_ref.data());
    EXPECT_EQ(m, m_ref) << "the reference loop of kernels/dropout_rng.h";
    if (!previous.empty()) {
      EXPECT_NE(m, previous) << "round " << round << " drew the previous mask";
    }
    previous = m;
    ASSERT_TRUE((*counter)->Increment().ok());
  }
  auto other = CreateCpuDevice(DeviceSpec::Cpu(1));
  ASSERT_TRUE(other.ok());
  auto foreign = (*other)->MakeCounter(0);
  ASSERT_TRUE(foreign.ok());
  EXPECT_EQ(dev_->DropoutDeviceCounter(dx, y, mask, n, 0.7f, 5, **foreign, 1, 0).code(),
            absl::StatusCode::kInvalidArgument);
}

// The device optimizer reads the step from its counter and applies optimizer_math's loops, for any thread
// count.
TEST_P(CpuAsyncTest, OptimizerAppliesTheSharedArithmeticAtTheCounterStep) {
  const int64_t n = 200003;  // several chunks
  OptimizerParams p;
  p.kind = OptimizerParams::Kind::kAdam;
  p.learning_rate = 0.01f;
  p.decay_steps = 10;
  p.decay_rate = 0.5f;
  p.moving_average_decay = 0.99f;
  const std::vector<float> var0 = RandomVector(n, 3), g = RandomVector(n, 4);
  float *var = Upload(var0), *m = Zeros(n), *v = Zeros(n), *shadow = Upload(var0), *grad = Upload(g);
  auto step = dev_->MakeCounter(25);
  ASSERT_TRUE(step.ok());
  auto opt = dev_->MakeOptimizer(p, step->get());
  ASSERT_TRUE(opt.ok()) << opt.status();
  ASSERT_TRUE((*opt)->Apply({grad, var, m, v, shadow, n}, 0.5f).ok());

  std::vector<float> rv = var0, rm(n, 0.0f), rvv(n, 0.0f), rs = var0;
  const float lr = DecayedLearningRate(0.01f, 0.5f, 10, false, 25);
  ApplyAdamLoop(AdamLearningRate(lr, 0.9f, 0.999f, 25), 0.9f, 0.999f, 1e-8f, 0.5f, g.data(), rv.data(),
                rm.data(), rvv.data(), n);
  UpdateMovingAverageLoop(MovingAverageDecay(0.99f, 26), rv.data(), rs.data(), n);
  EXPECT_EQ(Download(var, n), rv);
  EXPECT_EQ(Download(m, n), rm);
  EXPECT_EQ(Download(v, n), rvv);
  EXPECT_EQ(Download(shadow, n), rs);

  // Bad buffers and params.
  EXPECT_EQ((*opt)->Apply({grad, var, m, nullptr, nullptr, n}, 1.0f).code(),
            absl::StatusCode::kInvalidArgument);
  OptimizerParams sgd;
  auto plain = dev_->MakeOptimizer(sgd, step->get());
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->Apply({grad, var, nullptr, nullptr, shadow, n}, 1.0f).code(),
            absl::StatusCode::kInvalidArgument)
      << "a shadow without moving_average_decay";
  sgd.learning_rate = -1.0f;
  EXPECT_EQ(dev_->MakeOptimizer(sgd, step->get()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->MakeOptimizer(p, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuAsyncTest, ::testing::Values(1, 3));

}  // namespace
}  // namespace dtrain::kernels::testing
