"""Every score of the report with its uncertainty, computed once per report: `ScoreBook` holds each
run's values (metrics.json) and bootstrap estimates (minbert.scoring.stats, from its predictions);
a repeated experiment (`repeats`, a group of seed runs in `LoadedParams.groups`) is the mean over
its seeds. The tables, grids, paper tables and the best-model choice read it.
"""
from __future__ import annotations

from collections import defaultdict

from minbert.core.tasks import LEADERBOARD_TASKS, TASKS
from minbert.report.data import ReportData, RunResults
from minbert.report.formats import is_number
from minbert.scoring import stats


def metric_columns() -> list[tuple[str, str, str]]:
    """(metrics.json key, column header, what it is) of the overall scores and of every task of the
    registry, the params' own tasks included (so read when the report renders, not when imported)."""
    return ([("overall", "Overall (leaderboard)", "(SST acc + Para acc + (STS r + 1) / 2) / 3, the leaderboard score")]
            + [(t.metric_key, t.metric_header, t.metric_title) for t in TASKS.values()]
            + [("mean", "Mean (plain)", "plain mean of the three task metrics")])
TOLERANCE = 1e-6                                # metrics.json against the same metric recomputed


def metric_value(run: RunResults, split: str, key: str):
    v = run.split_metrics(split).get(key)
    return v if is_number(v) else None


class ScoreBook:
    """Every score of the report with its bootstrap estimate (minbert.scoring.stats), computed once.

    Values come from metrics.json (what the pipeline reported); estimates from the labelled
    predictions, all runs of a task and split in one pass so that runs on the same examples share
    their resamples (paired). A run whose predictions do not reproduce its metrics.json gets no
    intervals and a note (re-run its evaluate stage). A group (repeated experiment) is the mean
    over its seeds (`stats.seed_mean`)."""

    def __init__(self, data: ReportData, resamples: int = stats.RESAMPLES, seed: int = stats.SEED,
                 confidence: float = stats.CONFIDENCE):
        self.data = data
        self.resamples, self.seed, self.confidence = resamples, seed, confidence
        self.groups: dict[str, list[str]] = dict(data.params.groups)
        self.problems: dict[str, str] = {}      # run -> why it has no intervals
        self._estimates: dict[tuple, stats.Estimate] = {}
        self._group_cache: dict[tuple, stats.Estimate | None] = {}
        samples: dict[tuple, dict] = defaultdict(dict)
        for name, run in data.runs.items():
            for (task, split) in sorted(run.predictions):
                frame = run.labelled(task, split)
                if frame is not None:
                    samples[(task, split)][name] = stats.Sample.of(frame)
        for (task, split), by_run in sorted(samples.items()):
            for name, est in stats.task_estimates(task, by_run, resamples, seed).items():
                self._estimates[(name, split, TASKS[task].metric_key)] = est
        for name in data.runs:
            for split in ("dev", "test"):
                by_task = {t: self._estimates[(name, split, TASKS[t].metric_key)] for t in LEADERBOARD_TASKS
                           if (name, split, TASKS[t].metric_key) in self._estimates}
                for key, est in stats.overall_estimates(by_task).items():
                    self._estimates[(name, split, key)] = est
        for (name, split, key), est in sorted(self._estimates.items(), key=lambda kv: kv[0]):
            reported = metric_value(data.runs[name], split, key)
            if reported is not None and abs(reported - est.value) > TOLERANCE and name not in self.problems:
                self.problems[name] = (f"The predictions of {name} give {split} {key} {est.value:.4f}, its "
                                       f"metrics.json {reported:.4f}: its intervals are left out; re-run its "
                                       f"evaluate stage.")
        for name in self.problems:
            for k in [k for k in self._estimates if k[0] == name]:
                del self._estimates[k]

    # ---------------------------------------------------------------- per name (run or group)
    def is_group(self, name: str) -> bool:
        return name in self.groups and name not in self.data.runs

    def members(self, name: str) -> list[str]:
        return self.groups[name] if self.is_group(name) else [name]

    def value(self, name: str, split: str, key: str) -> float | None:
        """The run's reported value, or a group's mean over the seeds that have it."""
        if not self.is_group(name):
            return metric_value(self.data.runs[name], split, key)
        return stats.mean_std(self.seed_values(name, split, key))[0]

    def seed_values(self, name: str, split: str, key: str) -> list[float]:
        return [v for m in self.members(name) if (v := metric_value(self.data.runs[m], split, key)) is not None]

    def estimate(self, name: str, split: str, key: str) -> stats.Estimate | None:
        """The bootstrap estimate; a group's only when every seed with a value has one."""
        if not self.is_group(name):
            return self._estimates.get((name, split, key))
        cache_key = (name, split, key)
        if cache_key not in self._group_cache:
            have = [m for m in self.members(name) if metric_value(self.data.runs[m], split, key) is not None]
            ests = [self._estimates.get((m, split, key)) for m in have]
            est = None
            if ests and all(e is not None for e in ests) and len({e.basis for e in ests}) == 1:
                est = stats.seed_mean(ests, name, self.seed)
            self._group_cache[cache_key] = est
        return self._group_cache[cache_key]

    def interval(self, name: str, split: str, key: str) -> stats.Interval | None:
        est = self.estimate(name, split, key)
        return est.interval(self.confidence) if est is not None else None

    def difference(self, a: str, b: str, split: str, key: str) -> stats.Estimate | None:
        """a - b, paired over the examples; None when either has no estimate; a MinBertError when
        they were scored on different examples."""
        ea, eb = self.estimate(a, split, key), self.estimate(b, split, key)
        if ea is None or eb is None:
            return None
        return ea.minus(eb)
