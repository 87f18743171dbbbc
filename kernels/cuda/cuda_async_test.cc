// The CUDA backend's asynchronous execution against the CPU backend: copies on the copy stream ordered by
// events, the asynchronous loss read, device counters, and CUDA graphs (capture of elementwise ops, dropout
// with a device counter, cuDNN convolutions and cuBLAS GEMMs; replay; what a capture refuses). Every test
// skips without a usable CUDA device.
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/async_readback.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/device.h"

namespace dtrain::kernels::cuda {
namespace {

class CudaAsyncTest : public CudaVsCpuTest {
 protected:
  float* Pinned(int64_t n) {
    auto p = gpu_->AllocHostPinned(n);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : nullptr;
  }
};

// Upload on the copy stream, compute on the compute stream after an event, download asynchronously: the
// values are the CPU's once the last event has completed.
TEST_F(CudaAsyncTest, CopyStreamAndEventsOrderWork) {
  const int64_t n = 1 << 20;
  const std::vector<float> x = Random(n, 1);
  float* up = Pinned(n);
  float* down = Pinned(n);
  ASSERT_TRUE(up != nullptr && down != nullptr);
  std::memcpy(up, x.data(), n * sizeof(float));
  Both buf = Zeros(n), ref = Upload(x);  // Zeros fills on the compute stream...
  auto zeroed = gpu_->MakeEvent();
  auto uploaded = gpu_->MakeEvent();
  auto computed = gpu_->MakeEvent();
  ASSERT_TRUE(zeroed.ok() && uploaded.ok() && computed.ok());
  ASSERT_TRUE(gpu_->RecordEvent(zeroed->get(), Queue::kCompute).ok());  // ... so the upload waits for it
  ASSERT_TRUE(gpu_->WaitEvent(zeroed->get(), Queue::kCopy).ok());
  ASSERT_TRUE(gpu_->CopyToDeviceAsync(up, buf.gpu, n, Queue::kCopy).ok());
  ASSERT_TRUE(gpu_->RecordEvent(uploaded->get(), Queue::kCopy).ok());
  ASSERT_TRUE(gpu_->WaitEvent(uploaded->get(), Queue::kCompute).ok());
  ASSERT_TRUE(gpu_->Relu(buf.gpu, buf.gpu, n).ok());
  ASSERT_TRUE(gpu_->RecordEvent(computed->get(), Queue::kCompute).ok());
  ASSERT_TRUE(gpu_->WaitEvent(computed->get(), Queue::kCopy).ok());
  ASSERT_TRUE(gpu_->CopyToHostAsync(buf.gpu, down, n, Queue::kCopy).ok());
  auto downloaded = gpu_->MakeEvent();
  ASSERT_TRUE(downloaded.ok());
  ASSERT_TRUE(gpu_->RecordEvent(downloaded->get(), Queue::kCopy).ok());
  ASSERT_TRUE(gpu_->SynchronizeEvent(downloaded->get()).ok());
  auto done = gpu_->QueryEvent(downloaded->get());
  ASSERT_TRUE(done.ok() && *done);
  ASSERT_TRUE(cpu_->Relu(ref.cpu, ref.cpu, n).ok());
  EXPECT_EQ(std::vector<float>(down, down + n), Cpu(ref));
  gpu_->FreeHostPinned(up);
  gpu_->FreeHostPinned(down);
}

TEST_F(CudaAsyncTest, AsyncCopiesNeedPinnedMemoryAndOwnEvents) {
  std::vector<float> pageable(16);
  Both buf = Zeros(16);
  EXPECT_EQ(gpu_->CopyToDeviceAsync(pageable.data(), buf.gpu, 16, Queue::kCopy).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->CopyToHostAsync(buf.gpu, pageable.data(), 16, Queue::kCompute).code(),
            absl::StatusCode::kInvalidArgument);
  auto cpu_event = cpu_->MakeEvent();
  ASSERT_TRUE(cpu_event.ok());
  EXPECT_EQ(gpu_->RecordEvent(cpu_event->get(), Queue::kCompute).code(), absl::StatusCode::kInvalidArgument);
  // A pointer inside a pinned buffer is pinned too (per-layer copies address slices of one staging buffer).
  float* pinned = Pinned(64);
  ASSERT_NE(pinned, nullptr);
  EXPECT_TRUE(gpu_->CopyToHostAsync(buf.gpu, pinned + 8, 16, Queue::kCompute).ok());
  EXPECT_TRUE(gpu_->Synchronize().ok());
  gpu_->FreeHostPinned(pinned);
}

// The loss of step k is read while later steps are already enqueued.
TEST_F(CudaAsyncTest, AsyncReadbackReadsTheValueAtStart) {
  auto reader = AsyncReadback::Create(gpu_.get(), 1);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->Wait().status().code(), absl::StatusCode::kFailedPrecondition);
  Both loss = Zeros(1);
  ASSERT_TRUE(gpu_->Fill(2.5f, loss.gpu, 1).ok());
  ASSERT_TRUE((*reader)->Start(loss.gpu).ok());
  ASSERT_TRUE(gpu_->Fill(7.0f, loss.gpu, 1).ok());  // a later step overwrites the device value
  auto got = (*reader)->Wait();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0], 2.5f);
  auto ready = (*reader)->Ready();
  ASSERT_TRUE(ready.ok() && *ready);
}

TEST_F(CudaAsyncTest, CountersSetIncrementRead) {
  auto c = gpu_->MakeCounter(41);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Increment().ok());
  auto v = (*c)->Read();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 42);
  ASSERT_TRUE((*c)->Set(-5).ok());
  ASSERT_TRUE((*c)->Increment().ok());
  v = (*c)->Read();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, -4);
}

// A captured sequence of elementwise ops with device-counter dropout, replayed: each replay equals the CPU's
// eager run of the same ops at that counter value, and successive replays draw different masks.
TEST_F(CudaAsyncTest, CapturedElementwiseStepReplaysLikeCpu) {
  const int64_t n = 50001;
  Both x = Upload(Random(n, 3)), h = Zeros(n), y = Zeros(n), mask = Zeros(n), acc = Zeros(n);
  auto cpu_step = cpu_->MakeCounter(0);
  auto gpu_step = gpu_->MakeCounter(0);
  ASSERT_TRUE(cpu_step.ok() && gpu_step.ok());
  auto enqueue = [&](Device* d, DeviceCounter* step, bool g) -> absl::Status {
    const float* xs = g ? x.gpu : x.cpu;
    float *hs = g ? h.gpu : h.cpu, *ys = g ? y.gpu : y.cpu, *ms = g ? mask.gpu : mask.cpu,
          *as = g ? acc.gpu : acc.cpu;
    absl::Status s = d->Scale(1.5f, xs, hs, n);
    if (s.ok()) s = d->Relu(hs, hs, n);
    if (s.ok()) s = d->DropoutDeviceCounter(hs, ys, ms, n, 0.5f, 99, *step, 64, 1);
    if (s.ok()) s = d->Axpy(0.25f, ys, as, n);
    if (s.ok()) s = step->Increment();
    return s;
  };
  ASSERT_TRUE(gpu_->BeginCapture().ok());
  ASSERT_TRUE(enqueue(gpu_.get(), gpu_step->get(), true).ok());
  auto graph = gpu_->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::vector<float> previous_mask;
  for (int replay = 0; replay < 5; ++replay) {
    SCOPED_TRACE(::testing::Message() << "replay " << replay);
    ASSERT_TRUE((*graph)->Launch().ok());
    ASSERT_TRUE(enqueue(cpu_.get(), cpu_step->get(), false).ok());
    const std::vector<float> gm = Gpu(mask);
    EXPECT_EQ(gm, Cpu(mask));
    EXPECT_TRUE(Same(acc, 1e-6f, 1e-7f));
    if (!previous_mask.empty()) {
      EXPECT_NE(gm, previous_mask);
    }
    previous_mask = gm;
  }
  auto steps = (*gpu_step)->Read();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, 5);
}

// cuDNN convolution, cuBLAS dense, pooling and the loss in a graph: algorithms and workspaces were chosen
// when the ops were made, so capture succeeds and replays compute what eager CPU ops compute.
TEST_F(CudaAsyncTest, CapturedConvDenseForwardBackwardMatchesCpu) {
  Conv2DParams cp{4, 12, 12, 3, 8, 5, 5, 1, 1, Padding::kSame};
  PoolParams pp{4, 12, 12, 8, 2, 2, Padding::kSame};
  DenseParams dp{4, 6 * 6 * 8, 10};
  auto cpu_conv = cpu_->MakeConv2D(cp);
  auto gpu_conv = gpu_->MakeConv2D(cp);
  auto cpu_pool = cpu_->MakeMaxPool(pp);
  auto gpu_pool = gpu_->MakeMaxPool(pp);
  auto cpu_dense = cpu_->MakeDense(dp);
  auto gpu_dense = gpu_->MakeDense(dp);
  ASSERT_TRUE(cpu_conv.ok() && gpu_conv.ok() && cpu_pool.ok() && gpu_pool.ok() && cpu_dense.ok() &&
              gpu_dense.ok());
  const int64_t nx = 4 * 12 * 12 * 3, nc = 4 * 12 * 12 * 8, np = 4 * 6 * 6 * 8, nw = 5 * 5 * 3 * 8;
  const int64_t nd = int64_t{dp.in} * dp.out;
  Both x = Upload(Random(nx, 5)), w = Upload(Random(nw, 6, -0.2f, 0.2f)), b = Upload(Random(8, 7));
  Both dw_ = Upload(Random(nd, 8, -0.1f, 0.1f)), db_ = Upload(Random(10, 9));
  Both c = Zeros(nc), p = Zeros(np), logits = Zeros(40), labels = Upload({1, 3, 5, 7}), dlogits = Zeros(40);
  Both loss = Zeros(1), dp_ = Zeros(np), dc = Zeros(nc), gw = Zeros(nw), gb = Zeros(8), gdw = Zeros(nd),
       gdb = Zeros(10);
  auto run = [&](Device* d, Conv2D* conv, MaxPool* pool, Dense* dense, bool g) -> absl::Status {
    auto P = [g](const Both& v) { return g ? v.gpu : v.cpu; };
    absl::Status s = conv->Forward(P(x), P(w), P(b), P(c));
    if (s.ok()) s = d->Relu(P(c), P(c), nc);
    if (s.ok()) s = pool->Forward(P(c), P(p));
    if (s.ok()) s = dense->Forward(P(p), P(dw_), P(db_), P(logits));
    if (s.ok()) s = d->SoftmaxCrossEntropy(P(logits), P(labels), 4, 10, P(dlogits), P(loss));
    if (s.ok()) s = dense->BackwardWeights(P(p), P(dlogits), P(gdw), P(gdb));
    if (s.ok()) s = dense->BackwardData(P(dlogits), P(dw_), P(dp_));
    if (s.ok()) s = pool->Backward(P(dp_), P(dc));
    if (s.ok()) s = d->ReluBackward(P(c), P(dc), P(dc), nc);
    if (s.ok()) s = conv->BackwardWeights(P(x), P(dc), P(gw), P(gb));
    return s;
  };
  // Eager warm-up on the GPU, then capture.
  ASSERT_TRUE(run(gpu_.get(), gpu_conv->get(), gpu_pool->get(), gpu_dense->get(), true).ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  ASSERT_TRUE(gpu_->Fill(0.0f, gw.gpu, nw).ok());
  ASSERT_TRUE(gpu_->BeginCapture().ok());
  ASSERT_TRUE(run(gpu_.get(), gpu_conv->get(), gpu_pool->get(), gpu_dense->get(), true).ok());
  auto graph = gpu_->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE((*graph)->Launch().ok());
  ASSERT_TRUE(run(cpu_.get(), cpu_conv->get(), cpu_pool->get(), cpu_dense->get(), false).ok());
  EXPECT_TRUE(Same(loss, 1e-4f, 1e-5f)) << "loss";
  EXPECT_TRUE(Same(gdw)) << "dense dw";
  EXPECT_TRUE(Same(gw)) << "conv dw";
  EXPECT_TRUE(Same(gb)) << "conv db";
}

// During a capture, calls that would synchronize or allocate are refused (and the capture survives them); the
// copy stream may join a capture through events and must be joined back.
TEST_F(CudaAsyncTest, CaptureRefusesSynchronizingCallsAndJoinsTheCopyStream) {
  EXPECT_EQ(gpu_->EndCapture().status().code(), absl::StatusCode::kFailedPrecondition);
  Both a = Zeros(256);
  float* host = Pinned(256);
  ASSERT_NE(host, nullptr);
  auto fork = gpu_->MakeEvent();
  auto join = gpu_->MakeEvent();
  ASSERT_TRUE(fork.ok() && join.ok());
  ASSERT_TRUE(gpu_->BeginCapture().ok());
  EXPECT_EQ(gpu_->BeginCapture().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(gpu_->Fill(3.0f, a.gpu, 256).ok());
  float h = 0;
  EXPECT_EQ(gpu_->CopyToHost(a.gpu, &h, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gpu_->CopyToDevice(&h, a.gpu, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gpu_->Synchronize().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gpu_->Alloc(10).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gpu_->MakeDense({2, 2, 2}).status().code(), absl::StatusCode::kFailedPrecondition);
  // Fork the copy stream off the compute stream, download there, join back.
  ASSERT_TRUE(gpu_->RecordEvent(fork->get(), Queue::kCompute).ok());
  ASSERT_TRUE(gpu_->WaitEvent(fork->get(), Queue::kCopy).ok());
  ASSERT_TRUE(gpu_->CopyToHostAsync(a.gpu, host, 256, Queue::kCopy).ok());
  ASSERT_TRUE(gpu_->RecordEvent(join->get(), Queue::kCopy).ok());
  ASSERT_TRUE(gpu_->WaitEvent(join->get(), Queue::kCompute).ok());
  auto graph = gpu_->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE((*graph)->Launch().ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  EXPECT_EQ(std::vector<float>(host, host + 256), std::vector<float>(256, 3.0f));

  // A copy stream left unjoined makes the capture fail, clearly, and the device stays usable.
  ASSERT_TRUE(gpu_->BeginCapture().ok());
  ASSERT_TRUE(gpu_->RecordEvent(fork->get(), Queue::kCompute).ok());
  ASSERT_TRUE(gpu_->WaitEvent(fork->get(), Queue::kCopy).ok());
  ASSERT_TRUE(gpu_->CopyToHostAsync(a.gpu, host, 256, Queue::kCopy).ok());
  auto unjoined = gpu_->EndCapture();
  EXPECT_EQ(unjoined.status().code(), absl::StatusCode::kFailedPrecondition) << unjoined.status();
  ASSERT_TRUE(gpu_->Fill(1.0f, a.gpu, 256).ok());
  EXPECT_EQ(Gpu(a), std::vector<float>(256, 1.0f));
  graph->reset();
  gpu_->FreeHostPinned(host);
}

// The loss ring of device-resident training: a captured step writes its value into the slot its counter
// names, so successive replays fill successive slots (as the CPU's eager op does).
TEST_F(CudaAsyncTest, CapturedCopyToCounterSlotFillsSuccessiveSlots) {
  Both value = Zeros(1), ring = Zeros(4);
  auto cpu_step = cpu_->MakeCounter(2);
  auto gpu_step = gpu_->MakeCounter(2);
  ASSERT_TRUE(cpu_step.ok() && gpu_step.ok());
  auto enqueue = [&](Device* d, DeviceCounter* step, bool g) -> absl::Status {
    float* v = g ? value.gpu : value.cpu;
    absl::Status s = d->Scale(2.0f, v, v, 1);
    if (s.ok()) s = d->Axpy(1.0f, g ? ring.gpu : ring.cpu, v, 1);  // depends on the ring's slot 0
    if (s.ok()) s = d->CopyToCounterSlot(v, g ? ring.gpu : ring.cpu, 4, *step);
    if (s.ok()) s = step->Increment();
    return s;
  };
  ASSERT_TRUE(cpu_->Fill(1.0f, value.cpu, 1).ok());
  ASSERT_TRUE(gpu_->Fill(1.0f, value.gpu, 1).ok());
  ASSERT_TRUE(gpu_->BeginCapture().ok());
  ASSERT_TRUE(enqueue(gpu_.get(), gpu_step->get(), true).ok());
  auto graph = gpu_->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int replay = 0; replay < 6; ++replay) {
    ASSERT_TRUE((*graph)->Launch().ok());
    ASSERT_TRUE(enqueue(cpu_.get(), cpu_step->get(), false).ok());
  }
  EXPECT_EQ(Gpu(ring), Cpu(ring));
  EXPECT_EQ(Gpu(value), Cpu(value));
  EXPECT_EQ(gpu_->CopyToCounterSlot(value.gpu, ring.gpu, 0, **gpu_step).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->CopyToCounterSlot(value.gpu, ring.gpu, 4, **cpu_step).code(),
            absl::StatusCode::kInvalidArgument);
}

// Two towers sharing gpu:0 (two Devices, two compute streams): an event of one orders the other's work, and a
// group capture over both records both streams' work (forked and joined by events) into one graph whose
// replays equal the CPU's eager runs.
TEST_F(CudaAsyncTest, CrossDeviceEventsAndGroupCapture) {
  auto second = CreateCudaDevice(DeviceSpec::Gpu(0));
  ASSERT_TRUE(second.ok()) << second.status();
  Device* g1 = second->get();
  const int64_t n = 1 << 20;
  auto a1 = g1->Alloc(n);
  ASSERT_TRUE(a1.ok());
  Both out = Zeros(n);
  auto e1 = g1->MakeEvent();
  ASSERT_TRUE(e1.ok());
  // Eager: tower 1 fills, tower 0 waits for it and reads the buffer.
  ASSERT_TRUE(g1->Fill(0.5f, *a1, n).ok());
  ASSERT_TRUE(g1->RecordEvent(e1->get(), Queue::kCompute).ok());
  ASSERT_TRUE(gpu_->WaitEvent(e1->get(), Queue::kCompute).ok());
  ASSERT_TRUE(gpu_->Axpy(2.0f, *a1, out.gpu, n).ok());
  EXPECT_EQ(Gpu(out), std::vector<float>(n, 1.0f));

  auto c0 = gpu_->MakeCounter(0);
  auto c1 = g1->MakeCounter(10);
  ASSERT_TRUE(c0.ok() && c1.ok());
  // One step over both: tower 1 doubles a1; tower 0, after it, adds a1 to out; both counters advance.
  auto step = [&]() -> absl::Status {
    absl::Status s = g1->Scale(2.0f, *a1, *a1, n);
    if (s.ok()) s = g1->RecordEvent(e1->get(), Queue::kCompute);
    if (s.ok()) s = gpu_->WaitEvent(e1->get(), Queue::kCompute);
    if (s.ok()) s = gpu_->Axpy(1.0f, *a1, out.gpu, n);
    if (s.ok()) s = (*c1)->Increment();
    if (s.ok()) s = (*c0)->Increment();
    return s;
  };
  ASSERT_TRUE(BeginCaptureGroup({gpu_.get(), g1}).ok());
  EXPECT_EQ(g1->Synchronize().code(), absl::StatusCode::kFailedPrecondition) << "tower 1 is capturing too";
  ASSERT_TRUE(step().ok());
  auto graph = EndCaptureGroup({gpu_.get(), g1});
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int replay = 0; replay < 3; ++replay) ASSERT_TRUE((*graph)->Launch().ok());
  // a1: 0.5 -> 1 -> 2 -> 4; out: 1 + 1 + 2 + 4. The graph ran tower 1's work too: wait for its end on tower
  // 0.
  ASSERT_TRUE(gpu_->Synchronize().ok());
  EXPECT_EQ(Gpu(out), std::vector<float>(n, 8.0f));
  auto r0 = (*c0)->Read();
  auto r1 = (*c1)->Read();
  ASSERT_TRUE(r0.ok() && r1.ok());
  EXPECT_EQ(*r0, 3);
  EXPECT_EQ(*r1, 13);
  EXPECT_TRUE(g1->Fill(0.0f, *a1, n).ok()) << "tower 1 left capture mode";
  EXPECT_TRUE(g1->Synchronize().ok());
  EXPECT_EQ(BeginCaptureGroup({gpu_.get(), cpu_.get()}).code(), absl::StatusCode::kInvalidArgument);
  graph->reset();
}

}  // namespace
}  // namespace dtrain::kernels::cuda
