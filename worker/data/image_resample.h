// The image-folder reader's augmentation and resizing, as torchvision's transforms do them:
//   training:   RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)) + RandomHorizontalFlip()
//   evaluation: Resize(resize_size) (shorter side) + CenterCrop(size)
// Both are a rectangle of the original image resampled to size x size, so the decoder can decode just that
// rectangle, at a reduced DCT scale (image_decode.h), and one resampling pass makes the output.
//
// Thread-safety: stateless; each call uses only the RNG it is given.
#ifndef DTRAIN_WORKER_DATA_IMAGE_RESAMPLE_H_
#define DTRAIN_WORKER_DATA_IMAGE_RESAMPLE_H_

#include <cstdint>
#include <random>

#include "worker/data/image_decode.h"

namespace dtrain::data {

// torchvision's RandomResizedCrop.get_params for an image of width x height: up to 10 draws of an area in
// [scale_min, scale_max] of the image and a log-uniform aspect ratio in [ratio_min, ratio_max], the first that
// fits placed uniformly; else the central crop of the ratio nearest the image's. Integer pixels, as
// torchvision's.
CropRect RandomResizedCrop(int width, int height, std::mt19937_64* rng, double scale_min = 0.08,
                           double scale_max = 1.0, double ratio_min = 3.0 / 4.0, double ratio_max = 4.0 / 3.0);

// The rectangle of a width x height image that Resize(resize_size) then CenterCrop(size) keeps, in the image's
// pixels (fractional: torchvision resizes first, so the crop's edges fall between original pixels).
CropRect ResizeCenterCrop(int width, int height, int resize_size, int size);

// Resamples `crop` of an RGB image (height rows of width * 3 bytes) to out_width x out_height with PIL's
// antialiased bilinear filter (the triangle widened by the downscale factor, as Image.resize(BILINEAR) and
// torchvision's Resize do), mirrored left-right when `flip`; writes floats value / 255, HWC. Pixels outside
// `bounds` are never read (the crop's own edges for RandomResizedCrop, which crops before resizing; the whole
// image for Resize + CenterCrop, which resizes first). Preconditions: the crop lies inside bounds, bounds
// inside the image, sizes > 0.
void ResampleRgb(const uint8_t* rgb, int width, int height, const CropRect& crop, const CropRect& bounds,
                 int out_width, int out_height, bool flip, float* out);

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_IMAGE_RESAMPLE_H_
