#!/usr/bin/env bash
# Trains a torchvision network on a folder of images, end to end: (1) an image folder (yours, or a small one made
# here: 4 classes of 64 JPEG/PNG photographs' crops each), (2) the network exported from PyTorch with a head for
# its classes, (3) dtrain_worker training it (random resized crops + flips, normalized as torchvision's
# ImageNet recipe), (4) dtrain_eval measuring the trained file on the validation images.
#
#   examples/image_folder.sh                                  # a made folder, resnet18 at 64x64, 200 steps
#   examples/image_folder.sh --data_dir=/data/flowers --model=resnet50 --image_size=224 --steps=5000
#
# Options: --data_dir=DIR (DIR/train/<class>/*.jpg|png and DIR/val/...; default: made in --work_dir),
# --model=NAME (torchvision.models; default resnet18), --image_size=N (64), --batch_size=N (32), --steps=N (200),
# --threads=N (compute threads, 2), --work_dir=DIR (/tmp/dtrain_image_folder). Needs build/ (scripts/build.sh)
# and Debian's /usr/bin/python3 with python3-torch, python3-torchvision, python3-pil.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
data_dir="" model=resnet18 image_size=64 batch_size=32 steps=200 threads=2 work=/tmp/dtrain_image_folder
for arg in "$@"; do
  case "$arg" in
    --data_dir=*) data_dir="${arg#*=}" ;;
    --model=*) model="${arg#*=}" ;;
    --image_size=*) image_size="${arg#*=}" ;;
    --batch_size=*) batch_size="${arg#*=}" ;;
    --steps=*) steps="${arg#*=}" ;;
    --threads=*) threads="${arg#*=}" ;;
    --work_dir=*) work="${arg#*=}" ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "image_folder.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
mkdir -p "$work"
if [ -z "$data_dir" ]; then
  data_dir="$work/images"
  if [ ! -d "$data_dir/train" ]; then
    echo "== 1. making an image folder in $data_dir"
    /usr/bin/python3 - "$data_dir" <<'PY'
import os, sys
import numpy as np
from PIL import Image
out = sys.argv[1]
photo = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"
rng = np.random.default_rng(0)
base = Image.open(photo).convert("RGB") if os.path.exists(photo) else None
# Four classes a network can tell apart: the picture tinted red, green, blue, or gray, at varied crops and sizes.
for split, n in (("train", 64), ("val", 16)):
    for c, name in enumerate(["red", "green", "blue", "gray"]):
        os.makedirs(os.path.join(out, split, name), exist_ok=True)
        for i in range(n):
            w, h = int(rng.integers(120, 400)), int(rng.integers(120, 400))
            if base is not None:
                bw, bh = base.size
                cw, ch = int(rng.integers(bw // 3, bw)), int(rng.integers(bh // 3, bh))
                x, y = int(rng.integers(0, bw - cw + 1)), int(rng.integers(0, bh - ch + 1))
                a = np.asarray(base.crop((x, y, x + cw, y + ch)).resize((w, h)), dtype=np.float32)
            else:
                a = rng.uniform(0, 255, (h, w, 3)).astype(np.float32)
            tint = np.eye(3)[c] * 90 if c < 3 else np.zeros(3)
            a = a.mean(-1, keepdims=True) * 0.6 + tint + rng.normal(0, 8, (h, w, 3))
            img = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
            img.save(os.path.join(out, split, name, f"{i:03d}." + ("png" if i % 4 == 0 else "jpg")), quality=90)
print("made", out)
PY
  fi
fi
classes=$(find "$data_dir/train" -mindepth 1 -maxdepth 1 -type d | wc -l)
norm=(--input_mean=0.485,0.456,0.406 --input_std=0.229,0.224,0.225 --image_size="$image_size")
echo "== 2. exporting $model for $classes classes at ${image_size}x${image_size}"
(cd "$root/examples" && /usr/bin/python3 export_torchvision_classifier.py "$model" "$work/$model.onnx" \
  --classes="$classes" --image_size="$image_size")
echo "== 3. training it on $data_dir"
"$root/build/bin/dtrain_worker" --job_name=local --model="$work/$model.onnx" --data_dir="$data_dir" \
  --data_format=image_folder "${norm[@]}" --batch_size="$batch_size" --threads="$threads" --optimizer=momentum \
  --learning_rate=0.01 --train_steps="$steps" --log_every=20 --export_onnx="$work/${model}_trained.onnx"
echo "== 4. evaluating the trained file on $data_dir's validation images"
"$root/build/bin/dtrain_eval" --model="$work/${model}_trained.onnx" --data_dir="$data_dir" \
  --data_format=image_folder "${norm[@]}" --threads="$threads" --batch_size="$batch_size"
