"""Settings a params file sets that no job reads: said at load, one line each.

A setting is unread when the jobs' settings (minbert.params.resolve: what each stage reads, with
a value the run never reads under the others put back to its default) come out the same with the
setting and without it. So the test is the resolver itself, whatever makes a setting unread: a
switched-off feature's settings, the encoder's learning rate with the encoder frozen, head
retraining's settings while it is off, `model` beside a `pretrain`, a pretraining kind's section
under another kind. The resolver's reasons (`unread_finetune`, `unread_pretraining`) say why
where they know; a line names the key, its value and what to do. Cosmetic keys (descriptions,
the report's) are read by the report and never unread.
"""
from __future__ import annotations

import copy
from typing import Any

from pydantic import ValidationError

from minbert.core.errors import MinBertError
from minbert.params import resolve as S
from minbert.params.catalogue import LoadedParams, seeds_of
from minbert.params.load import read_yaml
from minbert.params.schema import CATALOGUE_SECTIONS, ExperimentParams, PretrainParams, TrainingSettings, deep_merge


def _leaves(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Every key path of a mapping down to a value that is not a mapping (a list is a value)."""
    if not isinstance(d, dict):
        return [(prefix, d)]
    out = []
    for k, v in d.items():
        out += _leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [(f"{prefix}{k}", v)]
    return out


def _without(d: dict, path: str) -> dict:
    out = copy.deepcopy(d)
    *parents, last = path.split(".")
    node = out
    for p in parents:
        node = node[p]
    del node[last]
    return out


def _experiment_reads(exp: ExperimentParams) -> tuple:
    """What the jobs of one experiment read of its settings (its seeds too; an export reads what its
    fine-tune and predictions do, and the description), and what the report shows of it (its
    description)."""
    rh = S.retrain_settings(exp).model_dump() if exp.retrain_heads.enabled else None
    return (exp.template, seeds_of(exp), exp.description, S.finetune_settings(exp).model_dump(), rh,
            S.predict_settings(exp).model_dump())


def _base_reads(base: dict, pretrainings: dict[str, PretrainParams]) -> tuple | None:
    """What the pretrainings and the teachers read of `base`."""
    try:
        b = ExperimentParams.model_validate(base)
    except (ValidationError, MinBertError):
        return None
    return (TrainingSettings.keys_of(b),) + tuple(S.pretraining_from(p, b).model_dump() for p in pretrainings.values())


def _resolved(base: dict, overrides: dict, name: str) -> ExperimentParams | None:
    try:
        return ExperimentParams.model_validate(deep_merge(base or {}, overrides or {}))
    except (ValidationError, MinBertError):
        return None


def _value(exp: ExperimentParams | None, key: str):
    """The value at a key path of a resolved experiment (its settings as validated)."""
    node: Any = exp.model_dump() if exp is not None else None
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


_MISSING = object()


def _reason(key: str, exp: ExperimentParams | None) -> str:
    """Why the resolver left `key` (a key of an experiment, from its top) unread, where it knows."""
    if exp is None:
        return ""
    if key.startswith("finetune."):
        added = (exp.retrain_heads.tasks or []) if exp.retrain_heads.enabled else []
        for k, (_, why) in S.unread_finetune(exp.finetune, exp.finetune.tasks + added).items():
            if key[len("finetune."):] == k or key[len("finetune."):].startswith(k + "."):
                return why
    if key.startswith("retrain_heads.") and not exp.retrain_heads.enabled:
        return "head retraining is off (`retrain_heads.enabled` is false)"
    if key == "model" and exp.pretrain:
        return f"the experiment starts from pretraining `{exp.pretrain}`, whose own `model` it starts from"
    return ""


def _experiment_lines(where: str, raw: dict, raw_base: dict, names: list[str], as_is: dict) -> list[str]:
    """The experiments' own settings no job of theirs reads; a scale's keys (set in every experiment)
    said once, under the scale, where no experiment reads them."""
    lines: list[str] = []
    scale_name, scale_keys = _scale_keys(raw)
    unread_by: dict[str, list] = {k: [] for k in scale_keys}      # a scale's key -> the experiments that skip it
    for name in names:
        if as_is[name] is None or as_is[name][0]:            # invalid (said elsewhere) or a grid's template
            continue
        exp = _resolved(raw_base, raw["experiments"][name], name)
        for key, value in _leaves(raw["experiments"][name]):
            if key in ("description", "template"):
                continue
            fallback = _resolved(raw_base, _without(raw["experiments"][name], key), name)
            if fallback is None or _value(fallback, key) == _value(exp, key):
                continue                # the value it would have anyway: redundant, not unread
            if _experiment_reads(fallback) == as_is[name]:
                why = _reason(key, exp)
                if key in scale_keys:     # the scale's, for every experiment: said once, if none reads it
                    unread_by[key].append((name, value, why))
                    continue
                lines.append(_line(where, f"experiments.{name}.{key}", value, why or f"no job of {name} reads it"))
    judged = [n for n in names if as_is[n] is not None and not as_is[n][0]]
    for key, skipped in unread_by.items():
        if skipped and len(skipped) == len(judged):
            whys = {why for _, _, why in skipped}
            lines.append(_line(where, f"scales.{scale_name}.experiments.{key}", skipped[0][1],
                               whys.pop() if len(whys) == 1 and "" not in whys else "no experiment reads it"))
    return lines


def unread_settings(lp: LoadedParams) -> list[str]:
    """One line for each setting of the experiments, `base` and the pretrainings that no job reads
    (every task, head and loss looked up in the params' own registry)."""
    with lp.registry.active():
        return _unread_settings(lp)


def _unread_settings(lp: LoadedParams) -> list[str]:
    where = str(lp.source or lp.path or "params.yaml")
    raw = lp.raw if isinstance(lp.raw, dict) else {}
    raw_base = raw.get("base") or {}
    names = [n for n, ov in (raw.get("experiments") or {}).items() if isinstance(ov, dict)]
    lines: list[str] = []

    def reads_of(base: dict, name: str, overrides: dict):
        exp = _resolved(base, overrides, name)
        return None if exp is None else _experiment_reads(exp)

    as_is = {n: reads_of(raw_base, n, raw["experiments"][n]) for n in names}
    scale_keys = _scale_keys(raw)[1]
    lines += _experiment_lines(where, raw, raw_base, names, as_is)
    used_by_base = [n for n in names if as_is[n] is not None and not as_is[n][0]]
    base_as_is = _base_reads(raw_base, lp.params.pretrainings)
    for key, value in _leaves(raw_base):
        if not used_by_base or base_as_is is None:
            break
        if key in scale_keys:           # the chosen scale sets it in every experiment; another scale reads it
            continue
        if key == "description" or _value(_resolved(_without(raw_base, key), {}, "base"), key) == \
                _value(_resolved(raw_base, {}, "base"), key):
            continue
        if _base_reads(_without(raw_base, key), lp.params.pretrainings) == base_as_is and \
                all(reads_of(_without(raw_base, key), n, raw["experiments"][n]) == as_is[n] for n in used_by_base):
            reasons = {_reason(key, _resolved(raw_base, raw["experiments"][n], n)) for n in used_by_base}
            why = reasons.pop() if len(reasons) == 1 and "" not in reasons else "no experiment reads it"
            lines.append(_line(where, f"base.{key}", value, why))
    for name, pre in (raw.get("pretrainings") or {}).items():
        if not isinstance(pre, dict):
            continue
        try:
            parsed = PretrainParams.model_validate(pre)
        except ValidationError:
            continue
        reasons = S.unread_pretraining(parsed)
        for key, value in _leaves(pre):
            top = key.split(".")[0]
            if top in reasons:
                lines.append(_line(where, f"pretrainings.{name}.{key}", value, reasons[top][1]))
    return _sections_beside_a_catalogue(lp) + lines


def _scale_keys(raw: dict) -> tuple[str | None, set[str]]:
    """The chosen scale (minbert.params.scales) and the experiment keys it sets in every experiment:
    a key one experiment skips (a frozen row's encoder lr) is read by others, so it is judged over
    them all, not experiment by experiment."""
    scales, name = raw.get("scales"), raw.get("scale")
    scale = scales.get(name) if isinstance(scales, dict) and isinstance(name, str) else None
    over = scale.get("experiments") if isinstance(scale, dict) else None
    return (name, {k for k, _ in _leaves(over)}) if isinstance(over, dict) and over else (None, set())


def _sections_beside_a_catalogue(lp: LoadedParams) -> list[str]:
    """params.yaml's own sections while `catalogue: NAME` takes them from params/NAME.yaml (what
    `dvc exp run -S experiments...` writes there, for one)."""
    if lp.path is None or lp.source is None or lp.source == lp.path:
        return []
    own = read_yaml(lp.path)
    return [f"{lp.path}: key '{k}' is never read: `catalogue: {own.get('catalogue')}` takes that section from "
            f"{lp.source}; set it there (dvc exp run -S '{lp.source}:{k}...')" for k in CATALOGUE_SECTIONS
            if isinstance(own, dict) and k in own]


def _line(where: str, key: str, value, why: str) -> str:
    shown = repr(value) if not isinstance(value, (int, float)) or isinstance(value, bool) else f"{value:g}"
    return f"{where}: key '{key}' ({shown}) is never read: {why}; remove it, or change what leaves it unread"
