// Layout kernels: a tiled 2-D transpose (HWIO <-> OHWI filters) and NHWC zero-pad / crop (TensorFlow's
// asymmetric SAME padding, which cuDNN's symmetric padding cannot express). Kernels first, launchers below.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.cuh"

namespace dtrain::kernels::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kTileRows = 8;  // a 32x8 block moves one 32x32 tile

// ---- kernels ----

__global__ void Transpose2DKernel(const float* in, float* out, int rows, int cols) {
  __shared__ float tile[kTile][kTile + 1];  // +1 avoids shared-memory bank conflicts
  const int col = blockIdx.x * kTile + threadIdx.x;
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int row = blockIdx.y * kTile + j;
    if (row < rows && col < cols) tile[j][threadIdx.x] = in[static_cast<int64_t>(row) * cols + col];
  }
  __syncthreads();
  const int out_col = blockIdx.y * kTile + threadIdx.x;  // an input row
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int out_row = blockIdx.x * kTile + j;  // an input column
    if (out_row < cols && out_col < rows) out[static_cast<int64_t>(out_row) * rows + out_col] = tile[threadIdx.x][j];
  }
}

// One thread per padded element: copies the source value or writes 0.
__global__ void PadNhwcKernel(const float* x, float* padded, int h, int w, int c, int pad_top, int pad_left,
                              int padded_h, int padded_w, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(i, total) {
    int64_t t = i;
    const int ch = static_cast<int>(t % c);
    t /= c;
    const int pw = static_cast<int>(t % padded_w);
    t /= padded_w;
    const int ph = static_cast<int>(t % padded_h);
    const int64_t n = t / padded_h;
    const int ih = ph - pad_top, iw = pw - pad_left;
    padded[i] = (ih >= 0 && ih < h && iw >= 0 && iw < w) ? x[((n * h + ih) * w + iw) * c + ch] : 0.0f;
  }
}

// One thread per cropped (output) element.
__global__ void CropNhwcKernel(const float* padded, float* x, int h, int w, int c, int pad_top, int pad_left,
                               int padded_h, int padded_w, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(i, total) {
    int64_t t = i;
    const int ch = static_cast<int>(t % c);
    t /= c;
    const int iw = static_cast<int>(t % w);
    t /= w;
    const int ih = static_cast<int>(t % h);
    const int64_t n = t / h;
    x[i] = padded[((n * padded_h + ih + pad_top) * padded_w + iw + pad_left) * c + ch];
  }
}

}  // namespace

// ---- launchers ----

cudaError_t LaunchTranspose2D(const float* in, float* out, int rows, int cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const dim3 grid((cols + kTile - 1) / kTile, (rows + kTile - 1) / kTile);
  Transpose2DKernel<<<grid, dim3(kTile, kTileRows), 0, stream>>>(in, out, rows, cols);
  return cudaGetLastError();
}

cudaError_t LaunchPadNhwc(const float* x, float* padded, int n, int h, int w, int c, int pad_top, int pad_left,
                          int padded_h, int padded_w, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(n) * padded_h * padded_w * c;
  if (total <= 0) return cudaSuccess;
  PadNhwcKernel<<<BlocksFor(total), kThreads, 0, stream>>>(x, padded, h, w, c, pad_top, pad_left, padded_h,
                                                            padded_w, total);
  return cudaGetLastError();
}

cudaError_t LaunchCropNhwc(const float* padded, float* x, int n, int h, int w, int c, int pad_top, int pad_left,
                           int padded_h, int padded_w, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(n) * h * w * c;
  if (total <= 0) return cudaSuccess;
  CropNhwcKernel<<<BlocksFor(total), kThreads, 0, stream>>>(padded, x, h, w, c, pad_top, pad_left, padded_h,
                                                             padded_w, total);
  return cudaGetLastError();
}

}  // namespace dtrain::kernels::cuda
