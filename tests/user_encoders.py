"""Encoders as a user writes them for ``--encoder user_encoders:NAME`` (tests/test_encoder.py)."""

from __future__ import annotations

import torch
from torch import nn


class Tanh(nn.Module):
    """One tanh layer on flat vectors."""

    def __init__(self, input_space, width: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(input_space.shape[0], width), nn.Tanh())

    def forward(self, x):
        return self.net(x)


class Tanh2(Tanh):
    """Tanh's parameters, their names and shapes alike, under another class."""


class TenInputs(nn.Module):
    """Takes 10 inputs, whatever the observations are."""

    def __init__(self, input_space):
        super().__init__()
        self.linear = nn.Linear(10, 4)

    def forward(self, x):
        return self.linear(x)


class SmallCNN(nn.Module):
    """One convolution and a linear layer on [N, C, H, W] images in [0, 1]."""

    def __init__(self, input_space):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(input_space.shape[0], 8, 3, padding=1), nn.ReLU(), nn.Flatten())
        self.out = nn.Linear(8 * input_space.shape[1] * input_space.shape[2], 32)

    def forward(self, x):
        return torch.relu(self.out(self.conv(x)))


class Raises(nn.Module):
    def __init__(self, input_space):
        super().__init__()
        raise ValueError("no encoder today")


class FlatOutput(nn.Module):
    """Returns [N] instead of [N, K]."""

    def __init__(self, input_space):
        super().__init__()
        self.linear = nn.Linear(input_space.shape[0], 1)

    def forward(self, x):
        return self.linear(x).squeeze(-1)


NOT_A_MODULE = 3


class HalfInit(Tanh):
    """Tanh with an initialisation of its own: every weight 0.5, every bias 0."""

    def __init__(self, input_space, width: int = 64):
        super().__init__(input_space, width)
        nn.init.constant_(self.net[0].weight, 0.5)
        nn.init.zeros_(self.net[0].bias)


class BatchNormed(nn.Module):
    """A linear layer, batch norm and tanh: batch norm in train mode cannot take one row."""

    def __init__(self, input_space, width: int = 16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(input_space.shape[0], width), nn.BatchNorm1d(width), nn.Tanh())

    def forward(self, x):
        return self.net(x)


class Dropped(nn.Module):
    """A linear layer, tanh and dropout of half the features."""

    def __init__(self, input_space, width: int = 16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(input_space.shape[0], width), nn.Tanh(), nn.Dropout(0.5))

    def forward(self, x):
        return self.net(x)
