"""ResNet-18 with group normalisation: seed 000's image model (Zhao et al., section 4.1 and
appendix A.5).

The paper trains "ResNet-18 (He et al., 2016), implemented in Timm, with Batch Normalization
replaced by Group Normalization", from scratch. Its authors' code (TrustworthyMLHelsinki/
adaptive-clipping-fairness, ``dpdl/models/model_factory.py``) replaces the normalisation with
Opacus' ``ModuleValidator.fix``, which turns every ``BatchNorm2d(C)`` into
``GroupNorm(gcd(32, C), C)``: 32 groups for ResNet-18's 64, 128, 256 and 512 channels.

This module builds timm's ``resnet18`` (the torchvision layout) with that replacement, without
timm: a 7×7 stride-2 stem convolution (no bias) with its normalisation and ReLU, 3×3 stride-2
max-pooling, four stages of two basic blocks (64, 128, 256, 512 channels; the first block of
stages 2-4 has stride 2 and a 1×1 stride-2 projection with its normalisation on the shortcut),
global average pooling and a linear layer to the classes. Every convolution is initialised as
timm does (Kaiming normal, fan out, ReLU gain); the group normalisations start at weight 1 and
bias 0 (the replacement discards timm's zero initialisation of each block's last batch norm);
the linear layer keeps torch's default. The first convolution takes the images' own channels
(1 for MNIST: the authors' image pipeline turns every image into one channel), at their own
size (28×28: the feature maps are 14, 7, 7, 4, 2 and 1 pixels wide).

Parameters are registered in timm's order (stem, then each block's conv1, norm1, conv2, norm2,
projection), which is the order of ``model.parameters()`` and of the flat vectors policies clip.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

STAGES = (64, 128, 256, 512)
"""Channels of ResNet-18's four stages (two basic blocks each)."""


def group_norm(channels: int) -> nn.GroupNorm:
    """What Opacus' ``ModuleValidator.fix`` puts in place of ``BatchNorm2d(channels)``."""
    return nn.GroupNorm(math.gcd(32, channels), channels)


class BasicBlock(nn.Module):
    """Two 3×3 convolutions with group normalisation and a residual connection (timm's
    ``BasicBlock``): relu(norm2(conv2(relu(norm1(conv1(x))))) + shortcut(x))."""

    def __init__(self, inputs: int, outputs: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False)
        self.bn1 = group_norm(outputs)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(outputs, outputs, 3, stride=1, padding=1, bias=False)
        self.bn2 = group_norm(outputs)
        self.act2 = nn.ReLU()
        self.downsample = (
            nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False), group_norm(outputs))
            if stride != 1 or inputs != outputs
            else None
        )

    def forward(self, x: Tensor) -> Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.act1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.act2(out + shortcut)


class ResNet18GroupNorm(nn.Module):
    """ResNet-18 with ``GroupNorm(32, C)`` in place of batch normalisation (see the module)."""

    def __init__(self, channels: int, num_classes: int, width: int = 64):
        """``width``: the first stage's channels (64 in ResNet-18; the stages double it). Smaller
        widths exist for tests only (the same layers, fewer parameters)."""
        super().__init__()
        stages = tuple(width * 2**i for i in range(len(STAGES)))
        self.conv1 = nn.Conv2d(channels, stages[0], 7, stride=2, padding=3, bias=False)
        self.bn1 = group_norm(stages[0])
        self.act1 = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        previous = stages[0]
        for index, outputs in enumerate(stages):
            stride = 1 if index == 0 else 2
            blocks = nn.Sequential(BasicBlock(previous, outputs, stride), BasicBlock(outputs, outputs, 1))
            self.add_module(f"layer{index + 1}", blocks)
            previous = outputs
        self.global_pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(previous, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.act1(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.global_pool(x))
