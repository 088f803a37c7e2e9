"""The digits classifier shared by the train and serve samples: 8x8 images of digits
(values 0-16, as scikit-learn's digits dataset has them) to one of 10 classes."""

import torch
from torch import nn

PIXELS = 64
CLASSES = 10
SCALE = 16.0  # the dataset's largest pixel value


def make_model():
    return nn.Sequential(nn.Linear(PIXELS, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def to_input(pixels):
    """A float tensor of shape (n, 64) scaled to 0..1 from raw 0..16 pixel values."""
    return torch.as_tensor(pixels, dtype=torch.float32).reshape(-1, PIXELS) / SCALE
