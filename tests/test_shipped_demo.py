"""The shipped params.yaml under both engines, as a user changes it from the command line, in a
copy of the project (a fresh clone's files): the demo catalogue as it ships, made tiny by DVC's own
`-S` rewrite (the tiny random BERT, two updates an epoch; its anchors, aliases and comments
rewritten as `dvc exp run -S` rewrites them), built once (by Snakemake, the stages in its own
process, and recorded in dvc.lock). Then one experiment's key
set from the command line re-runs exactly that experiment's chain, under DVC (`dvc exp run -S`, and
a queued two-value sweep) and under Snakemake (`--config set=...`)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import child_env
from test_workflow import DVC, SNAKEMAKE, commands_run, job_ids, run, stages_run

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(DVC is None or SNAKEMAKE is None, reason="needs dvc and snakemake")]

# the shipped demo, tiny: what a laptop runs in minutes, in seconds (set as `dvc exp run -S` sets it)
TINY = ["base.model=models/tiny", "base.max_length=32", "++base.threads=1", "base.finetune.epochs=1",
        "base.finetune.max_steps_per_epoch=2", "experiments.pcgrad.finetune.max_steps_per_epoch=1",
        "pretrainings.mlm_demo.max_steps_per_epoch=2"]
KEY = "experiments.cross_encoder.finetune.heads.para"       # a key the shipped file sets
CHAIN = {"finetune@cross_encoder", "predict@cross_encoder", "evaluate@cross_encoder", "report"}


def copy_project(repo_root: Path, dest: Path, tiny_model_dir: Path) -> Path:
    """The repository's tracked and unignored files (what a clone has) and the tiny model."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=repo_root, capture_output=True,
                           text=True, check=True).stdout.split("\n")
    for f in filter(None, files):
        if (repo_root / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo_root / f, dest / f)
    shutil.copytree(tiny_model_dir, dest / "models" / "tiny")
    return dest


def changed_lines(before: str, after: str) -> int:
    """How many lines `after` holds that `before` does not (a line edited counts once)."""
    import difflib

    return sum(line.startswith("+ ") for line in difflib.ndiff(before.splitlines(), after.splitlines()))


@pytest.fixture(scope="module")
def demo_repo(repo_root, tmp_path_factory, tiny_model_dir):
    from dvc.utils.hydra import apply_overrides

    from workflow import params_text

    folder = copy_project(repo_root, tmp_path_factory.mktemp("demo") / "repo", tiny_model_dir)
    run(["git", "init", "-q"], folder)
    run(["git", "add", "-A"], folder)
    run(["git", "commit", "-q", "-m", "the shipped demo"], folder)
    shipped = (folder / "params.yaml").read_text()
    apply_overrides(folder / "params.yaml", TINY)                 # DVC's own rewrite of the shipped file
    assert changed_lines(shipped, (folder / "params.yaml").read_text()) > 50
    # what DVC's first stage, resolve, does with it: the file as written, each key set on its own line
    said = params_text.restore("params.yaml", folder, "results/jobs")
    text = (folder / "params.yaml").read_text()
    assert said and changed_lines(shipped, text) == len(TINY), said
    assert "differs: &demo_differs" in text and "*demo_differs" in text and "# `stand_in`" in text
    run([sys.executable, "-m", "workflow.dag", "--write-dvc"], folder)   # the jobs now read the tiny model's folder
    run(["git", "add", "-A"], folder)
    run(["git", "commit", "-q", "-m", "the shipped demo, tiny"], folder)
    # built once as a user's Snakemake run builds it (its records of each job's inputs kept: Snakemake
    # compares an input by its checksum where its date says newer, and it dates every output a job wrote
    # as new), recorded in dvc.lock as every Snakemake run in a DVC repository is: the export
    # params.yaml lists included
    log = run([SNAKEMAKE, "--cores", "1", "--scheduler", "greedy", "--config", "progress=1"], folder, timeout=1800)
    # the head of the longest chain starts first (its priority: workflow.dag.chain_heights)
    started = [w for w in re.findall(r"^Job \d+: (\S+)", log, re.M) if not w.startswith("prepare")]
    assert started[0] == "pretrain", log[-3000:]
    # where the run stood, on Snakemake's terminal every second while jobs ran (minbert.pipeline.progress)
    assert re.search(r"^\[progress\] \d+ of 26 jobs done, 1 running, \d+ waiting", log, re.M), log[-3000:]
    assert (folder / "results/exports/mlm_multitask/minbert.json").is_file()
    run([sys.executable, "-m", "workflow.dvc_plots"], folder)       # what scripts/install.sh does
    assert "up to date" in run([DVC, "status"], folder)            # the quick start leaves DVC a baseline
    run(["git", "add", "-A"], folder)
    run(["git", "commit", "-q", "-m", "results"], folder)
    return folder


def snakemake_plan(folder: Path, *config: str) -> set[str]:
    """The jobs `snakemake -n` plans (by the commands it prints)."""
    log = run([SNAKEMAKE, "-n", "--printshellcmds", "--cores", "2", *(("--config", *config) if config else ())],
              folder)
    return job_ids(folder, commands_run(log))


def test_a_snakemake_override_reruns_exactly_that_experiments_chain(demo_repo):
    """Over the built project Snakemake has nothing to do; `--config set=KEY=VALUE` plans exactly the
    chain of the experiment whose key it sets; a mistyped key is one line."""
    assert snakemake_plan(demo_repo) == set()
    assert snakemake_plan(demo_repo, f"set={KEY}=concat") == CHAIN
    r = subprocess.run([SNAKEMAKE, "-n", "--cores", "2", "--config", f"set={KEY}s=concat"],
                       cwd=demo_repo, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert f"--config set: '{KEY}s=concat': params.yaml does not set '{KEY}s' (did you mean 'para'?)" \
        in r.stdout + r.stderr
    run([sys.executable, "-m", "workflow.dag", "--resolve"], demo_repo)    # the job files as the params say


def test_dvc_exp_run_s_queues_a_two_value_sweep_on_the_shipped_params_each_rerunning_exactly_that_chain(demo_repo):
    """`dvc exp run -S` with two values and `--queue`, then `dvc exp run --run-all`: two experiments,
    each of which ran exactly the chain of the experiment whose key it set (its log, `dvc queue
    logs`), each with its params and scores in `dvc exp show`; the workspace stays the baseline."""
    run([DVC, "exp", "run", "-S", f"{KEY}=concat,concat_mult", "--queue"], demo_repo)
    log = run([DVC, "exp", "run", "--run-all", "--jobs", "2"], demo_repo)
    # dvc.lock committed (docs/workflow.md): the queued copies have every output's hash, no warning
    assert "No file hash info found" not in log, log[-3000:]
    out = run([DVC, "exp", "show", "--json"], demo_repo)
    shown = json.loads(out[out.index("["):])
    exps = {e["name"]: e["revs"][0]["data"] for rev in shown for e in (rev.get("experiments") or [])}
    heads = {}
    for name, data in exps.items():
        params = data["params"]["params.yaml"]["data"]
        heads[params["experiments"]["cross_encoder"]["finetune"]["heads"]["para"]] = (name, data)
    assert set(heads) == {"concat", "concat_mult"}, list(heads)
    for value, (name, data) in heads.items():
        assert stages_run(run([DVC, "queue", "logs", name], demo_repo)) - {"resolve"} == \
            {j.replace("@", "-") for j in CHAIN}, value
        summary = data["metrics"]["results/metrics.json"]["data"]
        assert summary["cross_encoder"]["dev"] > 0 and set(summary) >= {"frozen_baseline", "cross_encoder", "pcgrad"}
    assert "para: cross" in (demo_repo / "params.yaml").read_text()


# ---------------------------------------------------------------- the docs' commands

DOCS = ["README.md", *sorted(f"docs/{p.name}" for p in (Path(__file__).parents[1] / "docs").glob("*.md"))]
MARKS = ("[GPU]", "[cluster]", "[network]", "[CS224N data]", "[a browser]")
# run by another test as they are written
COVERED = {
    "bash .ci/run": "CI itself",
    "snakemake --lint": "tests/test_workflow.py::test_lint_is_clean",
    f"dvc exp run -S '{KEY}=concat,concat_mult' --queue": "the queued sweep above",
    "dvc exp run --run-all": "the queued sweep above",
    "python3 -m pytest tests/test_schedules.py tests/test_heads.py tests/test_train.py tests/test_finetune_stages.py":
        "CI (bash .ci/run runs every test file)",
    "python3 -m pytest -m slow tests/test_train.py": "CI (bash .ci/run runs every test file)",
    "minbert export mlm_multitask": "test_minbert_export_as_docs_sharing_says",
    "minbert export mlm_multitask --out shared/mlm_multitask": "test_minbert_export_as_docs_sharing_says",
}
# run here as written but for what the note says
CHANGED = {
    # the install is tests/test_install_script.py's and tests/test_install.py's (pip needs the network)
    "bash scripts/install.sh && . scripts/activate && snakemake --cores all": ". scripts/activate && snakemake --cores all",
    # each would train many jobs: queued (DVC applies and checks the override), then dropped from the queue
    "dvc exp run -S base.finetune.lr=5e-5": "dvc exp run -S base.finetune.lr=5e-5 --queue && dvc queue remove --queued",
    "dvc exp run -S '++experiments.multitask_rr.finetune.lr=5e-5'":
        "dvc exp run -S '++experiments.multitask_rr.finetune.lr=5e-5' --queue && dvc queue remove --queued",
    "dvc exp run -S experiments.cross_encoder.finetune.heads.para=concat":
        "dvc exp run -S experiments.cross_encoder.finetune.heads.para=concat --queue && dvc queue remove --queued",
    "dvc exp run -S '++experiments.cross_encoder.finetune.tracking=[dvclive]'":
        "dvc exp run -S '++experiments.cross_encoder.finetune.tracking=[dvclive]' --queue && dvc queue remove --queued",
    # the build above committed the baseline already (and git here may know no author)
    'git add dvc.lock && git commit -m "demo baseline"':
        "git add dvc.lock && git -c user.name=demo -c user.email=demo@demo commit -q --allow-empty -m 'demo baseline'",
    # it would train cross_encoder's chain again: planned instead (tested to be exactly that chain above)
    "snakemake --cores all --config set='++experiments.cross_encoder.finetune.lr=5e-5'":
        "snakemake -n --cores all --config set='++experiments.cross_encoder.finetune.lr=5e-5'",
    # it would train every fine-tune of the demo again (and all after them): planned instead, every
    # fine-tune in the plan (checked below); tests/test_reruns.py runs a forced fine-tune for real
    "snakemake --cores all --forcerun finetune": "snakemake -n --cores all --forcerun finetune",
}


def doc_commands(path: Path) -> list[str]:
    """The commands of a page's bash and console blocks (a console block's `$ ` lines, each with the
    lines its open quotes carry on to), comments dropped."""
    import shlex

    out, lang, body, inside = [], None, [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        fence = re.match(r"^\s*```(\w*)\s*$", line)
        if fence:
            if inside and lang in ("bash", "sh", "console"):
                out += _commands(lang, body, shlex)
            inside, lang, body = not inside, fence.group(1), []
        elif inside:
            body.append(line)
    return out


def _commands(lang, body, shlex) -> list[str]:
    cmds, current = [], None
    for line in body:
        if lang == "console":
            if current is not None:
                current += "\n" + line
            elif line.startswith("$ "):
                current = line[2:]
            if current is not None:
                try:
                    shlex.split(current)
                except ValueError:
                    continue                          # an open quote: the command goes on
                cmds.append(current)
                current = None
        elif line.strip() and not line.strip().startswith("#"):
            if current is not None:
                line = current + " " + line.strip()
            current = line.rstrip()[:-1] if line.rstrip().endswith("\\") else None
            if current is None:
                cmds.append(line.strip())
    return cmds


def marked(command: str) -> bool:
    return any(m in command for m in MARKS)


def without_comment(command: str) -> str:
    """The command without its trailing shell comment (a `#` after a space, outside quotes)."""
    quote = None
    for k, ch in enumerate(command):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or command[k - 1].isspace()):
            return command[:k].rstrip()
    return command.strip()


def test_every_documented_command_runs_on_the_demo_or_says_what_it_needs(demo_repo, repo_root, tmp_path):
    """Every command of README.md and docs/*.md runs as written in the built demo (exit status 0),
    or another test runs it, or its line says what it needs (MARKS); what they print is what the
    pages say where it is the project's (the export's files, the plots page offline, the report's
    pages)."""
    env = child_env(demo_repo, PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin")
    (demo_repo / "sentences.tsv").write_text("sentence\nA gripping, funny film.\nA dull, lifeless film.\n")
    (demo_repo / "pairs.csv").write_text("sentence1,sentence2\nA man plays a guitar.,A man is playing music.\n")
    seen, ran = set(), {}
    for page in DOCS:
        for command in doc_commands(repo_root / page):
            text = without_comment(command)
            if text in seen or marked(command) or text in COVERED:
                seen.add(text)
                continue
            seen.add(text)
            shell = CHANGED.get(text, text)
            if shell.startswith("snakemake --dag | dot") and shutil.which("dot") is None:
                shell = "snakemake --dag > dag.dot"          # Graphviz absent here: the graph, undrawn
            if shell.startswith("/usr/bin/time") and not Path("/usr/bin/time").exists():
                shell = shell.split(" ", 2)[2]
            r = subprocess.run(["bash", "-c", shell], cwd=demo_repo, env=env, capture_output=True, text=True,
                               timeout=900)
            assert r.returncode == 0, f"{page}: `{command}` failed:\n{(r.stdout + r.stderr)[-3000:]}"
            ran[text] = r.stdout + r.stderr
    assert len(ran) >= 25, sorted(ran)
    # what the pages show of the project's own output
    listing = set(ran["ls results/exports/mlm_multitask"].split())
    readme = (repo_root / "README.md").read_text()
    block = readme[readme.index("$ ls results/exports/mlm_multitask"):]
    assert listing == set(block.split("```")[0].split()[3:]), listing
    assert "Nothing to be done" in ran["snakemake --cores all"] or "up to date" in ran["snakemake --cores all"]
    from test_workflow import dag
    fine_tunes = sum(j.stage == "finetune" for j in dag.jobs("params.yaml", repo=demo_repo))
    forced = ran["snakemake --cores all --forcerun finetune"]     # each job by its message (the Snakefile's)
    assert len(set(re.findall(r"^Job \d+: fine-tune (\S+)$", forced, re.M))) == fine_tunes, forced[-2000:]
    assert "(3, 32)" in ran[next(c for c in ran if c.startswith("python -c 'from sentence_transformers"))]
    page = (demo_repo / "dvc_plots" / "index.html").read_text()
    assert "<script src" not in page and "vegaEmbed(" in page            # `dvc plots show`: offline
    import zipfile

    names = zipfile.ZipFile(demo_repo / "report.zip").namelist()            # `snakemake --report report.zip`
    pages = {Path(n).name for n in names if n.endswith(".html")}
    linked = set(re.findall(r'href="experiments/([^"#]+\.html)"', (demo_repo / "reports" / "final.html").read_text()))
    assert linked and {"final.html"} | linked <= pages, (linked - pages)
    assert "0 waiting" in ran["minbert progress --watch"]


# ---------------------------------------------------------------- sentences of the docs, run

def plain_plan(folder: Path) -> set[str]:
    run([sys.executable, "-m", "workflow.dag", "--resolve"], folder)    # the job files as params.yaml says
    return snakemake_plan(folder)


def test_minbert_export_as_docs_sharing_says(demo_repo):
    """docs/sharing.md: into the pipeline's folder the command is the export job (up to date after the
    build); --out writes a folder of its own; the demo's card names its data as synthetic (README)."""
    minbert = [sys.executable, "-m", "minbert.cli"]        # the copy's code (its folder first on the path)
    out = run([*minbert, "export", "mlm_multitask"], demo_repo)
    assert "export@mlm_multitask: up to date" in out, out
    out = run([*minbert, "export", "mlm_multitask", "--out", "shared/mlm_multitask"], demo_repo)
    assert "shared/mlm_multitask: " in out and "files (README.md: its model card)" in out
    card = (demo_repo / "shared/mlm_multitask/README.md").read_text()
    assert card.split("## Provenance")[0] == \
        (demo_repo / "results/exports/mlm_multitask/README.md").read_text().split("## Provenance")[0]
    assert "Trained on the minBERT demo data: synthetic" in card and "model-index" not in card.split("---")[1]
    assert "- synthetic-data" in card.split("---")[1] and not (demo_repo / "shared/mlm_multitask/code").exists()
    shutil.rmtree(demo_repo / "shared")


def test_a_config_set_run_then_dvc_repro_then_snakemake_has_nothing_to_do(demo_repo):
    """docs/workflow.md: a Snakemake run with `--config set=` replaces the chain's outputs;
    results/finished keeps their hashes, no copy, so the next plain run trains the chain again
    ("Settings from the command line", planned); `dvc repro` restores them from its run cache instead,
    as hard links with the cache's dates, and Snakemake then has nothing to do though it ran those jobs
    itself last ("The two engines' records")."""
    run([SNAKEMAKE, "--cores", "1", "--config", f"set={KEY}=concat"], demo_repo, timeout=900)
    assert (demo_repo / "results/benchmarks/finetune/cross_encoder.tsv").is_file()   # Snakemake's record of its run
    assert plain_plan(demo_repo) == CHAIN
    kept = [p for p in (demo_repo / "results" / "finished").rglob("*") if p.is_file()]
    assert kept and all(p.suffix == ".json" and p.stat().st_size < 64_000 for p in kept)
    log = run([DVC, "repro"], demo_repo)              # the earlier outputs, from DVC's run cache as hard links
    restored = set(re.findall(r"Stage '([^']+)' is cached - skipping run", log))
    trained = {j.replace("@", "-") for j in CHAIN if j != "report"}
    # the training chain comes back from the cache; the report too, unless DVC never recorded the
    # report of exactly these inputs (the commands the tests before this one ran under Snakemake alone
    # leave run records it never saw): then it renders it again, and nothing else runs
    assert trained <= restored and restored | stages_run(log) - {"resolve"} <= trained | {"report"}, log[-3000:]
    log = run([SNAKEMAKE, "-n", "--cores", "2"], demo_repo)
    assert "Nothing to be done" in log, log[-3000:]


def test_dvc_commits_what_was_built(demo_repo):
    """docs/workflow.md: a plain `dvc commit --force` stops at an output the default target does not
    build (the export); `python -m workflow.dag --dvc-commit` records the stages whose outputs are
    there, and leaves Snakemake nothing to do."""
    export, aside = demo_repo / "results/exports/mlm_multitask", demo_repo / "exported-aside"
    export.rename(aside)
    try:
        with dates_kept(demo_repo):        # what it commits before it stops, DVC links back with new dates
            r = subprocess.run([DVC, "commit", "--force"], cwd=demo_repo, capture_output=True, text=True, timeout=600)
        assert r.returncode != 0 and "output 'results/exports/mlm_multitask' does not exist" in r.stdout + r.stderr
        out = run([sys.executable, "-m", "workflow.dag", "--dvc-commit"], demo_repo)
        assert "recorded 25 of 26 stages in dvc.lock" in out, out
    finally:
        aside.rename(export)
    assert "up to date" in run([DVC, "status"], demo_repo)
    assert snakemake_plan(demo_repo) == set()


@contextlib.contextmanager
def dates_kept(folder: Path):
    """The dates of everything under results/ and reports/ put back afterwards, files before folders."""
    import os

    paths = [p for top in ("results", "reports") for p in [folder / top, *(folder / top).rglob("*")]]
    dates = {p: (p.stat().st_atime_ns, p.stat().st_mtime_ns) for p in paths if not p.is_symlink()}
    try:
        yield
    finally:
        for p in sorted(dates, key=lambda q: len(q.parts), reverse=True):
            if p.exists():
                os.utime(p, ns=dates[p])


# ---------------------------------------------------------------- the README's examples, run

# a number standing alone (not inside an id such as 86e78229f5750d7cf7a9f3214)
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")


def console_examples(path: Path) -> list[tuple[str, str]]:
    """(command, the output the page shows under it) of each `$ ` command of the page's console
    blocks, in order."""
    import shlex

    out, inside, lang = [], False, None
    for line in path.read_text(encoding="utf-8").splitlines():
        fence = re.match(r"^\s*```(\w*)\s*$", line)
        if fence:
            inside, lang = not inside, fence.group(1)
            continue
        if not inside or lang != "console":
            continue
        if line.startswith("$ ") and not (out and out[-1][2]):
            out.append([line[2:], [], False])
        elif out and out[-1][2]:
            out[-1][0] += "\n" + line
        else:
            out[-1][1].append(line)
        try:
            shlex.split(out[-1][0])
            out[-1][2] = False
        except ValueError:
            out[-1][2] = True                    # an open quote: the command goes on
    return [(command, "\n".join(lines)) for command, lines, _ in out]


def layout(text: str) -> list[str]:
    """The text's layout: its lines with every number and every class name a prediction holds
    masked (the rest, headers, ids, texts and the layout itself, is compared as it is; the spaces
    that align a printed tensor's columns, which depend on the numbers' signs, count as one)."""
    from minbert.core.tasks import TASKS

    names = sorted({c for t in TASKS.values() for c in (t.classes or ())}, key=len, reverse=True)
    out = []
    for line in text.strip("\n").splitlines():
        fields = ["<class>" if f in names else NUMBER.sub("<n>", f) for f in line.rstrip().split("\t")]
        out.append(re.sub(r"\[ +", "[", re.sub(r" {2,}", " ", "\t".join(fields))))
    return out


def numbers(text: str) -> list[float]:
    return [float(x) for x in NUMBER.findall(text)]


def run_readme_examples(folder: Path, repo_root: Path) -> list[tuple[str, str, str]]:
    """Each README console example run in `folder` as written: (command, README's output, stdout)."""
    env = child_env(folder, PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin")
    ran = []
    for command, shown in console_examples(repo_root / "README.md"):
        r = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True, timeout=900,
                           check=False)
        assert r.returncode == 0, f"`{command}` failed:\n{(r.stdout + r.stderr)[-3000:]}"
        ran.append((command, shown, r.stdout))
    return ran


def check_predictions(stdout: str) -> None:
    """A `minbert predict` output: each label's class name is the one the task gives that label."""
    import io

    import pandas as pd

    from minbert.core.tasks import TASKS

    frame = pd.read_csv(io.StringIO(stdout), sep="\t", quoting=3)
    for task in ("sst", "para"):
        if f"{task}_label" in frame:
            assert [TASKS[task].classes[k] for k in frame[f"{task}_label"]] == frame[f"{task}_class"].tolist()


def test_the_readmes_examples_print_what_the_readme_shows(demo_repo, repo_root):
    """README.md's outputs ("Use your model") are what the commands above them print, run as written
    on the built demo: the same lines and fields, headers, ids and texts; numbers and class names
    are the tiny model's here (tests/test_shipped_demo.py's demo: its shapes and scores are its own),
    and each class name is its label's. The README's own numbers are the real demo's
    (`test_the_readmes_numbers_are_the_demos`)."""
    ran = run_readme_examples(demo_repo, repo_root)
    assert len(ran) >= 7, [c for c, _, _ in ran]
    for command, shown, stdout in ran:
        if command.startswith("ls "):                      # ls lays its names out by the terminal's width
            assert sorted(stdout.split()) == sorted(shown.split()), command
            continue
        assert layout(stdout) == layout(shown), (command, stdout)
        if "minbert predict" in command:
            check_predictions(stdout)
            check_predictions(shown)


@pytest.mark.skipif(not os.environ.get("MINBERT_BUILT_DEMO"), reason="MINBERT_BUILT_DEMO names no built demo")
def test_the_readmes_numbers_are_the_demos(repo_root):
    """With MINBERT_BUILT_DEMO set to a copy of the project where `snakemake --cores all
    results/exports/mlm_multitask` ran with the packaged MiniLM (not the tiny model), the README's
    numbers are what the commands print there, up to the last digits a machine's float sums change
    (README.md, "Use your model")."""
    for command, shown, stdout in run_readme_examples(Path(os.environ["MINBERT_BUILT_DEMO"]), repo_root):
        if command.startswith("ls "):
            continue
        assert layout(stdout) == layout(shown), (command, stdout)
        assert numbers(stdout) == pytest.approx(numbers(shown), rel=2e-2, abs=2e-3), (command, stdout)


# ---------------------------------------------------------------- DVC as its users expect it

def commit_all(folder: Path, message: str) -> None:
    """The workspace committed as it stands (the baseline `dvc exp show` compares with)."""
    run(["git", "add", "-A"], folder)
    run(["git", "commit", "-q", "--allow-empty", "-m", message], folder)


def exp_show(folder: Path, *options: str) -> list[dict]:
    out = run([DVC, "exp", "show", "--json", *options], folder)
    return json.loads(out[out.index("["):])


def test_one_dvc_exp_run_s_changes_one_line_and_the_engines_agree_after_it(demo_repo):
    """`dvc exp run -S KEY=VALUE` on the shipped params.yaml changes exactly its line (in the workspace
    and in the experiment's commit); `dvc exp show --only-changed` shows the experiment beside the
    baseline with the key and the scores that differ, not every column; Snakemake then has nothing
    to do, nor after `git checkout params.yaml && dvc repro` restored the models from DVC's cache."""
    commit_all(demo_repo, "baseline")
    before = (demo_repo / "params.yaml").read_text()
    log = run([DVC, "exp", "run", "-n", "concat-heads", "-S", f"{KEY}=concat"], demo_repo)
    # the chain runs, or comes back from DVC's run cache where a queued experiment ran this value
    cached = set(re.findall(r"Stage '([^']+)' is cached - skipping run", log))
    assert (stages_run(log) | cached) - {"resolve"} == {j.replace("@", "-") for j in CHAIN}, log[-3000:]
    after = (demo_repo / "params.yaml").read_text()
    assert changed_lines(before, after) == 1 and "heads: {para: concat, sts: cross}" in after, after
    ref = run(["git", "for-each-ref", "--format=%(refname)", "refs/exps"], demo_repo).split()
    committed = run(["git", "show", f"{next(r for r in ref if r.endswith('/concat-heads'))}:params.yaml"], demo_repo)
    assert committed == after
    header = run([DVC, "exp", "show", "--only-changed", "--csv"], demo_repo).strip().splitlines()[0].split(",")
    assert KEY in header and "cross_encoder.dev" in header, header
    params = [c for c in header if c.startswith(("base.", "experiments.", "pretrainings.", "ensembles.", "data."))]
    assert params == [KEY], header                      # the one key set, not every key of the file
    deps = [c for c in header if c.startswith(("results/", "reports/", "data/"))]
    assert deps and all("cross_encoder" in c or c in ("results/jobs/report.json", "results/runs")
                        or c.startswith("results/runs/") for c in deps), header
    assert snakemake_plan(demo_repo) == set()           # after DVC, Snakemake has nothing to do
    run(["git", "checkout", "params.yaml"], demo_repo)
    log = run([DVC, "repro"], demo_repo)                 # the models back from DVC's run cache
    restored = set(re.findall(r"Stage '([^']+)' is cached - skipping run", log))
    assert {"finetune-cross_encoder", "predict-cross_encoder"} <= restored, log[-3000:]
    assert snakemake_plan(demo_repo) == set()
    assert "up to date" in run([DVC, "status"], demo_repo)


def test_dvc_exp_run_s_turns_tracking_on(demo_repo):
    """A tracker turned on from the command line in one `dvc exp run -S`: the stage writes its logs
    inside the training folder DVC already records (dvc.yaml's stages are the ones DVC started with;
    `resolve` adds the tracker's metrics to its views), and `dvc exp show` reads them."""
    pytest.importorskip("dvclive")
    key = "++experiments.cross_encoder.finetune.tracking=[dvclive]"
    before = (demo_repo / "params.yaml").read_text()
    run([DVC, "exp", "run", "-n", "tracked", "-S", key], demo_repo)
    assert changed_lines(before, (demo_repo / "params.yaml").read_text()) == 1
    live = "results/experiments/cross_encoder/finetune/dvclive/metrics.json"
    assert (demo_repo / live).is_file()
    assert live in yaml_load(demo_repo / "dvc.yaml")["metrics"]
    assert "up to date" in run([DVC, "status"], demo_repo)
    shown = {e["name"]: e["revs"][0]["data"] for rev in exp_show(demo_repo)
             for e in (rev.get("experiments") or [])}
    assert live in shown["tracked"]["metrics"], list(shown["tracked"]["metrics"])
    run(["git", "checkout", "params.yaml", "dvc.yaml"], demo_repo)
    run([DVC, "repro"], demo_repo)
    assert "up to date" in run([DVC, "status"], demo_repo) and snakemake_plan(demo_repo) == set()


def yaml_load(path: Path):
    import yaml

    return yaml.safe_load(path.read_text())


# a task added as docs/extending.md adds one (the demo's SST files as a 0-4 score), trained by one
# experiment; and one experiment's learning rate
SST_SCORE = ("{title:'sentiment score',range:[0,4],files:{format:tsv,train:data/demo/ids-sst-train.csv,"
             "dev:data/demo/ids-sst-dev.csv,texts:[sentence],label:sentiment,id:id}}")
ENGINE_EDITS = {
    "a task added": ([f"++tasks.sst_score={SST_SCORE}",
                      "++experiments.cross_encoder.finetune.tasks=[sst,para,sts,sst_score]"],
                     {"prepare"} | CHAIN),
    "an lr": (["++experiments.cross_encoder.finetune.lr=1e-3"], CHAIN),
}


@pytest.mark.parametrize("edit", ENGINE_EDITS)
def test_an_edit_reruns_the_same_jobs_under_both_engines(demo_repo, edit):
    """The same edit of params.yaml re-runs the same jobs under `dvc repro` as under Snakemake: a task
    added re-runs prepare and the jobs that read the new task's files, not every job that reads the
    prepared data (dvc.yaml lists the files each job reads). A task added changes what the stages of
    its experiment read: DVC's first run writes the new dvc.yaml and stops, saying so in one line
    (DVC planned that run from the old file); the next runs the jobs."""
    from dvc.utils.hydra import apply_overrides

    overrides, expected = ENGINE_EDITS[edit]
    ran = {}
    for engine in ("dvc", "snakemake"):
        apply_overrides(demo_repo / "params.yaml", overrides)
        try:
            if engine == "dvc":
                first = subprocess.run([DVC, "repro"], cwd=demo_repo, capture_output=True, text=True, timeout=900)
                log = first.stdout + first.stderr
                if "tasks" in " ".join(overrides):
                    assert first.returncode != 0 and "error: dvc.yaml: rewritten for params.yaml (changed: " in log \
                        and "run the same command again" in log and stages_run(log) == {"resolve"}, log[-3000:]
                    log = run([DVC, "repro"], demo_repo)
                else:
                    assert first.returncode == 0, log[-3000:]
                ran[engine] = {s.replace("-", "@", 1) for s in stages_run(log)} - {"resolve"}
            else:
                log = run([SNAKEMAKE, "--cores", "2", "--printshellcmds"], demo_repo, timeout=900)
                ran[engine] = job_ids(demo_repo, commands_run(log))
                why = "\n".join(re.findall(r"^(?:Job \d+: .*|Reason: .{0,300})", log, re.M))   # Snakemake's
        finally:
            run(["git", "checkout", "params.yaml", "dvc.yaml"], demo_repo)
            run([DVC, "repro"], demo_repo)             # the committed results back, from DVC's cache
    assert ran["dvc"] == ran["snakemake"] == expected, (ran, why)
    assert snakemake_plan(demo_repo) == set() and "up to date" in run([DVC, "status"], demo_repo)


def tree(folder: Path) -> dict[str, tuple]:
    """Every file under `folder`: its bytes' hash and its date."""
    import hashlib

    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_other_params_beside_the_demo_leave_its_results_alone(demo_repo):
    """A dry run of other params (any `--config`) writes nothing a run relies on; a run of them in a
    results folder of their own (`--config results=DIR`, the README's way) leaves the demo's results,
    job files and report as they were: the demo then has nothing to do under either engine."""
    other = yaml_load(demo_repo / "params.yaml")
    other["experiments"] = {"cross_encoder": other["experiments"]["cross_encoder"]}
    other["ensembles"], other["studies"], other["export"] = {}, [], {"experiments": []}
    other["papers"] = {}
    import yaml

    (demo_repo / "laptop.yaml").write_text(yaml.safe_dump(other, sort_keys=False))
    results, reports = tree(demo_repo / "results"), tree(demo_repo / "reports")
    for config in (["params=laptop.yaml"], ["params=laptop.yaml", "set=base.seed=3"], [f"set={KEY}=concat"]):
        run([SNAKEMAKE, "-n", "--cores", "2", "--config", *config], demo_repo)
        run([SNAKEMAKE, "--summary", "--config", *config], demo_repo)
        assert tree(demo_repo / "results") == results, config
    run([SNAKEMAKE, "--cores", "2", "--config", "params=laptop.yaml", "results=results-laptop"], demo_repo,
        timeout=900)
    assert (demo_repo / "results-laptop/reports/final.html").is_file()
    assert (demo_repo / "results-laptop/experiments/cross_encoder/metrics.json").is_file()
    assert tree(demo_repo / "results") == results and tree(demo_repo / "reports") == reports
    assert snakemake_plan(demo_repo) == set() and "up to date" in run([DVC, "status"], demo_repo)
    shutil.rmtree(demo_repo / "results-laptop")
    (demo_repo / "laptop.yaml").unlink()
