#!/usr/bin/python3
"""LeNet-5 for 28x28x1 images (Fashion-MNIST, MNIST), exported as ONNX for dtrain.

  /usr/bin/python3 examples/export_lenet5.py lenet5.onnx
  build/bin/dtrain_worker --job_name=local --model=lenet5.onnx --train_steps=2000
"""
import sys

import torch
from torch import nn

from export_mlp import export


class LeNet5(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)   # 28x28 -> 28x28 (the original's 32x32 input, padded)
        self.conv2 = nn.Conv2d(6, 16, 5)             # 14x14 -> 10x10
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, classes)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = x.view(x.size(0), -1)  # exported as Shape/Gather/Unsqueeze/Concat -> Reshape: dtrain folds it
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


if __name__ == "__main__":
    torch.manual_seed(0)
    path = sys.argv[1] if len(sys.argv) > 1 else "lenet5.onnx"
    export(LeNet5(), torch.zeros(1, 1, 28, 28), path)
    print("wrote", path)
