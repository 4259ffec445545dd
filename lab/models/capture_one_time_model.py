"""A model whose first forward in a process allocates once more (a cache built on first use,
kept for the life of the process), for `vramlab capture --module` tests (issue 32).

    vramlab capture --module lab/models/capture_one_time_model.py:build --input 64 -o once.vramlab-graph.json

The capture runner's first capture of a process holds that allocation and the later ones do
not, so the runner captures the first batch again; with two CPUs the forked child's first
capture is cold as well and is captured again in the parent. lab/cpu/capture_equal.py and
python/tests/test_capture_golden.py check that the graph matches the reference runner's.
"""

import torch
import torch.nn as nn

_CACHE = []


class OnceNet(nn.Module):
    def __init__(self, width=64, classes=10):
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, classes)

    def forward(self, x):
        if not _CACHE:
            _CACHE.append(torch.empty(4096, device=x.device))
        return self.fc2(torch.relu(self.fc1(x)))


def build():
    return OnceNet()
