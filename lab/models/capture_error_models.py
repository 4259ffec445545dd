"""Models `vramlab capture --module` refuses, for the runner's error paths (issue 32: the
faster runner exits with the same status and message as the reference runner).

    data_dependent: boolean-mask indexing, an output shape that depends on tensor values
        (exit 5, on the first batch)
    not_affine: an allocation of batch² elements (exit 6, after all batches)
    fails_at_batch_6: raises in the forward at batch 6 only (the last of the default batches:
        the forked child's batch; the runner captures it again itself and fails there)
"""

import torch
import torch.nn as nn


class _Base(nn.Module):
    def __init__(self, width=32, classes=10):
        super().__init__()
        self.fc = nn.Linear(width, classes)


class DataDependent(_Base):
    def forward(self, x):
        return self.fc(x[x > 0].reshape(-1, x.shape[1]))


class NotAffine(_Base):
    def forward(self, x):
        b = x.shape[0]
        sq = torch.zeros(b * b, device=x.device)
        return self.fc(x) + sq.sum()


class FailsAtBatch6(_Base):
    def forward(self, x):
        if x.shape[0] == 6:
            raise RuntimeError("fails_at_batch_6: batch 6")
        return self.fc(x)


def data_dependent():
    return DataDependent()


def not_affine():
    return NotAffine()


def fails_at_batch_6():
    return FailsAtBatch6()
