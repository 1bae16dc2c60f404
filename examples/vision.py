"""Vision models for ``artifactcache.compile`` and the CLI spec ``examples/vision.py:NAME``.

Each factory takes no arguments and returns ``(module, example_inputs)`` with random
weights (the CLI seeds torch first, so every process builds the same weights)::

    acache build examples/vision.py:resnet50 --backend aoti --device cuda --dtype fp16
    acache bench examples/vision.py:tiny_convnet --backend inductor --batch 1,32

``resnet50`` and ``vit_b_16`` need torchvision (imported inside the factory, so the
tiny ones run without it); the tiny variants are plain torch and fast on a CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _torchvision():
    try:
        import torchvision
    except ImportError:
        raise RuntimeError(
            "torchvision is not installed: pip install torchvision (matching your torch)"
        ) from None
    return torchvision


def resnet50() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """torchvision ResNet-50, random init, one 224x224 image."""
    model = _torchvision().models.resnet50(weights=None)
    return model.eval(), (torch.randn(1, 3, 224, 224),)


def vit_b_16() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """torchvision ViT-B/16, random init, one 224x224 image."""
    model = _torchvision().models.vit_b_16(weights=None)
    return model.eval(), (torch.randn(1, 3, 224, 224),)


class TinyConvNet(nn.Module):
    """A ResNet-shaped toy: stem, two residual blocks, pooled linear head."""

    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.blocks = nn.ModuleList(ResidualBlock(width) for _ in range(2))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


class ResidualBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


def tiny_convnet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return TinyConvNet().eval(), (torch.randn(2, 3, 32, 32),)


class TinyViT(nn.Module):
    """A ViT-shaped toy: patch embedding, class token, pre-norm encoder blocks, head."""

    def __init__(
        self, image: int = 32, patch: int = 8, dim: int = 32, depth: int = 2, classes: int = 10
    ) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(EncoderBlock(dim, heads=4) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


def tiny_vit() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return TinyViT().eval(), (torch.randn(2, 3, 32, 32),)
