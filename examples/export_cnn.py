#!/usr/bin/python3
"""TensorFlow's "Deep MNIST for experts" CNN (dtrain's built-in --model=cnn) written in PyTorch and exported as
ONNX: two 5x5 convolutions (32, 64 channels) with ReLU and 2x2 max pooling, a 1024-unit dense layer, dropout
(keep 0.5) and the logits. The same network as the built-in; PyTorch flattens (C, H, W) where TensorFlow flattens
(H, W, C), so the file's fc1.weight rows come in another order.

  /usr/bin/python3 examples/export_cnn.py cnn.onnx
  build/bin/dtrain_worker --job_name=local --model=cnn.onnx --optimizer=adam --learning_rate=1e-4 --batch_size=50
"""
import sys

import torch
from torch import nn

from export_mlp import export


class Cnn(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(7 * 7 * 64, 1024)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(1024, classes)
        for m in (self.conv1, self.conv2, self.fc1, self.fc2):  # the seed's initializers
            nn.init.trunc_normal_(m.weight, std=0.1, a=-0.2, b=0.2)
            nn.init.constant_(m.bias, 0.1)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


if __name__ == "__main__":
    torch.manual_seed(0)
    path = sys.argv[1] if len(sys.argv) > 1 else "cnn.onnx"
    export(Cnn(), torch.zeros(1, 1, 28, 28), path)
    print("wrote", path)
