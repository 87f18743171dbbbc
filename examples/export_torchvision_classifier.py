#!/usr/bin/python3
"""A torchvision classification model (resnet18, resnet50, mobilenet_v2, efficientnet_b0, vit_b_16, ...) with a
head for your classes, exported as ONNX for dtrain (training mode, nothing folded, free batch axis).

  /usr/bin/python3 examples/export_torchvision_classifier.py resnet18 --classes=5 --image_size=224 resnet18.onnx

--image_size is the side of the square images dtrain will feed it (its --image_size for an image folder; the
vision transformers take only the size they were built for, 224). The weights are torchvision's random
initialization (no pretrained weights are downloaded). The model is built as export_vit.torchvision_model builds
it: GoogLeNet and Inception v3 without their auxiliary heads, stochastic depth at rate 0 (PyTorch 1.13 cannot
export its random mask in training mode).
"""
import argparse

import torch

from export_vit import export, torchvision_model

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a name in torchvision.models, e.g. resnet18")
    p.add_argument("path", help="the .onnx file to write")
    p.add_argument("--classes", type=int, required=True)
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--opset", type=int, default=14)
    a = p.parse_args()
    torch.manual_seed(0)
    export(torchvision_model(a.model, a.classes), torch.zeros(2, 3, a.image_size, a.image_size), a.path, a.opset)
    print("wrote", a.path)
