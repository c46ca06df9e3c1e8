"""Two small models and the synthetic data they learn, sized to train on 2 CPU cores in seconds.

Data is a pure function of (seed, step): every rank draws the same global batch and keeps its shard,
so a job resumed at another world size sees exactly the samples it would have seen, and the loss
curve of a resumed run continues where the checkpoint left it.
"""

from __future__ import annotations

import torch
from torch import nn

CLASSES = 4


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(16, CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TinyTransformer(nn.Module):
    VOCAB, SEQ = 16, 12

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(self.VOCAB, d)
        self.pos = nn.Parameter(torch.zeros(self.SEQ, d))
        layer = nn.TransformerEncoderLayer(d, nhead=2, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.head = nn.Linear(d, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x) + self.pos).mean(dim=1))


def build(name: str) -> nn.Module:
    return {"cnn": SmallCNN, "transformer": TinyTransformer}[name]()


def batch(name: str, seed: int, step: int, global_batch: int, rank: int, world: int) -> tuple[torch.Tensor, ...]:
    """This rank's shard of the global batch of ``step``."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    if name == "cnn":
        templates = torch.Generator().manual_seed(seed + 7)
        protos = torch.randn(CLASSES, 1, 12, 12, generator=templates)
        y = torch.randint(0, CLASSES, (global_batch,), generator=g)
        x = protos[y] + 1.5 * torch.randn(global_batch, 1, 12, 12, generator=g)
    else:  # label: the token bucket (token % 4) that occurs most often
        x = torch.randint(0, TinyTransformer.VOCAB, (global_batch, TinyTransformer.SEQ), generator=g)
        counts = torch.stack([(x % CLASSES == c).sum(dim=1) for c in range(CLASSES)], dim=1)
        y = counts.argmax(dim=1)
    shard = slice(rank * global_batch // world, (rank + 1) * global_batch // world)
    return x[shard], y[shard]
