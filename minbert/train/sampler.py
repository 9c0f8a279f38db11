"""A length-bucketed batch sampler that cuts padding (and shares its batches among DDP ranks)."""
from __future__ import annotations

import math

import numpy as np
from torch.utils.data import Sampler


class BucketBatchSampler(Sampler):
    """Batches of indices whose examples have similar lengths, to cut padding.

    With `shuffle`, each epoch permutes the examples (seeded by seed + epoch), sorts them by
    length within pools of `pool_batches` batches, cuts the pools into batches and shuffles the
    batch order: similar lengths together, yet different batches every epoch. Without `shuffle`,
    batches follow the length order (deterministic; for prediction).

    With num_replicas > 1 (DDP) every rank yields a disjoint share of the same batch list; the
    list is padded by repeating its first batches (or cut, with drop_last) so all ranks yield the
    same number of batches.
    """

    def __init__(self, lengths, batch_size: int, shuffle: bool = True, seed: int = 0,
                 num_replicas: int = 1, rank: int = 0, drop_last: bool = False, pool_batches: int = 50):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.batch_size, self.shuffle, self.seed = int(batch_size), shuffle, int(seed)
        self.num_replicas, self.rank, self.drop_last = int(num_replicas), int(rank), drop_last
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
        if self.drop_last and batches and len(batches[-1]) < bs:
            batches.pop()
        if self.shuffle:
            perm = np.random.default_rng(self.seed + self.epoch + 1_000_003).permutation(len(batches))
            batches = [batches[i] for i in perm]
        return batches

    def _per_rank(self, n_batches: int) -> int:
        if self.drop_last:
            return n_batches // self.num_replicas
        return math.ceil(n_batches / self.num_replicas)

    def __iter__(self):
        batches = self._all_batches()
        per_rank = self._per_rank(len(batches))
        total = per_rank * self.num_replicas
        if total > len(batches):   # pad by repeating, as torch's DistributedSampler does
            batches = (batches * math.ceil(total / max(1, len(batches))))[:total]
        else:
            batches = batches[:total]
        yield from batches[self.rank:total:self.num_replicas]

    def __len__(self) -> int:
        n = len(self.lengths)
        n_batches = n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
        return self._per_rank(n_batches)
