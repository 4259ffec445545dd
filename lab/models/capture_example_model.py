"""A hand-written model with an unusual head, for `vramlab capture --module`.

    vramlab capture --module lab/models/capture_example_model.py:build --image 160 -o odd.vramlab-graph.json

A small convolutional trunk, then a head no builder has: learned queries cross-attend to the
feature map (a Perceiver-style pooling head), a gated MLP mixes the pooled queries, and a
bilinear layer scores classes from the mean query against a per-class embedding.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.pw = nn.Conv2d(cout, cout, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)

    def forward(self, x):
        x = F.gelu(self.bn(self.conv(x)))
        return x + F.gelu(self.bn2(self.pw(x)))


class QueryPoolHead(nn.Module):
    def __init__(self, dim, queries=16, heads=8, classes=1000, embed=256):
        super().__init__()
        self.queries = nn.Parameter(torch.randn(queries, dim) * 0.02)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.gate = nn.Linear(dim, 4 * dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)
        self.proj = nn.Linear(dim, embed)
        self.classes = nn.Parameter(torch.randn(classes, embed) * 0.02)
        self.bilinear = nn.Parameter(torch.randn(embed, embed) * 0.02)

    def forward(self, feat):
        b, c, h, w = feat.shape
        tokens = feat.flatten(2).transpose(1, 2)  # (B, HW, C)
        q = self.queries.unsqueeze(0).expand(b, -1, -1)
        pooled, _ = self.attn(q, tokens, tokens, need_weights=False)
        x = self.norm(pooled + q)
        x = x + self.down(F.silu(self.gate(x)) * self.up(x))
        z = self.proj(x.mean(1))  # (B, E)
        return (z @ self.bilinear) @ self.classes.t()  # (B, classes)


class OddNet(nn.Module):
    def __init__(self, width=96, classes=1000):
        super().__init__()
        chans = [3, width // 2, width, width * 2, width * 4]
        self.blocks = nn.Sequential(*[ConvBlock(chans[i], chans[i + 1], 2) for i in range(4)])
        self.head = QueryPoolHead(chans[-1], classes=classes)

    def forward(self, x):
        return self.head(self.blocks(x))


def build():
    return OddNet()
