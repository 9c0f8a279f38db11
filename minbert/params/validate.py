"""Checks across sections of params: settings that validate one by one (minbert.params.schema) but
cannot run together, and names one section gives that another must know.

Every check is pure: it reads the expanded params (minbert.params.catalogue.expand: grid cells
added, repeated experiments as their seeds) and reports the first problem as a one-line
MinBertError naming the file and the key; it changes nothing. What an earlier version filled in
while checking is done by the expansion: an ensemble's and an export's repeated experiments
become their seeds, a paper row's `run` joins its study's rows and a `best_of` that names a study
becomes that study's rows (catalogue.expand), and a grid's cells join the experiments and their
study's rows (catalogue.expand_grids).
"""
from __future__ import annotations

from pydantic import ValidationError

from minbert.core.errors import MinBertError
from minbert.core.nli_data import NLI_DATA
from minbert.params.fields import check_name
from minbert.params.finetune import FinetuneParams
from minbert.params.messages import close, raise_validation
from minbert.params.schema import ExperimentParams, deep_merge
from minbert.params.studies import Params


def model_tasks(exp: ExperimentParams) -> list[str]:
    """Every task an experiment's final model has: the fine-tuned ones, then those head retraining adds."""
    extra = [t for t in (exp.retrain_heads.tasks or []) if t not in exp.finetune.tasks] \
        if exp.retrain_heads.enabled else []
    return list(exp.finetune.tasks) + extra


def shared_tasks(members: list[str], experiments: dict) -> set[str]:
    """The tasks every one of `members`' final models has (what a teacher of them can predict)."""
    return set.intersection(*(set(model_tasks(experiments[m])) for m in members))


def teacher_members(teacher: str, experiments: dict, groups: dict, ensembles: dict) -> list[str] | None:
    """The experiments whose models a teacher averages (None: no such experiment or ensemble)."""
    if teacher in experiments:
        return [teacher]
    if teacher in groups:
        return list(groups[teacher])
    if teacher in ensembles:
        return list(ensembles[teacher].members)
    return None


def check_params(params: Params, experiments: dict[str, ExperimentParams], groups: dict[str, list[str]],
                 where: str = "params.yaml", templates: dict[str, ExperimentParams] | None = None) -> None:
    """Every cross-section check of expanded params, in the order a reader meets the sections:
    `params` with its grid cells and seeds expanded, `experiments` every experiment that runs (a
    repeated one as its seeds), `groups` each repeated experiment's seeds, `templates` the resolved
    experiments that only a grid runs. Changes none of them."""
    check_experiments(params, {**(templates or {}), **experiments}, where)
    for kind, names in (("pretraining", params.pretrainings), ("ensemble", params.ensembles)):
        for name in names:
            check_name(name, where, kind)
    clash = set(params.ensembles) & (set(experiments) | set(groups))
    if clash:
        raise MinBertError(f"{where}: '{sorted(clash)[0]}' names both an experiment and an ensemble")
    check_ensembles(params, experiments, groups, where)
    check_combinations(params, experiments, where, groups)
    check_studies(params, experiments, groups, where)
    known = set(experiments) | set(groups)
    for name in params.export.experiments:
        if name not in known:
            raise MinBertError(f"{where}: key 'export.experiments': unknown experiment '{name}'{close(name, known)}")
    for i, st in enumerate(params.studies):
        if not st.experiments and not st.left_out:
            raise MinBertError(f"{where}: key 'studies[{i}]' (study '{st.name}'): no rows; list experiments, a grid "
                               f"or a paper table")


def check_experiments(params: Params, experiments: dict[str, ExperimentParams], where: str) -> None:
    """Each experiment (a grid's template included) names a known pretraining (what its own settings
    must agree on is its model's check: FinetuneParams', ExperimentParams')."""
    for name, exp in experiments.items():
        if exp.pretrain is not None and exp.pretrain not in params.pretrainings:
            raise MinBertError(f"{where}: key 'experiments.{name}.pretrain': unknown pretraining "
                               f"'{exp.pretrain}'{close(exp.pretrain, params.pretrainings)}")


def check_ensembles(params: Params, experiments: dict, groups: dict, where: str) -> None:
    """An ensemble's members are known experiments (a repeated one expanded to its seeds), two or more."""
    known = set(experiments) | set(groups)
    for ens_name, ens in params.ensembles.items():
        for m in ens.members:
            if m not in known:
                raise MinBertError(f"{where}: key 'ensembles.{ens_name}.members': unknown experiment "
                                   f"'{m}'{close(m, known)}")
        if len(ens.members) < 2:
            raise MinBertError(f"{where}: key 'ensembles.{ens_name}.members': an ensemble needs at least two "
                               f"members (got {ens.members})")


def check_studies(params: Params, experiments: dict, groups: dict, where: str) -> None:
    """The papers' tables name known papers and runs, and each study's rows and baseline exist."""
    runnable = set(experiments) | set(groups) | set(params.ensembles)
    check_papers(params, runnable, where, experiments, groups)
    seen_studies = set()
    for i, st in enumerate(params.studies):
        if st.name in seen_studies:
            raise MinBertError(f"{where}: key 'studies[{i}].name': study '{st.name}' is defined twice")
        seen_studies.add(st.name)
        for e in st.experiments:
            if e not in runnable:
                raise MinBertError(f"{where}: key 'studies[{i}].experiments' (study '{st.name}'): unknown "
                                   f"experiment '{e}'{close(e, runnable)}")
        if st.baseline is not None and st.baseline not in st.experiments:
            raise MinBertError(f"{where}: key 'studies[{i}].baseline' (study '{st.name}'): "
                               f"'{st.baseline}' is not one of the study's experiments")


def check_papers(params: Params, runnable: set, where: str, experiments: dict, groups: dict) -> None:
    """A study's paper table names a known paper, and its rows runs that exist (the expansion has
    put a `best_of` study's rows in its place; those rows are the studies' own to check)."""
    studies = {st.name for st in params.studies}
    rows = {e for st in params.studies for e in st.experiments}
    for i, st in enumerate(params.studies):
        if st.paper is None:
            continue
        key = f"studies[{i}].paper"
        if st.paper.id not in params.papers:
            raise MinBertError(f"{where}: key '{key}.id' (study '{st.name}'): unknown paper '{st.paper.id}'"
                               f"{close(st.paper.id, params.papers)}; describe it under 'papers'")
        if st.left_out:                 # shown with the paper's values alone: none of its rows runs
            continue
        for j, row in enumerate(st.paper.rows):
            if row.run is not None:
                if row.run not in runnable:
                    raise MinBertError(f"{where}: key '{key}.rows[{j}].run' (row '{row.label}'): unknown experiment "
                                       f"or ensemble '{row.run}'{close(row.run, runnable)}")
                continue
            for name in row.best_of:
                if name not in runnable and name not in rows:
                    raise MinBertError(f"{where}: key '{key}.rows[{j}].best_of' (row '{row.label}'): '{name}' is no "
                                       f"experiment, ensemble or study{close(name, runnable | studies)}")
        check_reference(st, runnable, f"{where}: key '{key}", experiments, groups)
        check_encoder_alone(st, runnable, f"{where}: key '{key}", experiments)
        check_test_claims(st, f"{where}: key '{key}", params, experiments, groups)
        check_distinct_claims(st, f"{where}: key '{key}", params, experiments, groups)


def row_runs(paper, label: str, params: Params, groups: dict) -> list[str]:
    """The experiments a paper row's figures come from: its run's, or every run it takes the best of
    (their studies already expanded into their rows), ensembles and repeated experiments expanded."""
    row = paper.row(label)
    runs = []
    for n in [row.run] if row.run is not None else list(row.best_of):
        members = params.ensembles[n].members if n in params.ensembles else [n]
        runs += [r for m in members for r in groups.get(m, [m])]
    return runs


def check_distinct_claims(st, where: str, params: Params, experiments: dict, groups: dict) -> None:
    """No run on one side of a claim trains exactly what a run on its other side trains (the settings
    as resolved, the description apart): such a claim could not fail. A scale that cuts two rows down
    to the same run (R4 for six epochs at one epoch, a sweep value that is the row's own rate) says
    what each row runs at that scale instead (`scales.<name>.named`)."""
    def settings(run):
        return experiments[run].model_dump(mode="json", exclude={"description"})

    for k, claim in enumerate(st.paper.claims):
        first, second = ([r for r in row_runs(st.paper, label, params, groups) if r in experiments]
                         for label in claim.rows)
        theirs = {}
        for r in second:
            theirs.setdefault(repr(settings(r)), r)
        same = next(((r, theirs[repr(settings(r))]) for r in first if repr(settings(r)) in theirs), None)
        if same is not None:
            raise MinBertError(f"{where}.claims[{k}]' (claim '{claim.text}'): row '{claim.rows[0]}' runs '{same[0]}', "
                               f"which trains exactly what row '{claim.rows[1]}' runs ('{same[1]}'), so its verdict "
                               f"could not fail; give one of them other settings (at a scale: scales.<name>.named)")


def check_test_claims(st, where: str, params: Params, experiments: dict, groups: dict) -> None:
    """A claim on the test split compares rows whose experiments all predict it (`predict_test`)."""
    for k, claim in enumerate(st.paper.claims):
        if claim.split != "test":
            continue
        for label in claim.rows:
            runs = row_runs(st.paper, label, params, groups)
            off = next((r for r in runs if r in experiments and not experiments[r].predict_test), None)
            if off is not None:
                raise MinBertError(f"{where}.claims[{k}].split' (claim '{claim.text}'): row '{label}' runs '{off}', "
                                   f"which predicts dev only (predict_test: false); compare on dev or set "
                                   f"predict_test: true")


def check_reference(st, runnable: set, where: str, experiments: dict, groups: dict) -> None:
    """A table's frozen-encoder reference (a row's run, or `reference_run`) exists and freezes its
    encoder: the training check reads a fine-tuned row's win over it as learning freezing cannot."""
    paper = st.paper
    if paper.reference_run:
        name, key = paper.reference_run, "reference_run"
        if name not in runnable:
            raise MinBertError(f"{where}.reference_run' (study '{st.name}'): unknown experiment '{name}'"
                               f"{close(name, runnable)}")
    elif paper.frozen_reference:
        name, key = next(r.run for r in paper.rows if r.label == paper.frozen_reference), "frozen_reference"
    else:
        return
    exp = experiments.get(name) or next((experiments[m] for m in groups.get(name, ()) if m in experiments), None)
    if exp is not None and not exp.finetune.freeze_encoder:
        raise MinBertError(f"{where}.{key}' (study '{st.name}'): '{name}' fine-tunes its encoder; the reference is "
                           f"a run with finetune.freeze_encoder: true")


def check_encoder_alone(st, runnable: set, where: str, experiments: dict) -> None:
    """A table's encoder-alone runs exist, freeze the encoder and start from the model as it is."""
    for k, name in enumerate(st.paper.encoder_alone):
        if name not in runnable:
            raise MinBertError(f"{where}.encoder_alone[{k}]' (study '{st.name}'): unknown experiment '{name}'"
                               f"{close(name, runnable)}")
        exp = experiments.get(name)
        if exp is not None and (not exp.finetune.freeze_encoder or exp.pretrain):
            raise MinBertError(f"{where}.encoder_alone[{k}]' (study '{st.name}'): '{name}' "
                               f"{'fine-tunes its encoder' if not exp.finetune.freeze_encoder else 'starts from a pretraining'}"
                               f"; an encoder-alone run freezes the encoder as the model gives it "
                               f"(finetune.freeze_encoder: true, no pretrain)")


def check_pretrainings(params: Params, where: str) -> None:
    """A pretraining has the data it reads, and only paraphrase-first trains with fine-tuning settings
    (validated as base.finetune changed by them)."""
    data = params.data
    for name, pre in params.pretrainings.items():
        if pre.kind == "nli" and data.nli_file is None:
            raise MinBertError(f"{where}: key 'pretrainings.{name}.kind': NLI pretraining needs NLI data; "
                               f"set 'data.nli_file'")
        if pre.kind == "mlm":
            if any(NLI_DATA.names(t) for t in pre.mlm.tasks) and data.nli_file is None:
                raise MinBertError(f"{where}: key 'pretrainings.{name}.mlm.tasks': '{NLI_DATA.name}' needs "
                                   f"'data.nli_file'")
            if "cfimdb" in pre.mlm.tasks and not data.include_cfimdb:
                raise MinBertError(f"{where}: key 'pretrainings.{name}.mlm.tasks': 'cfimdb' needs "
                                   f"'data.include_cfimdb: true'")
        if pre.finetune and pre.kind != "para_first":
            raise MinBertError(f"{where}: key 'pretrainings.{name}.finetune': only a para_first pretraining trains "
                               f"with the fine-tuning settings (this one is {pre.kind}); remove it")
        if pre.finetune:
            try:
                FinetuneParams.model_validate(deep_merge(params.base.finetune.model_dump(), pre.finetune))
            except ValidationError as err:
                raise_validation(err, FinetuneParams, where, prefix=f"pretrainings.{name}.finetune.")


def check_combinations(params: Params, experiments: dict[str, ExperimentParams], where: str,
                       groups: dict | None = None) -> None:
    """Settings of several sections that validate one by one but cannot run together (what one
    experiment's settings must agree on is its model's own check: minbert.params.schema)."""
    check_pretrainings(params, where)
    for name, exp in experiments.items():
        pre = params.pretrainings[exp.pretrain] if exp.pretrain is not None else None
        if pre is None or pre.kind != "nli":
            continue
        heads = exp.finetune.heads
        # every task reads the sentence embedding NLI trained (a task's own pooling included)
        other = next((t for t in model_tasks(exp) if heads.pooling_of(t) != pre.nli.pooling), None)
        if other is not None:
            where_key = f"task_pooling.{other}" if other in heads.task_pooling else "pooling"
            raise MinBertError(f"{where}: key 'experiments.{name}.finetune.heads.{where_key}': the NLI pretraining "
                               f"'{exp.pretrain}' trains {pre.nli.pooling}-pooled sentence embeddings but {other} "
                               f"reads '{heads.pooling_of(other)}'; set the same pooling in both "
                               f"(pretrainings.{exp.pretrain}.nli.pooling)")
    for name, exp in experiments.items():
        if exp.finetune.distill is not None:
            check_teacher(params, experiments, groups or {}, name, where)
    for ens_name, ens in params.ensembles.items():
        if len(set(ens.members)) != len(ens.members):
            raise MinBertError(f"{where}: key 'ensembles.{ens_name}.members': lists a member twice")
        common = set.intersection(*(set(model_tasks(experiments[m])) for m in ens.members
                                    if m in experiments)) if ens.members else set()
        if not common and all(m in experiments for m in ens.members):
            raise MinBertError(f"{where}: key 'ensembles.{ens_name}.members': the members share no task")


def check_teacher(params: Params, experiments: dict[str, ExperimentParams], groups: dict, name: str,
                  where: str) -> None:
    """A student's teacher exists, is not the student nor learns from it, and predicts the tasks it
    distils (that they are trained is the student's own check)."""
    exp = experiments[name]
    d = exp.finetune.distill
    key = f"experiments.{name}.finetune.distill"
    members = teacher_members(d.teacher, experiments, groups, params.ensembles)
    if members is None:
        known = set(experiments) | set(groups) | set(params.ensembles)
        raise MinBertError(f"{where}: key '{key}.teacher': unknown experiment or ensemble "
                           f"'{d.teacher}'{close(d.teacher, known)}")
    if name in members:
        raise MinBertError(f"{where}: key '{key}.teacher': '{name}' cannot be its own teacher")
    chain, seen = members, {name}
    while chain:   # a teacher (or its teachers) learning from this experiment would never start
        if seen & set(chain):
            raise MinBertError(f"{where}: key '{key}.teacher': '{d.teacher}' learns (through its teachers) "
                               f"from '{name}' itself; break the cycle")
        seen |= set(chain)
        nxt = []
        for m in chain:
            dm = experiments[m].finetune.distill
            if dm is not None:
                nxt += teacher_members(dm.teacher, experiments, groups, params.ensembles) or []
        chain = nxt
    taught = shared_tasks(members, experiments)
    wanted = set(d.tasks or exp.finetune.tasks)
    missing = sorted(wanted - taught)
    if d.tasks is not None and missing:
        raise MinBertError(f"{where}: key '{key}.tasks': the teacher '{d.teacher}' does not predict {missing[0]}")
    if not (wanted & taught & set(exp.finetune.tasks)):
        raise MinBertError(f"{where}: key '{key}.teacher': '{d.teacher}' predicts none of the tasks this "
                           f"experiment trains")
