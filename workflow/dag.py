"""The pipeline's DAG, described once for both engines.

From the validated params this module lists every job: its command, the files it reads (including
its own code), the files it writes, its metrics and plots, and the params keys it depends on.
The Snakefile builds its rules from these jobs; `python -m workflow.dag --write-dvc` renders the
same jobs as dvc.yaml. So the two engines cannot drift apart: a test checks that the committed
dvc.yaml equals the generated one.

    python -m workflow.dag                  # print the jobs
    python -m workflow.dag --write-dvc      # (re)generate dvc.yaml from params.yaml
    python -m workflow.dag --check          # exit 1 when dvc.yaml is out of date
    python -m workflow.dag --catalogue full # switch params.yaml's catalogue and regenerate dvc.yaml
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from minbert.errors import MinBertError  # noqa: E402
from minbert.params import LoadedParams, load_params  # noqa: E402

LIBRARY = "minbert"          # every stage imports the library: editing it re-runs the stages
RESULTS = "results"
# Keys of an experiment's settings that a pretraining also reads (when set in `base`)
PRETRAIN_BASE_KEYS = ("model", "seed", "device", "bf16", "threads", "max_length")
# Stages that train or run the network: they get the GPU on a cluster
GPU_STAGES = ("pretrain", "finetune", "retrain_heads", "predict")


@dataclass
class Job:
    stage: str                       # prepare | pretrain | finetune | retrain_heads | predict | evaluate | ensemble | report
    name: str | None                 # the experiment, pretraining or ensemble; None for prepare and report
    cmd: str
    deps: list[str]                  # files and folders read, code included
    outs: list[str]                  # files and folders written (cached by DVC)
    metrics: list[str] = field(default_factory=list)   # JSON metrics (DVC: cache false)
    plots: list[str] = field(default_factory=list)     # CSV curves (DVC: cache false)
    params: list[str] = field(default_factory=list)    # keys in the params source file
    config: dict = field(default_factory=dict)         # resolved settings: Snakemake's params trigger

    @property
    def id(self) -> str:
        return self.stage if self.name is None else f"{self.stage}@{self.name}"

    @property
    def outputs(self) -> list[str]:
        return self.outs + self.metrics + self.plots

    @property
    def fingerprint(self) -> str:
        return json.dumps(self.config, sort_keys=True, default=str)


def _code(stage: str) -> list[str]:
    return [f"stages/{stage}.py", LIBRARY]


def _cmd(stage: str, params_arg: str, *args: str) -> str:
    extra = "" if params_arg == "params.yaml" else f" --params {params_arg}"
    return " ".join(["python -m", f"stages.{stage}", *args]) + extra


def code_files(deps: list[str], repo: Path = REPO) -> list[str]:
    """The deps with the library folder spelled out as its .py files (for Snakemake, which
    compares modification times: Python's bytecode caches inside the folder must not count)."""
    out = []
    for d in deps:
        if d == LIBRARY:
            out += sorted(p.relative_to(repo).as_posix() for p in (repo / LIBRARY).rglob("*.py"))
        else:
            out.append(d)
    return out


def experiment_dir(name: str) -> str:
    return f"{RESULTS}/experiments/{name}"


def final_model(lp: LoadedParams, name: str) -> str:
    """The model predictions come from: retrained heads when enabled, else the fine-tuned one."""
    stage = "retrain_heads" if lp.experiment(name).retrain_heads.enabled else "finetune"
    return f"{experiment_dir(name)}/{stage}/model.pt"


def _local_path(repo: Path, p: str | None) -> str | None:
    """A params path as a dependency, when it names something on disk (not a Hub id or package)."""
    if not p:
        return None
    return p if (repo / p).exists() or p.startswith(("/", ".", "data/")) else None


def _report_inputs(earlier_jobs: list[Job]) -> list[str]:
    """What the report reads: every earlier output but the models (histories, predictions,
    metrics, run.json files, the data summary). A fixed list, not a glob of what exists, so a
    second run sees the same inputs as the first (minbert.report.report_inputs lists the same
    files one by one; each lies in one of these outputs)."""
    return [o for job in earlier_jobs for o in job.outputs
            if not (o.endswith("/model.pt") or o.endswith("/model"))]


def jobs(params_path: str | Path = "params.yaml", repo: Path = REPO) -> list[Job]:
    """Every job of the pipeline, in an order where each job comes after the jobs it reads from."""
    params_arg = str(params_path)
    lp = load_params(repo / params_path)
    p = lp.params
    raw_base = lp.raw.get("base") or {}
    out: list[Job] = []

    data_deps = [d for d in (_local_path(repo, p.data.dir), _local_path(repo, p.data.nli_file)) if d]
    if len(data_deps) == 2 and Path(data_deps[1]).is_relative_to(Path(data_deps[0])):
        data_deps = data_deps[:1]
    out.append(Job("prepare", None, _cmd("prepare", params_arg), deps=_code("prepare") + data_deps,
                   outs=[f"{RESULTS}/data"], params=["data"] if "data" in lp.raw else [],
                   config={"data": p.data.model_dump()}))

    used_pretrainings = sorted({e.pretrain for e in lp.experiments.values() if e.pretrain})
    for name in used_pretrainings:
        pre = lp.pretraining(name)
        folder = f"{RESULTS}/pretrain/{name}"
        model_dep = _local_path(repo, pre.model or raw_base.get("model"))
        out.append(Job("pretrain", name, _cmd("pretrain", params_arg, "--name", name),
                       deps=_code("pretrain") + [f"{RESULTS}/data"] + ([model_dep] if model_dep else []),
                       outs=[f"{folder}/model", f"{folder}/run.json"],
                       metrics=[f"{folder}/metrics.json"], plots=[f"{folder}/history.csv"],
                       params=[f"pretrainings.{name}"] + [f"base.{k}" for k in PRETRAIN_BASE_KEYS if k in raw_base],
                       config={"pretraining": pre.model_dump(), "model": lp.pretrain_model(name),
                               **{k: v for k, v in _base_config(lp).items() if k in PRETRAIN_BASE_KEYS}}))

    exp_params = lambda name: (["base"] if "base" in lp.raw else []) + [f"experiments.{name}"]  # noqa: E731
    for name, exp in lp.experiments.items():
        folder = experiment_dir(name)
        config = exp.model_dump()
        start = [f"{RESULTS}/pretrain/{exp.pretrain}/model"] if exp.pretrain else []
        model_dep = None if exp.pretrain else _local_path(repo, exp.model)
        out.append(Job("finetune", name, _cmd("finetune", params_arg, "--experiment", name),
                       deps=_code("finetune") + [f"{RESULTS}/data"] + start + ([model_dep] if model_dep else []),
                       outs=[f"{folder}/finetune/model.pt", f"{folder}/finetune/run.json"],
                       plots=[f"{folder}/finetune/history.csv"], params=exp_params(name), config=config))
        if exp.retrain_heads.enabled:
            out.append(Job("retrain_heads", name, _cmd("retrain_heads", params_arg, "--experiment", name),
                           deps=_code("retrain_heads") + [f"{RESULTS}/data", f"{folder}/finetune/model.pt"],
                           outs=[f"{folder}/retrain_heads/model.pt", f"{folder}/retrain_heads/run.json"],
                           plots=[f"{folder}/retrain_heads/history.csv"], params=exp_params(name),
                           config=config))
        out.append(Job("predict", name, _cmd("predict", params_arg, "--experiment", name),
                       deps=_code("predict") + [f"{RESULTS}/data", final_model(lp, name)],
                       outs=[f"{folder}/predictions"], params=exp_params(name),
                       config={"model": final_model(lp, name), "predict_batch_size": exp.predict_batch_size,
                               "device": exp.device, "max_length": exp.max_length}))
        out.append(Job("evaluate", name, _cmd("evaluate", params_arg, "--experiment", name),
                       deps=_code("evaluate") + [f"{folder}/predictions"],
                       outs=[], metrics=[f"{folder}/metrics.json"]))

    for name, ens in p.ensembles.items():
        folder = f"{RESULTS}/ensembles/{name}"
        out.append(Job("ensemble", name, _cmd("ensemble", params_arg, "--name", name),
                       deps=_code("ensemble") + [f"{experiment_dir(m)}/predictions" for m in ens.members],
                       outs=[f"{folder}/predictions", f"{folder}/run.json"], metrics=[f"{folder}/metrics.json"],
                       params=[f"ensembles.{name}"], config=ens.model_dump()))

    report_deps = _report_inputs(out)
    templates = ["workflow/templates"] if any((repo / "workflow/templates").glob("*")) else []
    out.append(Job("report", None, _cmd("report", params_arg),
                   deps=_code("report") + templates + report_deps,
                   outs=["reports/final.html", "reports/experiments"],
                   params=[k for k in ("base", "experiments", "ensembles", "studies", "report") if k in lp.raw],
                   config={"studies": [s.model_dump() for s in p.studies], "report": p.report.model_dump(),
                           "overrides": {e: lp.overrides(e) for e in lp.experiments}}))
    return out


def _base_config(lp: LoadedParams) -> dict:
    from minbert.params import ExperimentParams

    return ExperimentParams.model_validate(lp.params.base).model_dump()


def _relative(path: Path | None, repo: Path) -> str:
    if path is None:
        return "params.yaml"
    try:
        return str(Path(path).resolve().relative_to(repo.resolve()))
    except ValueError:
        return str(path)


def params_source(params_path: str | Path = "params.yaml", repo: Path = REPO) -> str:
    """The file whose keys the jobs' `params` name (params.yaml, or the active catalogue file)."""
    lp = load_params(repo / params_path)
    return _relative(lp.source, repo)


# ---------------------------------------------------------------- dvc.yaml

def _dvc_stage_name(job: Job) -> str:
    return job.id.replace("@", "-")


def dvc_yaml(params_path: str | Path = "params.yaml", repo: Path = REPO) -> dict:
    """dvc.yaml as a dict: one explicit stage per job, metrics and plots declared for DVC's views."""
    all_jobs = jobs(params_path, repo)
    src = params_source(params_path, repo)
    stages = {}
    for job in all_jobs:
        st: dict = {"cmd": job.cmd, "deps": job.deps}
        if job.params:
            st["params"] = _dvc_params(job.params, src, str(params_path))
        if job.outs:
            st["outs"] = job.outs
        if job.metrics:
            st["metrics"] = [{m: {"cache": False}} for m in job.metrics]
        if job.plots:
            st["plots"] = [{pl: {"cache": False}} for pl in job.plots]
        stages[_dvc_stage_name(job)] = st
    return {"stages": stages, "plots": _dvc_plot_views(all_jobs, params_path, repo)}


def _dvc_params(keys: list[str], src: str, params_file: str) -> list:
    """DVC params entries: catalogue sections live in `src`, the rest (report) in the params file."""
    from minbert.params import CATALOGUE_SECTIONS

    in_src = [k for k in keys if k.split(".")[0] in CATALOGUE_SECTIONS]
    rest = [k for k in keys if k not in in_src]
    out: list = []
    for file, ks in ((src, in_src), (params_file, rest)):
        if ks:
            out += ks if file == "params.yaml" else [{file: ks}]
    return out


def _dvc_plot_views(all_jobs: list[Job], params_path, repo: Path) -> list:
    """Top-level plots: the dev curves per experiment and the SST/Quora dev confusion matrices."""
    lp = load_params(repo / params_path)
    views = []
    for job in all_jobs:
        if job.stage == "finetune":
            tasks = lp.experiment(job.name).finetune.tasks
            cols = [f"dev_{t}_{'pearson' if t == 'sts' else 'acc'}" for t in tasks]
            views.append({f"{job.name}-dev-curves": {"x": "epoch", "y": {job.plots[0]: cols},
                                                     "title": f"{job.name}: dev metrics per epoch"}})
        if job.stage in ("predict", "ensemble"):
            tasks = (lp.experiment(job.name).finetune.tasks if job.stage == "predict"
                     else sorted(set.intersection(*(set(lp.experiment(m).finetune.tasks)
                                                    for m in lp.params.ensembles[job.name].members))))
            for task in ("sst", "para"):
                if task in tasks:
                    views.append({f"{job.name}-{task}-dev-confusion": {
                        "template": "confusion", "x": "prediction",
                        "y": {f"{job.outs[0]}/{task}-dev.csv": "label"},
                        "title": f"{job.name}: {task} dev confusion"}})
    return views


HEADER = ("# Generated by `python -m workflow.dag --write-dvc` from params.yaml; do not edit by hand.\n"
          "# The Snakefile builds the same jobs from workflow/dag.py.\n")


def render_dvc(params_path: str | Path = "params.yaml", repo: Path = REPO) -> str:
    return HEADER + yaml.safe_dump(dvc_yaml(params_path, repo), sort_keys=False, width=120)


def dvc_commit(all_jobs: list[Job], repo: Path = REPO) -> bool:
    """Record the outputs in dvc.lock (`dvc commit --force`) without touching their timestamps.

    DVC re-links committed files into the workspace, which would make them look newer to
    Snakemake than the jobs that read them; restoring the times keeps a later Snakemake run a no-op.
    """
    import os
    import subprocess

    times = {}
    for job in all_jobs:
        for out in job.outputs:
            path = repo / out
            for p in ([path] + sorted(path.rglob("*")) if path.is_dir() else [path]):
                if p.exists():
                    st = p.stat()
                    times[p] = (st.st_atime_ns, st.st_mtime_ns)
    ok = subprocess.run(["dvc", "commit", "--force", "--quiet"], cwd=repo).returncode == 0
    for p in sorted(times, key=lambda q: len(q.parts), reverse=True):   # files before their folders
        if p.exists():
            os.utime(p, ns=times[p], follow_symlinks=False)
    return ok


def set_catalogue(params_file: Path, name: str) -> None:
    """Switch `catalogue:` in params.yaml, keeping the rest of the file (and its comments) as it is."""
    text = params_file.read_text(encoding="utf-8")
    line = f"catalogue: {name}"
    if re.search(r"(?m)^catalogue:.*$", text):
        text = re.sub(r"(?m)^catalogue:.*$", line, text, count=1)
    else:
        text = line + "\n" + text
    params_file.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="List the pipeline's jobs; generate dvc.yaml")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--write-dvc", action="store_true", help="write dvc.yaml")
    ap.add_argument("--check", action="store_true", help="exit 1 when dvc.yaml differs from the generated one")
    ap.add_argument("--catalogue", help="set `catalogue:` in the params file, then write dvc.yaml")
    a = ap.parse_args(argv)
    dvc_path = REPO / "dvc.yaml"
    if a.catalogue:
        before = (REPO / a.params).read_text(encoding="utf-8")
        set_catalogue(REPO / a.params, a.catalogue)
        try:
            load_params(REPO / a.params)
        except MinBertError:
            (REPO / a.params).write_text(before, encoding="utf-8")
            raise
        a.write_dvc = True
    if a.write_dvc:
        dvc_path.write_text(render_dvc(a.params), encoding="utf-8")
        print(f"wrote {dvc_path.relative_to(REPO)} ({len(jobs(a.params))} stages)")
    elif a.check:
        if not dvc_path.is_file() or dvc_path.read_text(encoding="utf-8") != render_dvc(a.params):
            print("dvc.yaml is out of date: run `python -m workflow.dag --write-dvc`", file=sys.stderr)
            sys.exit(1)
        print("dvc.yaml is up to date")
    else:
        for job in jobs(a.params):
            print(f"{job.id:40s} {job.cmd}")


if __name__ == "__main__":
    from stages._cli import run

    run(main)
