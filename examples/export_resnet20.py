#!/usr/bin/python3
"""ResNet-20 for CIFAR-10 (He et al. 2016, section 4.2: 3 stages of 3 basic blocks, 16/32/64 channels, projection
shortcuts where the shape changes), with BatchNorm and residual Adds, exported as ONNX for dtrain.

  /usr/bin/python3 examples/export_resnet20.py resnet20.onnx
  build/bin/dtrain_worker --job_name=local --model=resnet20.onnx --data_dir=/data/cifar-10-batches-bin \\
      --optimizer=momentum --learning_rate=0.1 --batch_size=128 --train_steps=20000
(Add --input_mean=0.4914,0.4822,0.4465 --input_std=0.2470,0.2435,0.2616 to train on normalized pixels, as
torchvision's CIFAR-10 recipes do; then give PyTorch the same normalization.)

ResNet(blocks=1, in_channels=1) is ResNet-8 for 28x28x1 images (the PyTorch equivalence test uses it).
"""
import sys

import torch
from torch import nn

from export_mlp import export


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, blocks=3, in_channels=3, classes=10):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        layers, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(blocks):
                layers.append(Block(cin, cout, stride if i == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)  # GlobalAveragePool
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = self.layers(torch.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


if __name__ == "__main__":
    torch.manual_seed(0)
    path = sys.argv[1] if len(sys.argv) > 1 else "resnet20.onnx"
    export(ResNet(blocks=3, in_channels=3), torch.zeros(1, 3, 32, 32), path)
    print("wrote", path)
