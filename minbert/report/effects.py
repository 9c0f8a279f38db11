"""How much of a claim's effect the method made, read against the encoder alone (docs/report.md,
"The encoder alone"), and which frozen run may answer a claim for a row still rising (the training
check's references, minbert.report.training).

The encoder alone, for a row, is its heads trained over the untouched encoder: the row itself where
it freezes its encoder (and starts from the model as it is), else a run that freezes the encoder with
exactly the row's heads and no pretraining: first one the table declares (its rows, `reference_run`,
`encoder_alone`), then any experiment of the catalogue. Where our effect is `encoder_alone_ratio`
times the paper's or more, the claim shows the same difference between the two rows' encoder-alone
runs: what the packaged encoder gives those heads before the method trains anything.
"""
from __future__ import annotations

from dataclasses import dataclass

from minbert.core.errors import MinBertError
from minbert.report.scores import ScoreBook
from minbert.scoring import stats


@dataclass
class EncoderAlone:
    """A claim's difference between its two rows' encoder-alone runs, beside ours."""
    better: str | None                          # the encoder-alone run of each row (None: none here)
    worse: str | None
    difference: float | None = None             # better's − worse's on the claim's column
    interval: stats.Interval | None = None
    made: float | None = None                   # ours − the encoder alone's: what the method made
    note: str = ""                              # how the runs were found, or why there is none


def _experiment(name: str, book: ScoreBook):
    """The settings of a run or of a repeated experiment's first seed (None for an ensemble)."""
    experiments = book.data.params.experiments
    return next((experiments[m] for m in book.members(name) if m in experiments), None)


def heads_key(name: str, book: ScoreBook) -> str | None:
    exp = _experiment(name, book)
    return None if exp is None else repr(exp.finetune.heads.model_dump(mode="json"))


def frozen(name: str, book: ScoreBook) -> bool:
    """Every run of `name` trains its heads over the encoder as the model gives it (frozen, no
    pretraining)."""
    experiments = book.data.params.experiments
    runs = [m for m in book.members(name) if m in experiments]
    return bool(runs) and all(experiments[r].finetune.freeze_encoder and not experiments[r].pretrain for r in runs)


def table_frozen_runs(sp, chosen: dict, book: ScoreBook) -> list[str]:
    """The frozen runs a paper table declares: its rows' that freeze the encoder, its
    `reference_run`, its `encoder_alone` runs."""
    named = [r for r in chosen.values() if r] + ([sp.reference_run] if sp.reference_run else []) + \
        list(sp.encoder_alone)
    return [r for r in dict.fromkeys(named) if frozen(r, book)]


def encoder_alone_run(name: str | None, declared: list[str], book: ScoreBook) -> tuple[str | None, str]:
    """(the run that is `name`'s heads over the untouched encoder, how it was found)."""
    if name is None:
        return None, ""
    if frozen(name, book):
        return name, f"{name} itself (its encoder frozen)"
    heads = heads_key(name, book)
    if heads is None:
        return None, f"{name} is an ensemble"
    others = [n for n in book.data.params.experiments if n not in declared]
    found = next((r for r in declared + others if frozen(r, book) and heads_key(r, book) == heads), None)
    return (found, f"{found} ({name}'s heads over the frozen encoder)") if found else \
        (None, f"no run here trains {name}'s heads over the frozen encoder (declare one: paper.encoder_alone)")


def encoder_alone(view, declared: list[str], ratio: float, book: ScoreBook, key: str) -> EncoderAlone | None:
    """The encoder alone beside a difference claim whose effect here is `ratio` times the paper's or
    more (None otherwise)."""
    if view.kind != "difference" or view.paper_difference is None or view.difference is None:
        return None
    if abs(view.difference) < ratio * abs(view.paper_difference):
        return None
    (better, how_b), (worse, how_w) = (encoder_alone_run(r, declared, book) for r in (view.better_run, view.worse_run))
    out = EncoderAlone(better, worse, note="; ".join(dict.fromkeys(h for h in (how_b, how_w) if h)))
    if better is None or worse is None:
        return out
    if better == worse:
        out.difference, out.made = 0.0, view.difference
        out.note = f"both rows have the heads of {better} over the frozen encoder: it gives them the same"
        return out
    values = [book.value(r, view.split, key) for r in (better, worse)]
    if any(v is None for v in values):
        out.note += "; no scores yet"
        return out
    out.difference = float(values[0] - values[1])
    out.made = view.difference - out.difference
    try:
        est = book.difference(better, worse, view.split, key)
    except MinBertError:
        est = None
    out.interval = est.interval(book.confidence) if est is not None else None
    return out


def references(sp, claim, chosen: dict, book: ScoreBook) -> dict[str, tuple[str, str]]:
    """row -> (frozen run, why) that may answer a difference `claim` for its better row (the claim's
    first) when that row is still rising (the training check): the claim's other row where it is
    frozen, or the table's own frozen reference where it has the row's heads (the row's win over it is
    its fine-tuning's). Only the better row: more training of it could only widen its lead, where more
    training of the worse row could close the gap; never on a claim of no effect or no gain, which a
    move either way could change."""
    first, second = (chosen.get(label) for label in claim.rows)
    if claim.kind != "difference" or not first or frozen(first, book):
        return {}
    if second and frozen(second, book):
        return {first: (second, "the claim's frozen row")}
    reference = chosen.get(sp.frozen_reference) if sp.frozen_reference else (sp.reference_run or None)
    if reference and reference != first and frozen(reference, book) and \
            heads_key(first, book) == heads_key(reference, book):
        return {first: (reference, "the table's frozen reference, with the same heads")}
    return {}
