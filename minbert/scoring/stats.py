"""How much of a difference is noise: bootstrap intervals of the scores, paired differences, seeds.

A dev set is a sample of examples, so every score is an estimate. This module attaches to each
score the distribution of its bootstrap replicates and derives everything from it:

- **a task metric** (accuracy, Pearson r): the percentile bootstrap over the examples. Resample
  k draws n example indices with replacement, exactly as `scipy.stats.bootstrap` draws them
  (`rng.integers(0, n, (batch, n))`, batch by batch), and the statistic is recomputed on the
  resample; the 95% interval is the 2.5th and 97.5th percentiles of the replicates (linear
  interpolation, as `scipy.stats.bootstrap(method="percentile")`). Resamples are counted, not
  gathered: a batch of resamples is a matrix of counts [batch, n], so accuracy is one matrix
  product and Pearson r five (weighted sums of x, y, x², y², xy), for any number of runs at once.
- **common resamples**: the indices are drawn by a generator seeded with (SEED, task) over the
  examples sorted by id. Two runs scored on the same examples therefore see the same resamples,
  and the difference of their replicates is the **paired bootstrap** of their difference.
  Runs on different example sets cannot be compared: `Estimate.minus` refuses with an error.
- **the overall score**: SST, Quora and STS are different example sets, resampled independently
  (each task has its own stream); replicate k of the overall score is the leaderboard formula
  (sst_acc + para_acc + (r + 1) / 2) / 3 of the tasks' replicates k (and the plain mean likewise).
- **seeds** (a repeated experiment): the mean over seeds, with a two-level bootstrap: for each
  resample, draw the seeds with replacement, then average their replicates of that (shared)
  example resample. The interval covers seed-to-seed and example noise; the difference with
  another row stays paired over the examples. `mean_std` gives the mean ± std (ddof 1).

The default 2,000 resamples put the Monte Carlo error of a 95% bound of an SST accuracy (n =
1,101) near 0.001; everything is seeded, so the same inputs give the same numbers.
"""
from __future__ import annotations

import hashlib
import math
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from minbert.core.errors import MinBertError
from minbert.core.metrics import metric_undefined
from minbert.core.tasks import LEADERBOARD_TASKS, TASKS

RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 11711
CHUNK_ELEMENTS = 2**22          # resampled indices per batch (memory: 8 bytes each, about three copies)


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    @property
    def width(self) -> float:
        return self.high - self.low


@dataclass(frozen=True, eq=False)
class Estimate:
    """A statistic and its bootstrap replicates.

    `basis` names the resampling behind the replicates, one entry per example set: (task, digest
    of the ids and labels, resamples, seed). Two estimates with the same basis were resampled with
    the same indices, so subtracting them replicate by replicate is a paired bootstrap."""
    value: float
    replicates: np.ndarray          # [resamples]
    basis: tuple
    seeds: int = 1                  # how many seeds' estimates were averaged

    def interval(self, confidence: float = CONFIDENCE) -> Interval:
        return percentile_interval(self.replicates, confidence)

    def minus(self, other: "Estimate") -> "Estimate":
        """The paired difference self - other."""
        if self.basis != other.basis:
            raise MinBertError(f"cannot pair the two runs: {describe_basis(self.basis)} against "
                               f"{describe_basis(other.basis)}; a paired difference needs the same examples "
                               f"(the same ids and labels), the same resamples and the same seed")
        return Estimate(self.value - other.value, self.replicates - other.replicates, self.basis)

    def significant(self, confidence: float = CONFIDENCE) -> bool:
        """For a difference: its interval excludes 0."""
        return self.interval(confidence).excludes_zero


def describe_basis(basis: tuple) -> str:
    return " + ".join(f"{task} ({n} examples, digest {digest[:8]})" for task, digest, n, *_ in basis) or "nothing"


def percentile_interval(replicates: np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """The percentile bootstrap interval (linear interpolation between order statistics, as
    scipy.stats.bootstrap(method="percentile"))."""
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(np.asarray(replicates, dtype=float), [alpha, 1.0 - alpha])
    return Interval(float(low), float(high))


# ------------------------------------------------------------------ resampling

def examples_digest(ids, labels) -> str:
    """A fingerprint of a set of labelled examples, given sorted by id: two runs are paired only
    when they were scored on the same ids with the same labels."""
    digest = hashlib.sha1("\n".join(str(i) for i in ids).encode("utf-8"))
    digest.update(np.ascontiguousarray(labels, dtype=np.float64).tobytes())
    return digest.hexdigest()


def stream(name: str, seed: int = SEED) -> np.random.Generator:
    """The generator of one task's resamples (or of a group's seed draws): seeded by the seed and
    a stable hash of the name (Python's hash() changes from run to run)."""
    return np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])


def chunk_size(n: int) -> int:
    """Resamples per batch: about CHUNK_ELEMENTS indices (the `batch` of scipy.stats.bootstrap that
    draws the same indices)."""
    return max(1, CHUNK_ELEMENTS // max(n, 1))


def resample_counts(n: int, resamples: int, rng: np.random.Generator, batch: int | None = None
                    ) -> Iterator[np.ndarray]:
    """Batches of bootstrap resamples as counts [batch, n] (float64): how often each example is
    drawn. The indices are drawn as scipy.stats.bootstrap(..., batch=batch) draws them."""
    batch = batch or chunk_size(n)
    for start in range(0, resamples, batch):
        b = min(batch, resamples - start)
        idx = rng.integers(0, n, (b, n))
        idx += (np.arange(b) * n)[:, None]
        yield np.bincount(idx.ravel(), minlength=b * n).reshape(b, n).astype(np.float64)


def _pearson_from_sums(n, sx, sy, sxx, syy, sxy):
    """Pearson r from (count-weighted) sums; 0 in a resample whose variance is 0 (a variance below
    1e-12 of its scale is rounding, i.e. 0). A sample whose own r is undefined gets no estimate
    (task_estimates), so this 0 only ever stands for a degenerate resample."""
    cov = n * sxy - sx * sy
    vx = n * sxx - sx * sx
    vy = n * syy - sy * sy
    ok = (vx > 1e-12 * n * sxx) & (vy > 1e-12 * n * syy)
    denom = np.sqrt(np.where(ok, vx * vy, 1.0))
    return np.clip(np.where(ok, cov / denom, 0.0), -1.0, 1.0)


def _columns(task: str, pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """What the statistic needs per example: correctness [n, 1], or for Pearson r the centred
    x, y, x², y², xy [n, 5] (centring first keeps the sums well conditioned)."""
    if TASKS[task].metric == "pearson":
        x = pred - pred.mean()
        y = true - true.mean()
        return np.stack([x, y, x * x, y * y, x * y], axis=1)
    return (pred == true).astype(np.float64)[:, None]


def _statistic(task: str, sums: np.ndarray, n: int) -> np.ndarray:
    """The task metric from count-weighted column sums [..., k]."""
    if TASKS[task].metric == "pearson":
        return _pearson_from_sums(n, *(sums[..., j] for j in range(5)))
    return sums[..., 0] / n


@dataclass(frozen=True)
class Sample:
    """One run's labelled predictions of one task and split."""
    ids: Sequence
    prediction: Sequence
    label: Sequence

    @classmethod
    def of(cls, frame) -> "Sample":
        """From a predictions DataFrame (id, label, prediction); rows without a label are left out."""
        frame = frame[frame["label"].notna()]
        return cls(frame["id"].astype(str).tolist(), frame["prediction"].to_numpy(dtype=float),
                   frame["label"].to_numpy(dtype=float))


def task_estimates(task: str, samples: Mapping, resamples: int = RESAMPLES, seed: int = SEED) -> dict:
    """Bootstrap estimates of `task`'s metric for many runs at once: {key: Sample} -> {key: Estimate}.

    Runs on the same examples share one pass of resamples (so their differences are paired);
    each distinct set of examples (ids and labels) gets its own pass, seeded the same way."""
    groups: dict[str, list] = {}
    prepared = {}
    for key, s in samples.items():
        ids = np.asarray([str(i) for i in s.ids], dtype=object)
        if len(ids) == 0:
            continue
        if len(set(ids)) != len(ids):
            raise MinBertError(f"{task} predictions of {key}: an id appears twice; ids must be unique")
        order = np.argsort(ids, kind="stable")
        pred = np.asarray(s.prediction, dtype=float)[order]
        true = np.asarray(s.label, dtype=float)[order]
        if not (np.isfinite(pred).all() and np.isfinite(true).all()):
            raise MinBertError(f"{task} predictions of {key}: a prediction or label is not a number")
        if metric_undefined(task, pred, true) is not None:
            continue                 # an undefined metric (constant labels or predictions) has no estimate
        digest = examples_digest(ids[order], true)
        prepared[key] = (pred, true)
        groups.setdefault(digest, []).append(key)
    out = {}
    for digest, keys in groups.items():
        n = len(prepared[keys[0]][0])
        cols = [_columns(task, *prepared[k]) for k in keys]
        width = cols[0].shape[1]
        matrix = np.concatenate(cols, axis=1)                      # [n, width * runs]
        sums = np.concatenate([counts @ matrix for counts in
                               resample_counts(n, resamples, stream(task, seed))], axis=0)
        sums = sums.reshape(resamples, len(keys), width)
        replicates = _statistic(task, sums, n)                      # [resamples, runs]
        full = _statistic(task, matrix.sum(axis=0).reshape(len(keys), width), n)
        basis = ((task, digest, n, resamples, seed),)
        for j, key in enumerate(keys):
            out[key] = Estimate(float(full[j]), np.ascontiguousarray(replicates[:, j]), basis)
    return {k: out[k] for k in samples if k in out}


def task_estimate(task: str, sample: Sample, resamples: int = RESAMPLES, seed: int = SEED) -> Estimate | None:
    """One run's estimate of `task`'s metric (the same numbers `task_estimates` gives it); None when
    the metric is undefined (constant predictions or labels, e.g. similarity scores all clipped to 0)."""
    return task_estimates(task, {"run": sample}, resamples, seed).get("run")


def paired_difference(task: str, frame_a, frame_b, resamples: int = RESAMPLES, seed: int = SEED) -> Estimate:
    """The metric of run a minus run b on the same examples, with its paired bootstrap replicates.
    Rows are matched by `id`; different ids are an error."""
    a, b = Sample.of(frame_a), Sample.of(frame_b)
    only_a, only_b = set(map(str, a.ids)) - set(map(str, b.ids)), set(map(str, b.ids)) - set(map(str, a.ids))
    if only_a or only_b:
        example = sorted(only_a or only_b)[0]
        raise MinBertError(f"{task}: the two runs were scored on different examples ({len(only_a)} id(s) only in "
                           f"the first, {len(only_b)} only in the second, e.g. '{example}'); a paired "
                           f"difference needs the same ids")
    est = task_estimates(task, {"a": a, "b": b}, resamples, seed)
    return est["a"].minus(est["b"])


# ------------------------------------------------------------------ combinations

def combine(fn, estimates: Sequence[Estimate]) -> Estimate:
    """fn applied to the values and, resample by resample, to the replicates (estimates over
    different example sets are independent resamples, combined as they come)."""
    lengths = {len(e.replicates) for e in estimates}
    if len(lengths) != 1:
        raise MinBertError(f"cannot combine estimates with different numbers of resamples ({sorted(lengths)})")
    value = float(fn(*(e.value for e in estimates)))
    replicates = np.asarray(fn(*(e.replicates for e in estimates)), dtype=float)
    basis = tuple(b for e in estimates for b in e.basis)
    return Estimate(value, replicates, basis, max(e.seeds for e in estimates))


def leaderboard(sst_acc, para_acc, sts_r):
    """(sst_acc + para_acc + (sts_r + 1) / 2) / 3, on numbers or arrays."""
    return (sst_acc + para_acc + (sts_r + 1.0) / 2.0) / 3.0


def plain_mean(sst_acc, para_acc, sts_r):
    return (sst_acc + para_acc + sts_r) / 3.0


def overall_estimates(by_task: Mapping[str, Estimate]) -> dict[str, Estimate]:
    """{"overall", "mean"} from the leaderboard tasks' estimates (empty when one is missing)."""
    if not all(t in by_task for t in LEADERBOARD_TASKS):
        return {}
    parts = [by_task[t] for t in LEADERBOARD_TASKS]
    return {"overall": combine(leaderboard, parts), "mean": combine(plain_mean, parts)}


def seed_mean(estimates: Sequence[Estimate], name: str, seed: int = SEED) -> Estimate:
    """The mean over seeds, with a two-level bootstrap: resample k draws the seeds with replacement
    (generator seeded by `name`, e.g. the repeated experiment's name, so that every metric of a
    group draws the same seeds) and averages their replicates k (the same example resample)."""
    if not estimates:
        raise MinBertError(f"{name}: no seed has an estimate to average")
    bases = {e.basis for e in estimates}
    if len(bases) != 1:
        raise MinBertError(f"{name}: the seeds were scored on different examples; re-run their predictions")
    reps = np.stack([e.replicates for e in estimates])             # [seeds, resamples]
    m, resamples = reps.shape
    if m == 1:
        drawn = reps[0]
    else:
        picks = stream("seeds/" + name, seed).integers(0, m, (resamples, m))
        drawn = reps[picks, np.arange(resamples)[:, None]].mean(axis=1)
    return Estimate(float(np.mean([e.value for e in estimates])), drawn, estimates[0].basis,
                    sum(e.seeds for e in estimates))


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None, int]:
    """Mean and sample standard deviation (ddof 1) of the finite values, and how many there are;
    the std is None for fewer than two values."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not xs:
        return None, None, 0
    std = float(np.std(xs, ddof=1)) if len(xs) > 1 else None
    return float(np.mean(xs)), std, len(xs)
