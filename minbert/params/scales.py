"""A catalogue at one of its scales (`scales`, chosen by `scale`) and with one model (`model`, over
`base.model`): the rows, claims and declarations are written once, and the chosen model and scale
are merged over them before anything is parsed, so each job's description holds the settings it
really runs with and switching either re-runs exactly the jobs it changes. A scale's `differs` join
the papers' own, beside their tables; the model is compared with each paper's on the line under its
tables."""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from minbert.core.errors import MinBertError
from minbert.params.messages import close, raise_validation
from minbert.params.schema import deep_merge
from minbert.params.studies import ScaleParams


def chosen_scale(raw: dict, where: str) -> tuple[str, ScaleParams] | None:
    """(name, settings) of the scale `raw` runs at; None where it has no scales. A one-line error for a
    malformed scale, a scale without `scales`, or a name that is not one of them."""
    scales, name = raw.get("scales"), raw.get("scale")
    if not scales:
        if name is not None:
            raise MinBertError(f"{where}: key 'scale': '{name}' is set, but the catalogue has no 'scales'; remove it")
        return None
    if not isinstance(scales, dict):
        raise MinBertError(f"{where}: key 'scales': expected a mapping of scale names to their settings")
    if name is None:
        raise MinBertError(f"{where}: key 'scale': the catalogue runs at one of its scales ({', '.join(scales)}); "
                           f"set 'scale' to one of them")
    if not isinstance(name, str) or name not in scales:
        raise MinBertError(f"{where}: key 'scale': unknown scale {name!r}{close(str(name), list(scales))} "
                           f"(the catalogue's: {', '.join(map(str, scales))})")
    try:
        return name, ScaleParams.model_validate(scales[name] if scales[name] is not None else {})
    except ValidationError as err:
        raise_validation(err, ScaleParams, where, prefix=f"scales.{name}.")


def at_scale(raw: Any, where: str) -> Any:
    """`raw` (the params' YAML content, the catalogue's sections in place) with its chosen model and
    scale applied: `model` as `base.model`; `base` deep-merged with the scale's, the scale's
    `experiments` and `pretrainings` over each one's own settings (then its `frozen` over the
    experiments that freeze their encoder), its `repeats` on every study whose paper table has
    claims, its `named` settings over the rows they name, its `differs` added to each paper's. A new
    mapping; `raw` stays as it was. Sections of the wrong type are left for the schema to refuse."""
    if not isinstance(raw, dict):
        return raw
    if isinstance(raw.get("model"), str) and isinstance(raw.get("base", {}), dict):
        raw = {**raw, "base": {**(raw.get("base") or {}), "model": raw["model"]}}
    chosen = chosen_scale(raw, where)
    if chosen is None:
        return raw
    _, scale = chosen
    out = dict(raw)
    if isinstance(raw.get("base", {}), dict):
        out["base"] = deep_merge(raw.get("base") or {}, scale.base)
    for section, over in (("experiments", scale.experiments), ("pretrainings", scale.pretrainings)):
        if over and isinstance(raw.get(section), dict):
            out[section] = {k: deep_merge(v or {}, over) if isinstance(v, dict) or v is None else v
                            for k, v in raw[section].items()}
    if scale.frozen and isinstance(out.get("experiments"), dict):
        base = out.get("base") if isinstance(out.get("base"), dict) else {}
        out["experiments"] = {k: deep_merge(v, scale.frozen) if _frozen(v, base) else v
                              for k, v in out["experiments"].items()}
    if scale.repeats is not None and isinstance(raw.get("studies"), list):
        judged = _judged_studies(raw["studies"])
        out["studies"] = [{**st, "repeats": scale.repeats} if isinstance(st, dict) and st.get("name") in judged else st
                          for st in raw["studies"]]
    _apply_named(out, scale, where, chosen[0])
    if scale.differs and isinstance(raw.get("papers"), dict):
        out["papers"] = {pid: _with_differs(paper, str(pid), scale) for pid, paper in raw["papers"].items()}
    return out


def _apply_named(out: dict, scale: ScaleParams, where: str, name: str) -> None:
    """The scale's settings for single experiments, pretrainings and studies, deep-merged over each
    (in `out`, in place); a one-line error for a name the catalogue does not have."""
    for section, named in (("experiments", scale.named.experiments), ("pretrainings", scale.named.pretrainings)):
        have = out.get(section) if isinstance(out.get(section), dict) else {}
        for key, over in named.items():
            if key not in have:
                raise MinBertError(f"{where}: key 'scales.{name}.named.{section}.{key}': the catalogue has no "
                                   f"{section[:-1]} '{key}'{close(key, list(have))}")
            if have[key] is not None and not isinstance(have[key], dict):
                continue                                  # the schema refuses it, naming its key
            out[section] = {**out[section], key: deep_merge(have[key] or {}, over)}
            have = out[section]
    if scale.named.studies:
        studies = out.get("studies") if isinstance(out.get("studies"), list) else []
        names = [st.get("name") for st in studies if isinstance(st, dict)]
        for key, over in scale.named.studies.items():
            if key not in names:
                raise MinBertError(f"{where}: key 'scales.{name}.named.studies.{key}': the catalogue has no study "
                                   f"'{key}'{close(key, [n for n in names if isinstance(n, str)])}")
        out["studies"] = [deep_merge(st, scale.named.studies[st["name"]])
                          if isinstance(st, dict) and st.get("name") in scale.named.studies else st for st in studies]


def _frozen(exp, base: dict) -> bool:
    """An experiment's raw settings freeze its encoder (its own `finetune.freeze_encoder`, or the base's)."""
    if not isinstance(exp, dict):
        return False
    for where in (exp, base):
        ft = where.get("finetune")
        if isinstance(ft, dict) and "freeze_encoder" in ft:
            return ft["freeze_encoder"] is True
    return False


def _judged_studies(studies: list) -> set:
    """The studies whose rows a claim compares: those whose paper table has claims, and the studies a
    row of such a table stands for the best of (`best_of`)."""
    out = set()
    for study in studies:
        paper = study.get("paper") if isinstance(study, dict) else None
        if isinstance(paper, dict) and paper.get("claims"):
            out.add(study.get("name"))
            for row in paper.get("rows") or []:
                best = row.get("best_of") if isinstance(row, dict) else None
                out.update(b for b in best if isinstance(b, str)) if isinstance(best, list) else None
    return out


def _with_differs(paper, pid: str, scale: ScaleParams):
    if not isinstance(paper, dict) or not isinstance(paper.get("differs", []), list):
        return paper
    added = [d.model_dump(exclude={"papers"}, exclude_defaults=True) for d in scale.differs
             if not d.papers or pid in d.papers]
    return {**paper, "differs": list(paper.get("differs") or []) + added}
