"""Hand-written models for `vramlab capture --module` (issue 26's grid: models no builder has).

    vramlab capture --module lab/models/handwritten_models.py:seg_unet --image 224 -o unet.vramlab-graph.json
    vramlab capture --module lab/models/handwritten_models.py:spec_conformer --input 1x80x256 -o conf.vramlab-graph.json

seg_unet: a segmentation U-Net as people write it for diffusion-style or medical work:
GroupNorm + SiLU residual blocks, strided-conv downsampling, nearest upsampling with
`F.interpolate`, skip connections by `torch.cat`, one self-attention block at the bottom
through `F.scaled_dot_product_attention`; per-pixel logits (B, classes, H, W).

spec_conformer: an audio classifier over a log-mel spectrogram (1 x 80 mel x T frames):
a 2-D convolutional subsampler (x4 in time), then Conformer blocks (half-step feed-forward,
multi-head self-attention with its own q/k/v projection and SDPA with dropout, a convolution
module: pointwise conv, GLU, depthwise conv, BatchNorm1d, SiLU, pointwise conv; half-step
feed-forward; LayerNorm), mean pooling over time, a linear classifier.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ResBlock(nn.Module):
    def __init__(self, cin, cout, groups=8):
        super().__init__()
        self.n1 = nn.GroupNorm(groups, cin)
        self.c1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.n2 = nn.GroupNorm(groups, cout)
        self.c2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x):
        h = self.c1(F.silu(self.n1(x)))
        h = self.c2(F.silu(self.n2(h)))
        return h + self.skip(x)


class AttnBlock(nn.Module):
    def __init__(self, ch, heads=4):
        super().__init__()
        self.heads = heads
        self.norm = nn.GroupNorm(8, ch)
        self.qkv = nn.Conv2d(ch, 3 * ch, 1)
        self.out = nn.Conv2d(ch, ch, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=1)

        def heads(t):
            return t.reshape(b, self.heads, c // self.heads, h * w).transpose(2, 3)

        o = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
        o = o.transpose(2, 3).reshape(b, c, h, w)
        return x + self.out(o)


class SegUNet(nn.Module):
    def __init__(self, base=32, mults=(1, 2, 4, 8), classes=21):
        super().__init__()
        chans = [base * m for m in mults]
        self.stem = nn.Conv2d(3, base, 3, padding=1)
        self.down = nn.ModuleList()
        self.pool = nn.ModuleList()
        cin = base
        for i, c in enumerate(chans):
            self.down.append(ResBlock(cin, c))
            self.pool.append(nn.Conv2d(c, c, 3, stride=2, padding=1) if i < len(chans) - 1 else nn.Identity())
            cin = c
        self.mid = nn.Sequential(ResBlock(cin, cin), AttnBlock(cin), ResBlock(cin, cin))
        self.up = nn.ModuleList()
        for c in reversed(chans[:-1]):
            self.up.append(ResBlock(cin + c, c))
            cin = c
        self.head = nn.Sequential(nn.GroupNorm(8, cin), nn.SiLU(), nn.Conv2d(cin, classes, 1))

    def forward(self, x):
        h = self.stem(x)
        skips = []
        for block, pool in zip(self.down, self.pool):
            h = block(h)
            skips.append(h)
            h = pool(h)
        h = self.mid(h)
        skips.pop()
        for block in self.up:
            s = skips.pop()
            h = F.interpolate(h, size=s.shape[-2:], mode="nearest")
            h = block(torch.cat([h, s], dim=1))
        return self.head(h)


class FeedForward(nn.Module):
    def __init__(self, dim, mult=4, p=0.1):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mult * dim)
        self.fc2 = nn.Linear(mult * dim, dim)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return self.drop(self.fc2(self.drop(F.silu(self.fc1(self.norm(x))))))


class SelfAttention(nn.Module):
    def __init__(self, dim, heads, p=0.1):
        super().__init__()
        self.heads = heads
        self.p = p
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0)
        return self.proj(o.transpose(1, 2).reshape(b, t, d))


class ConvModule(nn.Module):
    def __init__(self, dim, kernel=15):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.pw1 = nn.Conv1d(dim, 2 * dim, 1)
        self.dw = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=dim)
        self.bn = nn.BatchNorm1d(dim)
        self.pw2 = nn.Conv1d(dim, dim, 1)

    def forward(self, x):
        h = self.norm(x).transpose(1, 2)
        h = F.glu(self.pw1(h), dim=1)
        h = self.pw2(F.silu(self.bn(self.dw(h))))
        return h.transpose(1, 2)


class ConformerBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ff1 = FeedForward(dim)
        self.attn = SelfAttention(dim, heads)
        self.conv = ConvModule(dim)
        self.ff2 = FeedForward(dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        x = x + 0.5 * self.ff1(x)
        x = x + self.attn(x)
        x = x + self.conv(x)
        x = x + 0.5 * self.ff2(x)
        return self.norm(x)


class SpecConformer(nn.Module):
    def __init__(self, mels=80, dim=256, heads=4, layers=8, classes=527):
        super().__init__()
        self.sub = nn.Sequential(nn.Conv2d(1, dim, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.Conv2d(dim, dim, 3, stride=2, padding=1), nn.ReLU())
        self.inp = nn.Linear(dim * ((mels + 3) // 4), dim)
        self.blocks = nn.ModuleList([ConformerBlock(dim, heads) for _ in range(layers)])
        self.cls = nn.Linear(dim, classes)

    def forward(self, x):  # (B, 1, mels, T)
        h = self.sub(x)  # (B, dim, mels/4, T/4)
        b, c, f, t = h.shape
        h = self.inp(h.permute(0, 3, 1, 2).reshape(b, t, c * f))
        for blk in self.blocks:
            h = blk(h)
        return self.cls(h.mean(1))


def seg_unet():
    return SegUNet()


def spec_conformer():
    return SpecConformer()
