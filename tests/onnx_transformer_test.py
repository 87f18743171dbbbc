#!/usr/bin/python3
"""dtrain trains a vision transformer exported from PyTorch as PyTorch trains the module itself.

ViT-Tiny's width and depth (examples/export_vit.py: torchvision's VisionTransformer, 12 layers, 3 heads, 192 wide,
MLP 768, 5.4 M parameters) on CIFAR-10-size images in 4x4 patches (65 tokens), exported in training mode:
  - at opset 14, where LayerNorm is ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add and GELU is Div,
    Erf, Add, Mul, Mul (dtrain fuses each back into one op), trained with torch.optim.Adam's update
    (--optimizer=pytorch_adam);
  - at opset 17 (LayerNormalization), two of its layers, trained with SGD.
nn.MultiheadAttention exports as MatMuls of two activations, a Softmax inside the graph and Transposes and
Reshapes that move the batch axis and merge it with the heads; the class token is an Expand of a parameter, the
positional embedding a parameter added to the activations.

On a synthetic CIFAR-10-size data set (CIFAR-10 binary files written here: a noisy template per class; what is
compared is the arithmetic of every step, not how far 30 steps get):
  1. dtrain_worker --job_name=local --shuffle=false trains the file for STEPS steps; PyTorch trains the module,
     loaded from the same file's initializers, on the same batches. Every step's loss (--metrics_file) must agree
     within 1e-4 relative.
  2. dtrain_eval exports the trained checkpoint as ONNX; its initializers load into the module with
     load_state_dict(strict=True), and the module's test accuracy equals dtrain_eval's.

Exit 77 (skipped) without PyTorch, torchvision, numpy or onnx. Runs with /usr/bin/python3 (Debian's torch).

  /usr/bin/python3 tests/onnx_transformer_test.py [--bin build/bin] [--steps 30] [--batch 8] [--verbose]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    import numpy as np
    import onnx
    from onnx import numpy_helper
    import torch
    import torch.nn.functional as F
    import torchvision  # noqa: F401
except ImportError as e:  # the CI machine installs them (scripts/install_deps.sh)
    print("SKIP: %s (apt-get install python3-torch python3-torchvision python3-onnx python3-numpy)" % e)
    sys.exit(77)

sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_vit import export, vit_tiny  # noqa: E402
from loss_comparison import compare_losses, run  # noqa: E402


def write_cifar(path, images, labels):
    """CIFAR-10 binary records: a label byte, then the image's R, G and B planes (32x32 each)."""
    records = np.concatenate([labels.astype(np.uint8)[:, None], images.reshape(len(labels), -1)], axis=1)
    records.tofile(path)


def synthetic(n, seed):
    """n 32x32x3 images (planar CHW, uint8): class c is template c plus noise."""
    templates = np.random.RandomState(99).randint(0, 256, size=(10, 3, 32, 32))
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 10, size=n)
    images = np.clip(templates[labels] + rng.normal(0, 50, size=(n, 3, 32, 32)), 0, 255).astype(np.uint8)
    return images, labels


def load_initializers(module, path):
    """The module's state from an ONNX file's initializers (its parameter names)."""
    inits = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in onnx.load(path).graph.initializer}
    module.load_state_dict({name: inits[name] for name in module.state_dict()}, strict=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--verbose", action="store_true", help="print every step's relative difference")
    a = ap.parse_args()
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="dtrain_onnx_transformer.")
    train_images, train_labels = synthetic(a.steps * a.batch, 1)
    test_images, test_labels = synthetic(200, 2)
    write_cifar(os.path.join(work, "data_batch_1.bin"), train_images, train_labels)
    write_cifar(os.path.join(work, "test_batch.bin"), test_images, test_labels)
    # As dtrain's pipeline: pixel * (1.0f / 255.0f) in float32.
    train_x = torch.from_numpy(train_images.astype(np.float32) * np.float32(1.0 / 255.0))
    train_y = torch.from_numpy(train_labels.astype(np.int64))
    test_x = torch.from_numpy(test_images.astype(np.float32) * np.float32(1.0 / 255.0))
    test_y = torch.from_numpy(test_labels.astype(np.int64))

    # (opset, optimizer, learning rate, layers): ViT-Tiny itself at opset 14; at opset 17 (LayerNormalization as one
    # op) two of its layers, which exercise the same ops at a sixth of the test's time.
    configs = [(14, "pytorch_adam", 1e-3, 12), (17, "sgd", 0.01, 2)]
    failures = []
    for opset, opt, lr, layers in configs:
        tag = "vit_tiny%s/opset%d/%s" % ("" if layers == 12 else "_%dlayers" % layers, opset, opt)
        torch.manual_seed(1)
        path = os.path.join(work, "vit_tiny_%d.onnx" % opset)
        export(vit_tiny(layers=layers), torch.zeros(2, 3, 32, 32), path, opset)
        ckpt = os.path.join(work, "ckpt_%d" % opset)
        metrics = ckpt + ".csv"
        run([os.path.join(a.bin, "dtrain_worker"), "--job_name=local", "--model=" + path,
             "--train_steps=%d" % a.steps, "--batch_size=%d" % a.batch, "--optimizer=" + opt,
             "--learning_rate=%g" % lr, "--shuffle=false", "--threads=1", "--log_every=1000000",
             "--checkpoint_dir=" + ckpt, "--metrics_file=" + metrics, "--data_dir=" + work])
        with open(metrics) as f:
            dtrain_losses = [float(line.split(",")[1]) for line in f.read().splitlines()[1:]]

        module = vit_tiny(layers=layers)
        load_initializers(module, path)
        module.train()
        if opt == "sgd":
            optimizer = torch.optim.SGD(module.parameters(), lr=lr)
        else:
            optimizer = torch.optim.Adam(module.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8)
        torch_losses = []
        for k in range(a.steps):
            x = train_x[k * a.batch:(k + 1) * a.batch]
            y = train_y[k * a.batch:(k + 1) * a.batch]
            optimizer.zero_grad()
            loss = F.cross_entropy(module(x), y)
            loss.backward()
            optimizer.step()
            torch_losses.append(loss.item())
        compare_losses(tag, dtrain_losses, torch_losses, failures, a.verbose, width=28)

        # The trained checkpoint, exported as ONNX, back in PyTorch: the same test accuracy.
        trained = ckpt + ".onnx"
        out = run([os.path.join(a.bin, "dtrain_eval"), "--checkpoint=" + ckpt, "--model=" + path,
                   "--export=" + trained, "--data_dir=" + work])
        dtrain_acc = float(re.search(r"test accuracy = ([0-9.]+)", out).group(1))
        onnx.checker.check_model(onnx.load(trained))
        back = vit_tiny(layers=layers)
        load_initializers(back, trained)
        back.eval()
        with torch.no_grad():
            torch_acc = float((back(test_x).argmax(1) == test_y).float().mean())
        print("%-28s test accuracy: dtrain %.4f, PyTorch with the exported weights %.4f" % (tag, dtrain_acc, torch_acc))
        if abs(torch_acc - dtrain_acc) > 1e-4:
            failures.append("%s: test accuracy %.4f (dtrain) vs %.4f (PyTorch, exported weights)" %
                            (tag, dtrain_acc, torch_acc))
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    subprocess.run(["rm", "-rf", work])
    print("PASS")


if __name__ == "__main__":
    main()
