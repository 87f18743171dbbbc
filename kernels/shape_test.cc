// The shape arithmetic of kernels/device.h (shape.cc): output sizes and paddings of convolutions and pooling,
// TensorFlow's SAME/VALID and ONNX's / PyTorch's explicit pads, dilation and ceil_mode.
#include "gtest/gtest.h"
#include "kernels/device.h"

namespace dtrain::kernels {
namespace {

PoolParams Pool1D(int in, int k, int s, int pad_before, int pad_after, bool ceil_mode) {
  PoolParams p;
  p.batch = 1, p.in_h = in, p.in_w = 1, p.channels = 1;
  p.window_h = k, p.window_w = 1, p.stride_h = s, p.stride_w = 1;
  p.explicit_padding = true;
  p.pad_top = pad_before, p.pad_bottom = pad_after;
  p.ceil_mode = ceil_mode;
  return p;
}

TEST(ShapeTest, PoolCeilModeRoundsUp) {
  EXPECT_EQ(Pool1D(5, 2, 2, 0, 0, false).out_h(), 2);
  EXPECT_EQ(Pool1D(5, 2, 2, 0, 0, true).out_h(), 3);  // the last window starts on the last input
  EXPECT_EQ(Pool1D(5, 2, 2, 0, 0, true).effective_pad_bottom(), 1);
  EXPECT_EQ(Pool1D(5, 2, 2, 0, 0, false).effective_pad_bottom(), 0);
  EXPECT_EQ(Pool1D(6, 2, 2, 0, 0, true).out_h(), 3);  // exact: no overhang
  EXPECT_EQ(Pool1D(6, 2, 2, 0, 0, true).effective_pad_bottom(), 0);
  EXPECT_EQ(Pool1D(7, 3, 2, 0, 0, true).out_h(), 3);
  EXPECT_EQ(Pool1D(8, 3, 2, 0, 0, true).out_h(), 4);
  EXPECT_EQ(Pool1D(8, 3, 2, 0, 0, false).out_h(), 3);
}

TEST(ShapeTest, PoolCeilModeDropsAWindowStartingInTheRightPadding) {
  // in 5, pads 1/1, k 2, s 2: floor((5 + 2 - 2) / 2) + 1 = 3; rounded up 4, but the 4th window would start at
  // padded position 6, the right padding (input 5): PyTorch drops it.
  EXPECT_EQ(Pool1D(5, 2, 2, 1, 1, false).out_h(), 3);
  EXPECT_EQ(Pool1D(5, 2, 2, 1, 1, true).out_h(), 3);
  EXPECT_EQ(Pool1D(5, 2, 2, 1, 1, true).effective_pad_bottom(), 1);
  // in 6, pads 1/1, k 3, s 2: 3 windows rounded up to 4; the 4th starts on input 5 and reaches one position
  // past the explicit padding.
  EXPECT_EQ(Pool1D(6, 3, 2, 1, 1, false).out_h(), 3);
  EXPECT_EQ(Pool1D(6, 3, 2, 1, 1, true).out_h(), 4);
  EXPECT_EQ(Pool1D(6, 3, 2, 1, 1, true).effective_pad_bottom(), 2);
  // in 5, pads 1/0, k 3, s 2: span 3, rounded up to 3 windows starting at -1, 1, 3 (an input): kept.
  EXPECT_EQ(Pool1D(5, 3, 2, 1, 0, true).out_h(), 3);
  EXPECT_EQ(Pool1D(5, 3, 2, 1, 0, true).effective_pad_bottom(), 1);
}

TEST(ShapeTest, CeilModeNeedsExplicitPadding) {
  PoolParams p = Pool1D(5, 2, 2, 0, 0, true);
  p.explicit_padding = false;
  p.padding = Padding::kValid;
  EXPECT_EQ(p.out_h(), 2);  // TensorFlow's VALID, ceil_mode ignored
}

TEST(ShapeTest, PoolTensorFlowPaddingAndRectangularWindows) {
  PoolParams p;
  p.batch = 1, p.in_h = 7, p.in_w = 9, p.channels = 1, p.window = 3, p.stride = 2, p.padding = Padding::kSame;
  EXPECT_EQ(p.out_h(), 4);
  EXPECT_EQ(p.out_w(), 5);
  EXPECT_EQ(p.pads_h().before, 1);
  EXPECT_EQ(p.pads_h().after, 1);
  EXPECT_EQ(p.effective_pad_bottom(), 1);
  p.window_w = 2, p.stride_w = 3;  // rectangular: 3x2 window, strides 2x3
  EXPECT_EQ(p.kw(), 2);
  EXPECT_EQ(p.sw(), 3);
  EXPECT_EQ(p.out_w(), 3);
}

TEST(ShapeTest, ConvDilation) {
  Conv2DParams p;
  p.batch = 1, p.in_h = 10, p.in_w = 9, p.in_c = 1, p.out_c = 1, p.k_h = 3, p.k_w = 3;
  p.dilation_h = 2, p.dilation_w = 3;
  EXPECT_EQ(p.dilated_k_h(), 5);
  EXPECT_EQ(p.dilated_k_w(), 7);
  p.padding = Padding::kValid;
  EXPECT_EQ(p.out_h(), 6);  // 10 - 5 + 1
  EXPECT_EQ(p.out_w(), 3);  // 9 - 7 + 1
  p.padding = Padding::kSame;  // TensorFlow's SAME for the dilated kernel: total pad 4 (2/2) and 6 (3/3)
  EXPECT_EQ(p.out_h(), 10);
  EXPECT_EQ(p.pads_h().before, 2);
  EXPECT_EQ(p.pads_h().after, 2);
  EXPECT_EQ(p.pads_w().before, 3);
  EXPECT_EQ(p.pads_w().after, 3);
  p.explicit_padding = true;
  p.pad_top = 1, p.pad_bottom = 0, p.pad_left = 0, p.pad_right = 2;
  p.stride_h = 2, p.stride_w = 2;
  EXPECT_EQ(p.out_h(), 4);  // floor((10 + 1 - 5) / 2) + 1
  EXPECT_EQ(p.out_w(), 3);  // floor((9 + 2 - 7) / 2) + 1
}

TEST(ShapeTest, ConvWeightsSizeCountsGroups) {
  Conv2DParams p;
  p.in_c = 8, p.out_c = 12, p.k_h = 3, p.k_w = 2, p.groups = 4;
  EXPECT_EQ(p.weights_size(), 3 * 2 * 2 * 12);
}

TEST(ShapeTest, BroadcastSizes) {
  BroadcastParams p;
  p.rank = 2;
  p.dims[0] = 6, p.dims[1] = 4;
  p.a_strides[0] = 4, p.a_strides[1] = 1;
  p.b_strides[0] = 0, p.b_strides[1] = 1;
  EXPECT_EQ(p.out_size(), 24);
  EXPECT_EQ(p.a_size(), 24);
  EXPECT_EQ(p.b_size(), 4);
}

}  // namespace
}  // namespace dtrain::kernels
