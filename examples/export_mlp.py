#!/usr/bin/python3
"""A two-layer MLP for 28x28 images (Fashion-MNIST), exported as ONNX for dtrain.

  /usr/bin/python3 examples/export_mlp.py mlp.onnx
  build/bin/dtrain_worker --job_name=local --model=mlp.onnx --train_steps=2000

Its input is flat, [N, 784]: dtrain flattens the images in front of it, in PyTorch's (C, H, W) order.
"""
import sys

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, inputs=784, hidden=500, classes=10):
        super().__init__()
        self.fc1 = nn.Linear(inputs, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def export(model, example, path):
    """The export dtrain trains: training mode, nothing folded, a free batch axis."""
    model.train()
    torch.onnx.export(model, example, path, input_names=["x"], output_names=["logits"],
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      dynamic_axes={"x": {0: "N"}}, opset_version=14)


if __name__ == "__main__":
    torch.manual_seed(0)
    path = sys.argv[1] if len(sys.argv) > 1 else "mlp.onnx"
    export(MLP(), torch.zeros(1, 784), path)
    print("wrote", path)
