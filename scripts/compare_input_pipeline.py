#!/usr/bin/python3
"""Image-folder input pipelines side by side: dtrain's (dtrain_input_bench: a worker's BatchStream decoding,
augmenting and normalizing on --threads threads) against a PyTorch DataLoader over torchvision's ImageFolder with
RandomResizedCrop(size) + RandomHorizontalFlip() + ToTensor() + Normalize(mean, std) and --threads worker
processes. Same folder, same batch size, same output (float NCHW / NHWC batches of size x size x 3), same threads;
launches interleaved (dtrain, PyTorch, dtrain, ...), the median over each launch's timing windows, then the median
over launches. Both sides run with the malloc settings every dtrain binary gives itself (scripts/torch_blas.py's
MALLOC_TUNABLES). Prints both figures and the ratio.

  /usr/bin/python3 scripts/compare_input_pipeline.py --make_images=640 --threads=2    # a folder made here
  /usr/bin/python3 scripts/compare_input_pipeline.py --data_dir=/data/imagenette --threads=2

--make_images=N writes N JPEGs of ImageNet's typical size (500x375 or 375x500, quality 90) in 4 classes into
--out_dir: crops of a real photograph (matplotlib's sample grace_hopper.jpg, when python3-matplotlib is installed)
resized and recoloured, else synthetic pictures with texture (said in the output: JPEG decoding time depends on
the content). Run with Debian's /usr/bin/python3 (python3-torch, python3-torchvision, python3-pil).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_blas  # noqa: E402

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
PHOTO = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"


def make_images(out_dir, n, seed=1):
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(seed)
    photo = Image.open(PHOTO).convert("RGB") if os.path.exists(PHOTO) else None
    for i in range(n):
        cls = f"class{i % 4}"
        os.makedirs(os.path.join(out_dir, "train", cls), exist_ok=True)
        size = (500, 375) if i % 3 else (375, 500)
        if photo is not None:
            w, h = photo.size
            cw, ch = int(rng.integers(w // 3, w)), int(rng.integers(h // 3, h))
            x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            img = photo.crop((x, y, x + cw, y + ch)).resize(size, Image.BICUBIC)
            a = np.asarray(img, dtype=np.float32) * rng.uniform(0.6, 1.2, size=3)
            if i % 2:
                a = a[:, ::-1]
        else:
            yy, xx = np.mgrid[0:size[1], 0:size[0]]
            a = np.stack([128 + 100 * np.sin(xx / rng.uniform(5, 40) + c) * np.cos(yy / rng.uniform(5, 40))
                          for c in range(3)], -1) + rng.normal(0, 12, (size[1], size[0], 3))
        Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(
            os.path.join(out_dir, "train", cls, f"{i:05d}.jpg"), quality=90)
    return "crops of a photograph" if photo is not None else "synthetic textures (no matplotlib sample photo)"


def torch_worker(args):
    """One PyTorch launch (run in a child process): prints examples/sec per window and the median."""
    import torch
    from torchvision import datasets, transforms
    torch.set_num_threads(1)
    t = transforms.Compose([transforms.RandomResizedCrop(args.image_size), transforms.RandomHorizontalFlip(),
                            transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    ds = datasets.ImageFolder(os.path.join(args.data_dir, "train"), transform=t)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.threads,
                                         persistent_workers=args.threads > 0, prefetch_factor=4 if args.threads else 2,
                                         drop_last=True)

    def batches():
        while True:
            for b in loader:
                yield b

    it = batches()
    for _ in range(args.warmup_batches):
        next(it)
    rates = []
    for _ in range(args.windows):
        start = time.perf_counter()
        for _ in range(args.batches_per_window):
            x, _ = next(it)
            assert x.shape[1:] == (3, args.image_size, args.image_size)
        rates.append(args.batches_per_window * args.batch_size / (time.perf_counter() - start))
    print("pytorch_input_bench: examples/sec median=%.1f min=%.1f max=%.1f" %
          (statistics.median(rates), min(rates), max(rates)), flush=True)


def run(cmd, pattern):
    # Both sides on the malloc settings every dtrain binary gives itself (dtrain_input_bench sets them itself).
    env = dict(os.environ, GLIBC_TUNABLES=torch_blas.with_malloc_tunables(os.environ.get("GLIBC_TUNABLES")))
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    m = re.search(pattern, out.stdout, re.M)
    if out.returncode != 0 or not m:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), out.stdout[-3000:]))
    return float(m.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", help="an image folder (DIR/train/<class>/*.jpg)")
    p.add_argument("--make_images", type=int, default=0, help="write this many JPEGs into --out_dir first")
    p.add_argument("--out_dir", default="/tmp/dtrain_input_bench_images")
    p.add_argument("--threads", type=int, default=2, help="dtrain input threads = DataLoader workers")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--launches", type=int, default=3, help="launches of each, interleaved")
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--batches_per_window", type=int, default=6)
    p.add_argument("--warmup_batches", type=int, default=3)
    p.add_argument("--dtrain_bin", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build",
                                                        "bin", "dtrain_input_bench"))
    p.add_argument("--torch_child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.torch_child:
        return torch_worker(args)
    if args.make_images:
        what = make_images(args.out_dir, args.make_images)
        args.data_dir = args.out_dir
        print("wrote %d JPEGs (%s) to %s" % (args.make_images, what, args.out_dir), flush=True)
    if not args.data_dir:
        sys.exit("give --data_dir or --make_images")
    common = ["--batch_size=%d" % args.batch_size, "--windows=%d" % args.windows,
              "--batches_per_window=%d" % args.batches_per_window, "--warmup_batches=%d" % args.warmup_batches]
    dtrain_cmd = [args.dtrain_bin, "--data_dir=" + args.data_dir, "--data_format=image_folder",
                  # without val/, a 1% split (the folder's test part is not read here)
                  "--validation_split=%g" % (0 if os.path.isdir(os.path.join(args.data_dir, "val")) else 0.01),
                  "--input_threads=%d" % args.threads, "--image_size=%d" % args.image_size,
                  "--input_mean=%s" % ",".join(map(str, MEAN)), "--input_std=%s" % ",".join(map(str, STD))] + common
    torch_cmd = [sys.executable, os.path.abspath(__file__), "--torch_child", "--data_dir=" + args.data_dir,
                 "--threads=%d" % args.threads, "--image_size=%d" % args.image_size] + common
    d, t = [], []
    for launch in range(args.launches):
        d.append(run(dtrain_cmd, r"^dtrain_input_bench: .*examples/sec median=([0-9.]+)"))
        t.append(run(torch_cmd, r"^pytorch_input_bench: examples/sec median=([0-9.]+)"))
        print("launch %d: dtrain %.1f, PyTorch DataLoader %.1f examples/sec" % (launch, d[-1], t[-1]), flush=True)
    dm, tm = statistics.median(d), statistics.median(t)
    print("image folder %s, RandomResizedCrop(%d) + flip + normalize, batch %d, %d thread(s): dtrain %.1f "
          "examples/sec, PyTorch DataLoader %.1f: ratio %.2f" % (args.data_dir, args.image_size, args.batch_size,
                                                                args.threads, dm, tm, dm / tm))


if __name__ == "__main__":
    main()
