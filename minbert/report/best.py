"""Which is best, said only as far as the numbers carry it: the best cell of a column (marked only
when significantly better than the second), the best of a list of runs (an ensemble's reference
member, a paper row's `best_of`), and the page's best model.

Every choice goes by the dev selection score (`dev_score`), and a repeated experiment competes as
the mean of its seeds, never as its luckiest seed: picking the best of several seeds on the same dev
data reports that seed's luck as the model's quality.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minbert.core.errors import MinBertError
from minbert.core.metrics import selection_score
from minbert.core.tasks import LEADERBOARD_TASKS
from minbert.report.data import ReportData
from minbert.report.formats import fmt_delta, fmt_interval, fmt_metric
from minbert.report.scores import ScoreBook
from minbert.scoring import stats


def best_verdict(candidates: list[tuple[str, float | None]], split: str, key: str, book: ScoreBook,
                 unpaired: set) -> tuple[str | None, bool, str]:
    """(the highest-scoring name, whether it is significantly better than the second, why) over
    (name, value) pairs; (None, False, "") with fewer than two values. The one best-mark rule of
    the study tables, the grids and the best model; a pair scored on different examples goes
    into `unpaired`."""
    ranked = sorted(((n, v) for n, v in candidates if v is not None), key=lambda nv: -nv[1])  # stable: ties keep order
    if len(ranked) < 2:
        return None, False, ""
    (best, value), (second, second_value) = ranked[0], ranked[1]
    if value == second_value:
        return best, False, f"tied with {second}"
    try:
        diff = book.difference(best, second, split, key)
    except MinBertError:
        unpaired.add((best, second))
        return best, False, ""
    if diff is None:
        return best, False, f"highest; no predictions to test it against {second}"
    iv = diff.interval(book.confidence)
    verdict = "significantly" if iv.low > 0 else "not significantly"
    return best, iv.low > 0, (f"highest, {verdict} better than {second}: {fmt_delta(diff.value)} "
                              f"{fmt_interval(iv, signed=True)}")


def run_score(metrics: dict) -> float | None:
    """A run's dev selection score (minbert.core.metrics.selection_score) from its dev metrics: the
    overall score when it has the three leaderboard tasks, else the mean of the task scores it has
    (each on a 0-1 scale); None when one is undefined."""
    score = selection_score(metrics, LEADERBOARD_TASKS)
    return score if score is not None else selection_score(metrics)


def member_scores(name: str, book: ScoreBook) -> list[tuple[str, float | None]]:
    """(run, its dev selection score) for each run of a name with results: the run itself, or each
    seed of a repeated experiment that has finished."""
    runs = book.data.runs
    return [(m, run_score(runs[m].split_metrics("dev"))) for m in book.members(name) if runs[m].metrics is not None]


def dev_score(name: str, book: ScoreBook) -> float | None:
    """The dev selection score of a run (`run_score`) or of a repeated experiment: the mean of its
    seeds' scores over the seeds with results, None when one of them is undefined."""
    scores = [s for _, s in member_scores(name, book)]
    if not scores or any(s is None for s in scores):
        return None
    return float(np.mean(scores))


def _rank_key(name: str, book: ScoreBook) -> tuple[bool, float] | None:
    """How names compare: one with an overall score beats one without, then the higher score."""
    score = dev_score(name, book)
    return None if score is None else (book.value(name, "dev", "overall") is not None, score)


def best_of(names, book: ScoreBook) -> str | None:
    """The name (a run or a repeated experiment) with the highest dev selection score; one with
    an overall score beats one without; ties go to the first listed."""
    best, best_key = None, None
    for name in names:
        key = _rank_key(name, book)
        if key is not None and (best_key is None or key > best_key):
            best, best_key = name, key
    return best


@dataclass
class BestModel:
    name: str                                   # an experiment, or a repeated experiment (its seeds' mean)
    score: float                                # its dev selection score
    has_overall: bool                           # the score is the overall score (else the mean of its task scores)
    interval: stats.Interval | None             # of the overall score
    compared: str                               # what was compared, as the page says it
    verdict: str                                # the best against the runner-up ("" alone)
    shown: str                                  # the run whose error analysis the page shows
    shown_because: str = ""                     # why that run (a repeated experiment's: its typical seed)
    seeds: int = 1                              # seeds averaged in `score`

    @property
    def repeated(self) -> bool:
        """A repeated experiment: it has no page of its own, its seeds do."""
        return self.shown != self.name


def candidates(data: ReportData) -> list[str]:
    """What competes for the best model: each experiment, a repeated experiment once (as its group),
    in the order of the params; ensembles are compared with their members in their own tables."""
    group_of = {seed: group for group, seeds in data.params.groups.items() for seed in seeds}
    return list(dict.fromkeys(group_of.get(name, name) for name in data.params.experiments))


def _compared(names: list[str], book: ScoreBook, has_overall: bool) -> str:
    """What the choice compared, in words: how many experiments, how many repeated ones (by the mean
    of how many seeds), on which score."""
    groups = [n for n in names if book.is_group(n)]
    singles = len(names) - len(groups)
    parts = [f"{singles} experiment{'s' if singles != 1 else ''}"] if singles else []
    if groups:
        seeds = sorted({len(member_scores(g, book)) for g in groups})
        parts.append(f"{len(groups)} repeated experiment{'s' if len(groups) != 1 else ''} by the mean of "
                     f"{'its' if len(groups) == 1 else 'their'} {'/'.join(map(str, seeds))} seeds, never "
                     f"the luckiest seed")
    what = "overall score" if has_overall else "mean of the task scores"
    return f"the dev {what} of {' and '.join(parts)}"


def typical_seed(name: str, book: ScoreBook) -> tuple[str, str]:
    """The seed of a repeated experiment whose dev score is closest to its seeds' mean (ties: the
    first), and why the page shows it."""
    mean, scored = dev_score(name, book), member_scores(name, book)
    seed, score = min(scored, key=lambda ms: abs(ms[1] - mean))
    return seed, (f"{seed}, the seed whose dev score ({fmt_metric(score)}) is closest to the mean of the "
                  f"{len(scored)} seeds ({fmt_metric(mean)}): a typical seed, not the luckiest")


def best_model(data: ReportData, book: ScoreBook) -> BestModel | None:
    """The best model of the page: among `candidates`, the highest dev selection score (a repeated
    experiment by its seeds' mean), with what was compared and how sure the choice is; None
    before any candidate has a score."""
    names = [n for n in candidates(data) if dev_score(n, book) is not None]
    best = best_of(names, book)
    if best is None:
        return None
    has_overall = book.value(best, "dev", "overall") is not None
    compared = [n for n in names if (book.value(n, "dev", "overall") is not None) == has_overall]
    below = len(names) - len(compared)      # with an overall score to compare, a run without one ranks below
    verdict = ""
    if has_overall:
        unpaired: set = set()
        _, _, verdict = best_verdict([(n, book.value(n, "dev", "overall")) for n in compared], "dev", "overall",
                                     book, unpaired)
        if unpaired:
            verdict = f"scored on other examples than {next(iter(unpaired))[1]}: the difference is not tested"
    shown, because = typical_seed(best, book) if book.is_group(best) else (best, "")
    return BestModel(best, dev_score(best, book), has_overall, book.interval(best, "dev", "overall"),
                     _compared(compared, book, has_overall) + (f"; {below} that do not train the three tasks rank "
                                                               f"below" if below else ""),
                     verdict, shown, because, len(member_scores(best, book)))
