"""A catalogue's experiments as they run: study grids become experiments, repeated experiments
become one experiment per seed, and the names that stand for several runs (an ensemble's or an
export's repeated experiment, a paper row's `best_of` study) are replaced by those runs.

The expansion builds new objects and leaves the parsed params as they were; it refuses only what
it cannot build (a grid over an unknown experiment, a generated name that is taken or not a valid
file name). The cross-section checks of the result are minbert.params.validate's.
"""
from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from minbert.core.errors import MinBertError
from minbert.params.fields import check_name
from minbert.params.messages import close
from minbert.params.plateau import evaluations_needed, with_check_rule
from minbert.params.schema import EnsembleParams, ExperimentParams, PretrainParams, deep_merge, resolve_experiment
from minbert.params.studies import Params, StudyParams


def seeds_of(exp: ExperimentParams, study_repeats: int | None = None) -> list[int] | None:
    """The seeds of a repeated experiment (its own `repeats`, else its studies'); None when it runs once."""
    rep = exp.repeats if exp.repeats != 1 else (study_repeats or 1)
    if isinstance(rep, list):
        return list(dict.fromkeys(rep))
    return [exp.seed + k for k in range(rep)] if rep > 1 else None


def seed_name(name: str, seed: int) -> str:
    return f"{name}.seed{seed}"


def _value_name(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    return f"{v:g}" if isinstance(v, float) else str(v)


def _nested(key: str, value) -> dict:
    out: Any = value
    for part in reversed(key.split(".")):
        out = {part: out}
    return out


def grid_cells(study: StudyParams) -> list[tuple[str, dict[str, Any]]]:
    """A grid's cells: (experiment name, {axis name: value}), the first axis varying slowest."""
    axes = study.grid.axes
    return [(study.name + "".join(f".{a.name}{_value_name(v)}" for a, v in zip(axes, values)),
             {a.name: v for a, v in zip(axes, values)}) for values in itertools.product(*(a.values for a in axes))]


def expand_grids(params: Params, where: str) -> tuple[dict[str, dict], list[list[str]], dict[str, list]]:
    """Every grid cell as an experiment (the grid's experiment with the cell's settings) and as a
    row of its study: (experiments with the cells added, each study's rows, {study: its cells})."""
    experiments = dict(params.experiments)
    rows = [list(st.experiments) for st in params.studies]
    grids = {}
    for i, st in enumerate(params.studies):
        if st.grid is None or st.left_out:        # a table left out makes no cells
            continue
        template = st.grid.experiment
        if template not in params.experiments:
            raise MinBertError(f"{where}: key 'studies[{i}].grid.experiment' (study '{st.name}'): unknown experiment "
                               f"'{template}'{close(template, params.experiments)}")
        cells = grid_cells(st)
        labels = [a.name for a in st.grid.axes]
        if len(set(labels)) != len(labels):
            raise MinBertError(f"{where}: key 'studies[{i}].grid.axes' (study '{st.name}'): two axes are named "
                               f"'{labels[0]}'; give them labels")
        for name, values in cells:
            check_name(name, where, f"grid cell (study '{st.name}')")
            if name in experiments:
                raise MinBertError(f"{where}: key 'studies[{i}].grid' (study '{st.name}'): its cell '{name}' is also "
                                   f"an experiment of params.yaml; rename one of them")
            overrides = copy.deepcopy(params.experiments[template] or {})
            for axis in st.grid.axes:
                overrides = deep_merge(overrides, _nested(axis.key, values[axis.name]))
            what = ", ".join(f"{k} {_value_name(v)}" for k, v in values.items())
            overrides["description"] = f"{overrides.get('description') or template} ({what})"
            overrides["template"] = False
            experiments[name] = overrides
        rows[i] = rows[i] + [n for n, _ in cells if n not in rows[i]]
        grids[st.name] = cells
    return experiments, rows, grids


def names_of(study: StudyParams, rows: list[str]) -> set[str]:
    """Every experiment or ensemble a study names: its rows, its paper rows' runs and best-of's,
    its references and encoder-alone runs, its grid's experiment."""
    out = set(rows)
    if study.grid is not None:
        out.add(study.grid.experiment)
    if study.paper is not None:
        out.update(x for r in study.paper.rows for x in ([r.run] if r.run else r.best_of))
        out.update([study.paper.reference_run, *study.paper.encoder_alone] if study.paper.reference_run
                   else study.paper.encoder_alone)
    return out


def drop_left_out(params: Params, experiments: dict[str, dict], rows: list[list[str]]) -> tuple[dict, set[str]]:
    """The experiments and ensembles that run, once the tables left out (`left_out`) are: what only
    such tables name (their rows, their ensembles and those ensembles' members) is dropped; what a
    table that runs, an ensemble that runs or no table at all names stays. Returns (the experiments
    kept, the names of the ensembles kept)."""
    left = [names_of(st, r) for st, r in zip(params.studies, rows) if st.left_out]
    if not left:
        return experiments, set(params.ensembles)
    kept_names = set().union(*(names_of(st, r) for st, r in zip(params.studies, rows) if not st.left_out))
    named_left = set().union(*left)
    ensembles = {n for n in params.ensembles if n not in named_left or n in kept_names}
    kept_names |= {m for n in ensembles for m in params.ensembles[n].members}
    named_left |= {m for n in set(params.ensembles) - ensembles for m in params.ensembles[n].members}
    return {n: e for n, e in experiments.items() if n not in named_left or n in kept_names}, ensembles


def expand_seeds(params: Params, experiments_raw: dict[str, dict], rows: list[list[str]],
                 where: str) -> tuple[dict[str, ExperimentParams], dict[str, list[str]], dict[str, ExperimentParams]]:
    """Each experiment resolved (base deep-merged with its overrides), a repeated one (its `repeats`,
    or its studies') as one experiment per seed: (experiments that run, {repeated experiment: its
    seeds' experiments}, the templates, which do not run)."""
    study_repeats: dict[str, int] = {}
    for st, study_rows in zip(params.studies, rows):
        paper_runs = [x for r in st.paper.rows for x in ([r.run] if r.run else r.best_of)] if st.paper else []
        for e in [*study_rows, *paper_runs] if st.repeats else ():
            study_repeats[e] = max(study_repeats.get(e, 1), st.repeats)
    experiments, groups, templates = {}, {}, {}
    for name, ov in experiments_raw.items():
        check_name(name, where, "experiment")
        if ov is None:
            ov = {}
        if not isinstance(ov, dict):
            raise MinBertError(f"{where}: key 'experiments.{name}': expected a mapping of overrides")
        exp = with_stop_rule(resolve_experiment(params.base, ov, name, where), params, f"experiments.{name}", where)
        if exp.template:
            templates[name] = exp
            continue
        seeds = seeds_of(exp, study_repeats.get(name))
        if seeds is None:
            experiments[name] = exp
            continue
        groups[name] = []
        for seed in seeds:
            member = seed_name(name, seed)
            check_name(member, where, "experiment")
            if member in experiments_raw:
                raise MinBertError(f"{where}: key 'experiments.{name}.repeats': seed {seed} would be experiment "
                                   f"'{member}', which params.yaml already defines; rename one of them")
            experiments[member] = exp.model_copy(update={"seed": seed, "repeats": 1})
            groups[name].append(member)
    return experiments, groups, templates


def with_stop_rule(exp: ExperimentParams, params: Params, key: str, where: str) -> ExperimentParams:
    """`exp` whose fine-tuning stops at its plateau with the rule's unset keys taken from the report's
    training check (minbert.params.plateau.with_check_rule); a cap that gives a phase fewer dev
    evaluations than the rule needs is refused. `key`: where `exp` is written (for the error)."""
    ft = exp.finetune
    if not ft.until_plateau.enabled:
        return exp
    at = f"{where}: key '{key}.finetune.until_plateau'"
    try:
        rule = with_check_rule(ft.until_plateau, params.report.training_check)
    except ValidationError as err:
        raise MinBertError(f"{at}: {err.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    need, have = evaluations_needed(rule), ft.epochs * ft.evals_per_epoch
    if have < need:
        raise MinBertError(f"{at}: its cap gives a phase {have} dev evaluations (epochs {ft.epochs} x evals_per_epoch "
                           f"{ft.evals_per_epoch}), fewer than the {need} a phase needs before the plateau rule can "
                           f"read it flat (min_evaluations, and window_evaluations in its last window); raise "
                           f"finetune.epochs (the cap) or finetune.evals_per_epoch")
    return exp.model_copy(update={"finetune": ft.model_copy(update={"until_plateau": rule})})


def expand(params: Params, raw: Any, where: str = "params.yaml") -> LoadedParams:
    """The catalogue as it runs (new objects; `params` is left as it was): grid cells added to the
    experiments and their studies' rows, repeated experiments as their seeds (also in ensembles and
    exports), a paper row's `run` added to its study's rows and a `best_of` that names a study (and
    no run) replaced by that study's rows, as they were before any paper row was added."""
    experiments_raw, rows, grids = expand_grids(params, where)
    experiments_raw, ensembles_kept = drop_left_out(params, experiments_raw, rows)
    experiments, groups, templates = expand_seeds(params, experiments_raw, rows, where)
    runnable = set(experiments) | set(groups) | set(params.ensembles)

    def seeds(names):
        return [x for m in names for x in groups.get(m, [m])]

    ensembles = {n: e.model_copy(update={"members": seeds(e.members)}) for n, e in params.ensembles.items()
                 if n in ensembles_kept}
    export = params.export.model_copy(update={"experiments": list(dict.fromkeys(seeds(params.export.experiments)))})
    rows_of = {st.name: study_rows for st, study_rows in zip(params.studies, rows)}
    studies = []
    for st, study_rows in zip(params.studies, rows):
        study_rows, paper = list(study_rows), st.paper
        if st.left_out:                       # shown with the paper's values alone: no row of it runs here
            studies.append(st.model_copy(update={"experiments": [], "baseline": None}))
            continue
        if paper is not None:
            paper_rows = []
            for row in paper.rows:
                if row.run is not None:
                    if row.run not in study_rows:
                        study_rows.append(row.run)
                    paper_rows.append(row)
                    continue
                names = []
                for name in row.best_of:
                    names += rows_of[name] if name in rows_of and name not in runnable else [name]
                paper_rows.append(row.model_copy(update={"best_of": list(dict.fromkeys(names))}))
            paper = paper.model_copy(update={"rows": paper_rows})
        studies.append(st.model_copy(update={"experiments": study_rows, "paper": paper}))
    base = with_stop_rule(params.base, params, "base", where)
    expanded = params.model_copy(update={"experiments": experiments_raw, "ensembles": ensembles, "export": export,
                                         "studies": studies, "base": base})
    return LoadedParams(params=expanded, experiments=experiments, raw=raw, groups=groups, grids=grids,
                        templates=templates)


class LoadedParams:
    """Validated params with each experiment resolved (base deep-merged with its overrides)."""

    def __init__(self, params: Params, experiments: dict[str, ExperimentParams], raw: dict,
                 groups: dict[str, list[str]] | None = None, grids: dict[str, list] | None = None,
                 templates: dict[str, ExperimentParams] | None = None):
        self.params = params
        self.experiments = experiments      # every experiment that runs (a repeated one as its seeds)
        self.raw = raw
        self.groups = groups or {}          # repeated experiment -> its seeds' experiments
        self.grids = grids or {}            # study -> its grid's cells: [(experiment, {axis: value})]
        self.templates = templates or {}    # the experiments that are only a grid's base, resolved
        self.path: Path | None = None     # params.yaml as given to load_params
        self.source: Path | None = None   # the file the sections come from (params.yaml or a catalogue)
        self.transcribed: list[Path] = []  # the catalogues its paper tables are transcribed in (`transcribed_in`)

    @property
    def registry(self):
        """The tasks, losses and heads these params know (minbert.core.registry): the built-in ones and
        those of their `tasks` and `modules`; what works from these params makes it active."""
        return self.params.registry

    def experiment(self, name: str) -> ExperimentParams:
        if name in self.groups:
            raise MinBertError(f"params.yaml: experiment '{name}' runs as {len(self.groups[name])} seeds; name one "
                               f"of them ({', '.join(self.groups[name])})")
        if name not in self.experiments:
            raise MinBertError(f"params.yaml: unknown experiment '{name}'{close(name, self.experiments)}")
        return self.experiments[name]

    def pretraining(self, name: str) -> PretrainParams:
        if name not in self.params.pretrainings:
            raise MinBertError(f"params.yaml: unknown pretraining '{name}'{close(name, self.params.pretrainings)}")
        return self.params.pretrainings[name]

    def ensemble(self, name: str) -> EnsembleParams:
        if name not in self.params.ensembles:
            raise MinBertError(f"params.yaml: unknown ensemble '{name}'{close(name, self.params.ensembles)}")
        return self.params.ensembles[name]

    @property
    def base(self) -> ExperimentParams:
        """`base` on its own, with the defaults filled in."""
        return self.params.base

    def overrides(self, name: str) -> dict:
        """The parameters of experiment `name` that differ from the base (for the report)."""
        return _diff(self.base.model_dump(), self.experiment(name).model_dump())


def _diff(a: dict, b: dict, prefix: str = "") -> dict:
    out = {}
    for k in b:
        if isinstance(b[k], dict) and isinstance(a.get(k), dict):
            out.update(_diff(a[k], b[k], f"{prefix}{k}."))
        elif a.get(k) != b[k]:
            out[f"{prefix}{k}"] = b[k]
    return out
