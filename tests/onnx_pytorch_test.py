#!/usr/bin/python3
"""dtrain trains an ONNX file exported from PyTorch as PyTorch trains the module itself, and gives the result back.

For an MLP (examples/export_mlp.py), LeNet-5 (examples/export_lenet5.py) and a small residual net with
BatchNorm (SmallResNet below: Conv-BN-ReLU, a block Conv-BN + the identity, ReLU, GlobalAveragePool, Linear), each
exported in training mode as the examples do:
  1. dtrain_worker --job_name=local trains the file for STEPS steps on Fashion-MNIST's first STEPS * BATCH
     training images in order (--shuffle=false), with SGD and with Adam; PyTorch trains the module, loaded from
     the same file's initializers, on the same batches. Every step's loss (dtrain's --metrics_file) must agree
     within 1e-4 relative.
  2. dtrain_eval exports the trained checkpoint as ONNX; its initializers load into the module with
     load_state_dict(strict=True) (num_batches_tracked, which the ONNX graph does not hold, set to the steps
     trained), and the module's test accuracy in eval mode equals dtrain_eval's to 1e-4.
  3. OpsNet (below: PyTorch's exports of depthwise, dilated and asymmetrically padded convolutions, padded and
     ceil-mode pooling, clamp, view, constants) gives PyTorch's logits to 1e-5 from the file's own weights.

Adam, both forms: dtrain's --optimizer=adam is TensorFlow's (epsilon added to sqrt(v) before the bias
correction), checked against PyTorch running that update (TFAdam below); --optimizer=pytorch_adam puts epsilon
where torch.optim.Adam does (on the bias-corrected sqrt(v_hat)), checked against torch.optim.Adam itself. Both
within 1e-4. (The two forms differ by a few 1e-3 within 30 steps here: many gradients are near epsilon, pixels
being rarely lit, so comparing one with the other would not do.)

The models are chosen so that fp32 rounding alone stays far below 1e-4 over the run (PyTorch's own fp32 against
fp64: ~1e-7 for these three); deeper BatchNorm nets (ResNet-8 at batch 50) amplify any rounding difference to
1e-3 within 20 steps, even between PyTorch's fp32 and fp64.

Exit 77 (skipped) without PyTorch, numpy, onnx or the data set. Runs with /usr/bin/python3 (Debian's torch).

  /usr/bin/python3 tests/onnx_pytorch_test.py [--bin build/bin] [--steps 30] [--verbose]
"""
import argparse
import gzip
import os
import re
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from skipping import skip  # noqa: E402
DATA = "/usr/share/datasets/fashion-mnist"

try:
    import numpy as np
    import onnx
    from onnx import numpy_helper
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the CI machine installs them (scripts/install_deps.sh)
    skip("%s (apt-get install python3-torch python3-onnx python3-numpy)" % e)

sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_lenet5 import LeNet5  # noqa: E402
from loss_comparison import compare_losses, run, within, worst_of  # noqa: E402
from export_mlp import MLP, export  # noqa: E402
from torch import nn  # noqa: E402


class SmallResNet(nn.Module):
    """BatchNorm and a residual Add, small enough to stay numerically tame (see the module comment)."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, 2, 1)
        self.bn = nn.BatchNorm2d(8)
        self.conv1 = nn.Conv2d(8, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, classes)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.relu(x + self.bn1(self.conv1(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class OpsNet(nn.Module):
    """Operators and attributes as PyTorch exports them: a depthwise convolution with dilations and asymmetric
    pads, AvgPool2d(padding, ceil_mode) (Pad + AveragePool), MaxPool2d(padding, ceil_mode) whose last window is
    dropped (as PyTorch does; ONNX 1.12's shape inference keeps it), LeakyReLU, clamp (Clip),
    view / reshape (Shape arithmetic), a product by a Python float (a Constant), two branches added."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.dw = nn.Conv2d(6, 6, 3, padding=(1, 2), dilation=(1, 2), groups=6)
        self.pool = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True)
        self.mp = nn.MaxPool2d(2, padding=1, ceil_mode=True)  # its last window would start in the padding: dropped
        self.fc1 = nn.Linear(6 * 8 * 8, classes)
        self.fc2 = nn.Linear(6 * 8 * 8, classes)

    def forward(self, x):
        y = F.leaky_relu(self.dw(torch.relu(self.conv1(x))), 0.2)
        y = torch.clamp(self.mp(self.pool(y)), 0, 6)
        return self.fc1(y.view(y.size(0), -1)) * 0.5 + torch.sigmoid(self.fc2(y.reshape(-1, 6 * 8 * 8)))


class TFAdam(torch.optim.Optimizer):
    """tf.train.AdamOptimizer's update (dtrain's): var -= lr_t m / (sqrt(v) + eps), lr_t bias-corrected."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))
        self.t = 0

    @torch.no_grad()
    def step(self):
        self.t += 1
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr_t = group["lr"] * (1 - b2 ** self.t) ** 0.5 / (1 - b1 ** self.t)
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["m"], state["v"] = torch.zeros_like(p), torch.zeros_like(p)
                m, v = state["m"], state["v"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                p.sub_(lr_t * m / (v.sqrt() + group["eps"]))


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, count = struct.unpack(">II", data[:8])
    if magic == 2051:
        rows, cols = struct.unpack(">II", data[8:16])
        return np.frombuffer(data, np.uint8, offset=16).reshape(count, 1, rows, cols)
    return np.frombuffer(data, np.uint8, offset=8).astype(np.int64)


def scaled(pixels):
    # As dtrain's pipeline: pixel * (1.0f / 255.0f) in float32.
    return torch.from_numpy(pixels.astype(np.float32) * np.float32(1.0 / 255.0))


def load_initializers(module, path, steps_trained):
    """The module's state from an ONNX file's initializers (its parameter and buffer names)."""
    model = onnx.load(path)
    inits = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in model.graph.initializer}
    state = {}
    for name, value in module.state_dict().items():
        if name.endswith("num_batches_tracked"):
            # Not part of the ONNX graph (BatchNorm's momentum makes it unused); PyTorch counts the batches
            # trained, so that is what it gets.
            state[name] = torch.tensor(steps_trained, dtype=value.dtype)
        else:
            state[name] = inits[name]
    module.load_state_dict(state, strict=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--verbose", action="store_true", help="print every step's relative difference")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        skip("%s is missing (apt-get install dataset-fashion-mnist)" % DATA)
    torch.set_num_threads(1)
    train_x = scaled(read_idx(os.path.join(DATA, "train-images-idx3-ubyte.gz"))[: a.steps * a.batch])
    train_y = torch.from_numpy(read_idx(os.path.join(DATA, "train-labels-idx1-ubyte.gz"))[: a.steps * a.batch])
    test_x = scaled(read_idx(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")))
    test_y = torch.from_numpy(read_idx(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz")))

    # (name, module, example input shape, SGD's learning rate, --input_mean/--input_std or None)
    models = [
        ("mlp", lambda: MLP(), (1, 784), 0.05, None),
        ("lenet5", lambda: LeNet5(), (1, 1, 28, 28), 0.2, None),
        ("small_resnet", lambda: SmallResNet(), (1, 1, 28, 28), 0.05, (0.2860, 0.3530)),
    ]
    optimizers = [("sgd", None), ("adam", 0.001), ("pytorch_adam", 0.001)]
    work = tempfile.mkdtemp(prefix="dtrain_onnx_pytorch.")
    failures = []
    worst = {"sgd": 0.0, "adam": 0.0, "pytorch_adam": 0.0}
    for name, make, example_shape, sgd_lr, normalize in models:
        flags, train_in, test_in = [], train_x, test_x
        if normalize:
            # As dtrain's pipeline: (x - mean) * (1 / std) in float32.
            mean, inv = np.float32(normalize[0]), np.float32(1.0) / np.float32(normalize[1])
            train_in = (train_x - torch.tensor(mean)) * torch.tensor(inv)
            test_in = (test_x - torch.tensor(mean)) * torch.tensor(inv)
            flags = ["--input_mean=%g" % normalize[0], "--input_std=%g" % normalize[1]]
        torch.manual_seed(1)
        path = os.path.join(work, name + ".onnx")
        export(make(), torch.zeros(*example_shape), path)
        for opt, adam_lr in optimizers:
            lr = sgd_lr if opt == "sgd" else adam_lr
            tag = "%s/%s" % (name, opt)
            ckpt = os.path.join(work, tag.replace("/", "_") + ".ckpt")
            metrics = ckpt + ".csv"
            run([os.path.join(a.bin, "dtrain_worker"), "--job_name=local", "--model=" + path,
                 "--train_steps=%d" % a.steps, "--batch_size=%d" % a.batch, "--optimizer=" + opt,
                 "--learning_rate=%g" % lr, "--shuffle=false", "--threads=1", "--log_every=1000000",
                 "--checkpoint_dir=" + ckpt, "--metrics_file=" + metrics, "--data_dir=" + DATA] + flags)
            with open(metrics) as f:
                dtrain_losses = [float(line.split(",")[1]) for line in f.read().splitlines()[1:]]

            def train_in_pytorch(make_optimizer):
                module = make()
                load_initializers(module, path, 0)
                module.train()
                optimizer = make_optimizer(module.parameters())
                losses = []
                for k in range(a.steps):
                    x = train_in[k * a.batch:(k + 1) * a.batch].reshape(a.batch, *example_shape[1:])
                    y = train_y[k * a.batch:(k + 1) * a.batch]
                    optimizer.zero_grad()
                    loss = F.cross_entropy(module(x), y)
                    loss.backward()
                    optimizer.step()
                    losses.append(loss.item())
                return losses

            if opt == "sgd":
                torch_losses = train_in_pytorch(lambda p: torch.optim.SGD(p, lr=lr))
            elif opt == "adam":
                torch_losses = train_in_pytorch(lambda p: TFAdam(p, lr=lr))
            else:
                torch_losses = train_in_pytorch(lambda p: torch.optim.Adam(p, lr=lr, betas=(0.9, 0.999), eps=1e-8))
            worst[opt] = worst_of([worst[opt], compare_losses(tag, dtrain_losses, torch_losses, failures, a.verbose)])

            # The trained checkpoint, exported as ONNX, back in PyTorch: the same test accuracy.
            trained = ckpt + ".onnx"
            out = run([os.path.join(a.bin, "dtrain_eval"), "--checkpoint=" + ckpt, "--model=" + path,
                       "--export=" + trained, "--data_dir=" + DATA] + flags)
            m = re.search(r"test accuracy = ([0-9.]+)", out)
            dtrain_acc = float(m.group(1))
            onnx.checker.check_model(onnx.load(trained))
            back = make()
            load_initializers(back, trained, a.steps)
            back.eval()
            with torch.no_grad():
                correct = 0
                for i in range(0, len(test_x), 1000):
                    x = test_in[i:i + 1000].reshape(-1, *example_shape[1:])
                    correct += int((back(x).argmax(1) == test_y[i:i + 1000]).sum())
            torch_acc = correct / len(test_x)
            print("%-20s test accuracy: dtrain %.4f, PyTorch with the exported weights %.4f" %
                  (tag, dtrain_acc, torch_acc))
            if not within(abs(torch_acc - dtrain_acc), 1e-4):
                failures.append("%s: test accuracy %.4f (dtrain) vs %.4f (PyTorch, exported weights)" %
                                (tag, dtrain_acc, torch_acc))
    # Forward only: the file's own weights, dtrain's logits against PyTorch's on 1000 test images.
    torch.manual_seed(1)
    ops = OpsNet()
    path = os.path.join(work, "ops.onnx")
    export(ops, torch.zeros(1, 1, 28, 28), path)
    logits = os.path.join(work, "ops_logits.npz")
    run([os.path.join(a.bin, "dtrain_eval"), "--model=" + path, "--logits_out=" + logits, "--skip_eval",
         "--data_dir=" + DATA])
    ops.eval()
    with torch.no_grad():
        want = ops(test_x[:1000]).numpy()
    diff = float(np.abs(np.load(logits)["logits"][:1000] - want).max())
    print("%-20s forward: largest logit difference %.2e" % ("ops", diff))
    if not within(diff, 1e-5):
        failures.append("ops: logits differ by %.2e from PyTorch's" % diff)
    print("largest relative loss difference: SGD %.2e, adam (TensorFlow's update) %.2e, "
          "pytorch_adam (against torch.optim.Adam) %.2e" % (worst["sgd"], worst["adam"], worst["pytorch_adam"]))
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    subprocess.run(["rm", "-rf", work])
    print("PASS")


if __name__ == "__main__":
    main()
