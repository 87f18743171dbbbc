// GraphNetwork: dropout with the counter in device memory (ForwardDeviceCounter, the form a captured CUDA graph
// replays) draws exactly the masks of Forward with that counter, forward and backward; a new counter value draws
// new masks. On the CPU backend here; the GPU backend's masks equal the CPU's bit for bit
// (kernels/cuda/cuda_ops_test.cc).
#include "worker/models/graph_network.h"

#include <vector>

#include "gtest/gtest.h"
#include "worker/models/test_util.h"

namespace dtrain::models {
namespace {

TEST(GraphNetworkTest, DeviceCounterDropoutEqualsHostCounterDropout) {
  auto dev = testing::MakeCpuDevice();
  ASSERT_NE(dev, nullptr);
  const std::vector<LayerSpec> layers = {LayerSpec::Dense("fc1", 64, TruncatedNormal(0.1f), Constant(0.1f)),
                                         LayerSpec::Relu(),
                                         LayerSpec::Dropout(0.5f),
                                         LayerSpec::Dense("fc2", 32, TruncatedNormal(0.1f), Constant(0.1f)),
                                         LayerSpec::Dropout(0.7f),
                                         LayerSpec::Dense("fc3", 10, TruncatedNormal(0.1f), Constant(0.0f))};
  const Geometry input{4, 4, 2};
  const int batch = 8;
  auto graph = GraphFromLayers("net", layers, input, 10);
  ASSERT_TRUE(graph.ok()) << graph.status();
  const std::vector<VariableInfo>* vars = &graph->variables;
  const int64_t n = TotalSize(*vars);
  const std::vector<float> init = InitialParameters(*vars, 3);
  auto params = dev->Alloc(n);
  auto grads_a = dev->Alloc(n);
  auto grads_b = dev->Alloc(n);
  ASSERT_TRUE(params.ok() && grads_a.ok() && grads_b.ok());
  ASSERT_TRUE(dev->CopyToDevice(init.data(), *params, n).ok());
  auto a = GraphNetwork::Create(dev.get(), *graph, batch, true, *params, *grads_a);
  auto b = GraphNetwork::Create(dev.get(), *graph, batch, true, *params, *grads_b);
  ASSERT_TRUE(a.ok() && b.ok());
  ModelOptions o;
  o.height = input.h;
  o.width = input.w;
  o.channels = input.c;
  const testing::OwnedBatch x = testing::RandomBatch(o, batch, 5);
  ASSERT_TRUE(dev->CopyToDevice(x.images.data(), (*a)->input(), x.images.size()).ok());
  ASSERT_TRUE(dev->CopyToDevice(x.images.data(), (*b)->input(), x.images.size()).ok());
  auto counter = dev->MakeCounter(7);
  ASSERT_TRUE(counter.ok());

  auto out = [&](GraphNetwork* net) {
    std::vector<float> v(batch * 10);
    EXPECT_TRUE(dev->CopyToHost(net->output(), v.data(), v.size()).ok());
    return v;
  };
  std::vector<float> previous;
  for (int step = 7; step < 10; ++step) {
    SCOPED_TRACE(step);
    // Towers key dropout by step * 64 + tower: the same with the step in device memory.
    ASSERT_TRUE((*a)->Forward(true, 11, step * 64 + 2).ok());
    ASSERT_TRUE((*b)->ForwardDeviceCounter(true, 11, **counter, 64, 2).ok());
    const std::vector<float> ya = out(a->get()), yb = out(b->get());
    EXPECT_EQ(ya, yb);
    std::vector<float> dy(batch * 10, 0.01f);
    auto d = dev->Alloc(dy.size());
    ASSERT_TRUE(d.ok());
    ASSERT_TRUE(dev->CopyToDevice(dy.data(), *d, dy.size()).ok());
    ASSERT_TRUE((*a)->Backward(*d).ok());
    ASSERT_TRUE(dev->CopyToDevice(dy.data(), *d, dy.size()).ok());
    ASSERT_TRUE((*b)->Backward(*d).ok());
    std::vector<float> ga(n), gb(n);
    ASSERT_TRUE(dev->CopyToHost(*grads_a, ga.data(), n).ok());
    ASSERT_TRUE(dev->CopyToHost(*grads_b, gb.data(), n).ok());
    EXPECT_EQ(ga, gb);
    if (!previous.empty()) {
      EXPECT_NE(yb, previous) << "a new counter value should draw new masks";
    }
    previous = yb;
    ASSERT_TRUE((*counter)->Increment().ok());
    dev->Free(*d);
  }
}

}  // namespace
}  // namespace dtrain::models
