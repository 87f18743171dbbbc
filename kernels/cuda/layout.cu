// Layout kernels: a tiled (batched) 2-D transpose (HWIO <-> OHWI and OIHW <-> OHWI filters, Device::Transpose)
// and NHWC zero-pad / crop (asymmetric padding, which cuDNN's symmetric padding cannot express). Kernels first,
// launchers below.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.cuh"

namespace dtrain::kernels::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kTileRows = 8;  // a 32x8 block moves one 32x32 tile

// ---- kernels ----

// Each block moves 32x32 tiles of one matrix at a time: tile rows blockIdx.y, blockIdx.y + gridDim.y, ... of
// matrices blockIdx.z, blockIdx.z + gridDim.z, ... (the loops are uniform across the block, so the barriers are
// safe).
__global__ void BatchedTransposeKernel(const float* in, float* out, int64_t batch, int rows, int cols) {
  __shared__ float tile[kTile][kTile + 1];  // +1 avoids shared-memory bank conflicts
  const int64_t matrix = static_cast<int64_t>(rows) * cols;
  const int col = blockIdx.x * kTile + threadIdx.x;
  for (int64_t m = blockIdx.z; m < batch; m += gridDim.z) {
    const float* src = in + m * matrix;
    float* dst = out + m * matrix;
    for (int64_t tile_row = blockIdx.y; tile_row * kTile < rows; tile_row += gridDim.y) {
      const int row0 = static_cast<int>(tile_row * kTile);
      for (int j = threadIdx.y; j < kTile; j += kTileRows) {
        const int row = row0 + j;
        if (row < rows && col < cols) tile[j][threadIdx.x] = src[static_cast<int64_t>(row) * cols + col];
      }
      __syncthreads();
      const int out_col = row0 + threadIdx.x;  // an input row
      for (int j = threadIdx.y; j < kTile; j += kTileRows) {
        const int out_row = blockIdx.x * kTile + j;  // an input column
        if (out_row < cols && out_col < rows) {
          dst[static_cast<int64_t>(out_row) * rows + out_col] = tile[threadIdx.x][j];
        }
      }
      __syncthreads();  // the tile is refilled by the next iteration
    }
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

cudaError_t LaunchBatchedTranspose(const float* in, float* out, int64_t batch, int rows, int cols,
                                   cudaStream_t stream) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return cudaSuccess;
  constexpr int64_t kMaxGridYZ = 65535;
  const int64_t tiles_y = (static_cast<int64_t>(rows) + kTile - 1) / kTile;
  const dim3 grid((cols + kTile - 1) / kTile, static_cast<unsigned>(tiles_y < kMaxGridYZ ? tiles_y : kMaxGridYZ),
                  static_cast<unsigned>(batch < kMaxGridYZ ? batch : kMaxGridYZ));
  BatchedTransposeKernel<<<grid, dim3(kTile, kTileRows), 0, stream>>>(in, out, batch, rows, cols);
  return cudaGetLastError();
}

cudaError_t LaunchTranspose2D(const float* in, float* out, int rows, int cols, cudaStream_t stream) {
  return LaunchBatchedTranspose(in, out, 1, rows, cols, stream);
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
