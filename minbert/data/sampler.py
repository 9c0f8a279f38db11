"""A length-bucketed batch sampler that cuts padding. (Under DDP every rank takes its slice of
each global batch: minbert.train.loop.)"""
from __future__ import annotations

import math

import numpy as np
from torch.utils.data import Sampler


class BucketBatchSampler(Sampler):
    """Batches of indices whose examples have similar lengths, to cut padding.

    With `shuffle`, each epoch permutes the examples (seeded by seed + epoch), sorts them by
    length within pools of `pool_batches` batches, cuts the pools into batches and shuffles the
    batch order: similar lengths together, yet different batches every epoch. Without `shuffle`,
    batches follow the length order (deterministic; for dev losses).
    """

    def __init__(self, lengths, batch_size: int, shuffle: bool = True, seed: int = 0, pool_batches: int = 50):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.batch_size, self.shuffle, self.seed = int(batch_size), shuffle, int(seed)
        self.pool_batches = max(1, int(pool_batches))
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _all_batches(self) -> list[list[int]]:
        n, bs = len(self.lengths), self.batch_size
        if self.shuffle:
            rng = np.random.default_rng(self.seed + self.epoch)
            order = rng.permutation(n)
            pool = bs * self.pool_batches
            # within each pool, sort by length (stable: ties keep the random order)
            order = np.concatenate([chunk[np.argsort(self.lengths[chunk], kind="stable")]
                                    for chunk in np.array_split(order, range(pool, n, pool))]) if n else order
        else:
            order = np.argsort(self.lengths, kind="stable")
        batches = [order[i:i + bs].tolist() for i in range(0, n, bs)]
        if self.shuffle:
            perm = np.random.default_rng(self.seed + self.epoch + 1_000_003).permutation(len(batches))
            batches = [batches[i] for i in perm]
        return batches

    def __iter__(self):
        yield from self._all_batches()

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)
