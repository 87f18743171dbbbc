#!/usr/bin/python3
"""A torchvision classification model (resnet18, resnet50, mobilenet_v2, ...) with a head for your classes,
exported as ONNX for dtrain the way export_mlp.py exports (training mode, nothing folded, free batch axis).

  /usr/bin/python3 examples/export_torchvision_classifier.py resnet18 --classes=5 --image_size=224 resnet18.onnx

--image_size is the side of the square images dtrain will feed it (its --image_size for an image folder). The
weights are torchvision's random initialization (no pretrained weights are downloaded).
"""
import argparse

import torch
import torchvision

from export_mlp import export

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a name in torchvision.models, e.g. resnet18")
    p.add_argument("path", help="the .onnx file to write")
    p.add_argument("--classes", type=int, required=True)
    p.add_argument("--image_size", type=int, default=224)
    a = p.parse_args()
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.model)(num_classes=a.classes)
    export(model, torch.zeros(1, 3, a.image_size, a.image_size), a.path)
    print("wrote", a.path)
