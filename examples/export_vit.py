#!/usr/bin/python3
"""A vision transformer (torchvision's VisionTransformer) exported as ONNX for dtrain: ViT-Tiny's width and depth
(12 layers, 3 heads, 192 wide, MLP 768: 5.4 M parameters) on CIFAR-10-size images cut into 4x4 patches, or any
torchvision classification model by name at 224x224.

  /usr/bin/python3 examples/export_vit.py vit_tiny.onnx                    # ViT-Tiny, 32x32x3 images, 10 classes
  build/bin/dtrain_worker --job_name=local --model=vit_tiny.onnx --data_dir=/data/cifar-10-batches-bin \\
      --optimizer=pytorch_adam --learning_rate=1e-3 --batch_size=64 --train_steps=20000

  /usr/bin/python3 examples/export_vit.py vit_b_16.onnx --torchvision=vit_b_16 --classes=10   # 224x224x3
  build/bin/dtrain_bench --model=vit_b_16.onnx --batch_size=2

What the export takes (docs/models.md, "Bring your own model"): model.train(), training=TrainingMode.TRAINING,
do_constant_folding=False, a dynamic batch axis. opset 14 (the default) writes LayerNorm as ReduceMean, Sub,
Pow, ReduceMean, Add, Sqrt, Div, Mul, Add and GELU as Div, Erf, Add, Mul, Mul, which dtrain fuses back into one
op each; --opset=17 writes LayerNormalization itself. nn.MultiheadAttention exports as MatMuls of two
activations, Transposes that move the batch axis, Softmax and Reshapes that merge the batch with the heads.

Stochastic depth (torchvision.ops.StochasticDepth in ConvNeXt, EfficientNet, Swin, MaxViT) draws its mask with
torch.bernoulli, which PyTorch 1.13 cannot export in training mode: the export sets its rate to 0 (the blocks then
always run, as in evaluation), and prints that it did. GoogLeNet and Inception v3 export without their auxiliary
heads (aux_logits=False): dtrain trains the one head a file's first output gives.
"""
import argparse
import sys

import torch


def vit_tiny(image_size=32, patch_size=4, classes=10, layers=12):
    """ViT-Tiny's width and depth (Touvron et al. 2021: 192 wide, 3 heads, 12 layers) for small images."""
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=image_size, patch_size=patch_size, num_layers=layers, num_heads=3,
                             hidden_dim=192, mlp_dim=768, num_classes=classes)


def without_stochastic_depth(model):
    """Sets every StochasticDepth's rate to 0 (PyTorch 1.13 cannot export its random mask); returns how many."""
    import torchvision
    count = 0
    for m in model.modules():
        if isinstance(m, torchvision.ops.StochasticDepth) and m.p > 0:
            m.p = 0.0
            count += 1
    return count


def torchvision_model(name, classes):
    """A torchvision classification model as dtrain trains it: no auxiliary heads, stochastic depth at rate 0."""
    import torchvision
    kwargs = {"weights": None, "num_classes": classes}
    if name in ("googlenet", "inception_v3"):
        kwargs["aux_logits"] = False
    model = getattr(torchvision.models, name)(**kwargs)
    n = without_stochastic_depth(model)
    if n:
        print("%s: stochastic depth set to rate 0 in %d blocks (not exportable in training mode)" % (name, n))
    return model


def export(model, example, path, opset=14):
    """The export dtrain trains: training mode, nothing folded, a free batch axis."""
    model.train()
    torch.onnx.export(model, example, path, input_names=["x"], output_names=["logits"],
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}}, opset_version=opset)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", nargs="?", default="vit_tiny.onnx")
    ap.add_argument("--torchvision", default="", help="a torchvision.models classification model (224x224x3)")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--opset", type=int, default=14)
    a = ap.parse_args()
    torch.manual_seed(0)
    if a.torchvision:
        model, example = torchvision_model(a.torchvision, a.classes), torch.zeros(2, 3, 224, 224)
    else:
        model, example = vit_tiny(classes=a.classes), torch.zeros(2, 3, 32, 32)
    export(model, example, a.path, a.opset)
    print("wrote", a.path, file=sys.stderr)
