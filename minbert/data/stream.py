"""A training run's batches of one task: length-bucketed (minbert.data.sampler), cycling through the
task's data as the run's plan asks, each rank of a data-parallel run taking its slice."""
from __future__ import annotations

import numpy as np

from minbert.data.batches import Collator, TaskData
from minbert.data.sampler import BucketBatchSampler


class TaskStream:
    """Endless length-bucketed batches of one task for one epoch; cycles (reshuffled) when the
    plan asks for more batches than the task has. Under data parallelism (`rank` of `world`), each
    rank takes its slice of every global batch, so N processes see exactly the batches one
    process would.

    A task walked through (`walked`: the number of its batches earlier epochs drew) does not
    restart each epoch: it continues where the last epoch stopped, in passes over all its data.
    `features`: a frozen encoder's stored embeddings of the task (minbert.train.frozen), whose
    batches it gives instead of token batches."""

    def __init__(self, data: TaskData, collator: Collator, batch_size: int, seed: int, epoch: int, *,
                 shard: tuple[int, int] = (0, 1), walked: int | None = None, features=None):
        self.data, self.collator, (self.rank, self.world) = data, collator, shard
        self.features = features
        self.sampler = BucketBatchSampler(data.lengths(), batch_size, shuffle=True, seed=seed)
        self.epoch, self.cycle, self.walking = epoch, 0, walked is not None
        self.seed, self.batches = seed, 0
        skip = 0
        if self.walking:
            self.cycle, skip = divmod(walked, max(1, len(self.sampler)))
        self._it = self._start()
        for _ in range(skip):
            next(self._it)

    def _start(self):
        # a walked task's passes are numbered across epochs, an epoch's cycles within it
        self.sampler.set_epoch(10**6 + self.cycle if self.walking else self.epoch * 1000 + self.cycle)
        return iter(self.sampler)

    def next(self) -> dict:
        rows, swaps = self._draw()
        return self._batch(rows, swaps)

    def next_parts(self, parts: int) -> list[dict]:
        """The next batch as `parts` micro-batches (gradient accumulation): its rows in order, cut
        into consecutive slices as equal as they go, each padded on its own."""
        rows, swaps = self._draw()
        cuts = np.array_split(np.arange(len(rows)), min(parts, len(rows)))
        return [self._batch([rows[k] for k in cut], None if swaps is None else [swaps[k] for k in cut])
                for cut in cuts]

    def _draw(self) -> tuple[list[int], list[bool] | None]:
        """This rank's rows of the next global batch, and which pairs read (b, a)."""
        try:
            idx = next(self._it)
        except StopIteration:
            self.cycle += 1
            self._it = self._start()
            idx = next(self._it)
        swap = None
        if self.data.symmetric:   # drawn for the whole global batch, so every rank agrees
            rng = np.random.default_rng([self.seed, self.epoch, self.batches, 7])
            swap = (rng.random(len(idx)) < 0.5).tolist()
        self.batches += 1
        keep = list(range(len(idx)))[self.rank::self.world] or [0]
        return [idx[k] for k in keep], None if swap is None else [swap[k] for k in keep]

    def _batch(self, rows: list[int], swaps: list[bool] | None) -> dict:
        if self.features is not None:
            return self.features.batch(rows, swaps)
        return self.collator(self.data, rows, swaps)
