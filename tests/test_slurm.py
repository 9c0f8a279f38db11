"""profiles/slurm against a real Slurm cluster. scripts/slurm_cluster.sh starts a private one-machine
cluster (installing Debian's slurm-wlm and munge when they are missing): no accounting, like a
cluster without slurmdbd; a node with one emulated GPU (the default partition `gpu`) and a node
without (partition `cpu`). The tiny pipeline of test_workflow.py then runs three times at once in
temporary copies of the repository: locally (`snakemake --cores 2`), through the profile as shipped,
and (experiment a only) through the profile with `--config gpu=0` on the GPU-less partition. Every
job must have gone through sbatch with its rule's CPUs, memory, time and GPU, and the metrics and
predictions must equal the local run's. The daemons are stopped at the end.

The cluster tests (slow) skip, with the reason, when not root or when Slurm cannot be installed or
its daemons cannot start; they take about 4 minutes on 2 CPU cores. One quick test plans (-n) the
pipeline with the shipped profile and with its placeholders filled in.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_workflow import make_copy, tiny_params  # noqa: E402  (tests/ is on sys.path under pytest)

from workflow import dag  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm_cluster.sh"
SNAKEMAKE = shutil.which("snakemake")
NODE_CPUS = 2           # each test node declares 2 CPUs (slurm.conf; not probed)
NODE_MEM_MB = 65536     # and 64 GB, so that the rules' memory requests fit (emulated, like the GPU)
RUN_TIMEOUT = 900       # seconds for the three pipelines together (a lost job would wait forever)
CPU_ONLY_TARGET = "results/experiments/a/metrics.json"   # the CPU-only run: experiment a (no pretraining)
ACCOUNT = "minbert_test"   # the CPU-only run's account
# Faster status polling than a real cluster needs (the plugin waits 40 s before its first check)
FAST_POLLING = ["--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "1"]

pytestmark = pytest.mark.skipif(SNAKEMAKE is None, reason="snakemake is not installed (pip install -e .[workflow])")


# ---------------------------------------------------------------- the cluster

@dataclass
class Cluster:
    state: Path
    env: dict            # os.environ with SLURM_CONF and the cluster's client commands first on PATH
    cpu_partition: str | None   # the GPU-less partition, when its node started

    def cmd(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=60)
        if check:
            assert r.returncode == 0, f"{' '.join(args)}: {r.stdout}{r.stderr}"
        return r

    def jobs(self, run_id: str) -> list[dict]:
        """Every Slurm job of one Snakemake run (its jobs are named after the run's id), as scontrol's
        key=value fields; finished jobs stay listed for MinJobAge (1 h here)."""
        out = self.cmd("scontrol", "-d", "show", "job", "--oneliner").stdout
        jobs = []
        for line in out.splitlines():
            fields: dict[str, str] = {}
            for key, value in re.findall(r"(\S+?)=(\S*)", line):
                fields.setdefault(key, value)
            if fields.get("JobName") == run_id:
                jobs.append(fields)
        return jobs


@pytest.fixture(scope="module")
def cluster():
    if os.geteuid() != 0:
        pytest.skip("needs root: scripts/slurm_cluster.sh installs slurm-wlm and munge and runs the Slurm daemons")
    pytest.importorskip("snakemake_executor_plugin_slurm", reason="the Slurm executor plugin is not installed")
    state = Path(tempfile.mkdtemp(prefix="minbert-slurm-"))   # short: munge's socket path must stay short
    env = {**os.environ, "MINBERT_SLURM_DIR": str(state), "SLURM_NODE_CPUS": str(NODE_CPUS),
           "SLURM_NODE_MEM_MB": str(NODE_MEM_MB), "SLURM_NODE_GPUS": "1", "SLURM_CPU_NODE": "1"}
    stop = lambda: subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=120)  # noqa: E731
    r = subprocess.run(["bash", str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        stop()
        shutil.rmtree(state, ignore_errors=True)
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("slurm_cluster:")]
        reason = lines[-1] if lines else (r.stderr.strip().splitlines() or ["no output"])[-1]
        if r.returncode in (3, 4):     # 3: cannot install; 4: the daemons did not start
            pytest.skip(f"no Slurm test cluster: {reason}")
        pytest.fail(f"scripts/slurm_cluster.sh start failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
    client_env = {**os.environ, "SLURM_CONF": str(state / "slurm.conf"),
                  "PATH": f"{state / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    try:
        sinfo = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %P %t"], env=client_env, capture_output=True,
                               text=True, timeout=60).stdout.split("\n")
        cpu_partition = "cpu" if any(ln.split()[1:] == ["cpu", "idle"] for ln in sinfo if ln.strip()) else None
        yield Cluster(state, client_env, cpu_partition)
    finally:
        stop()
        shutil.rmtree(state, ignore_errors=True)


# ---------------------------------------------------------------- the three runs

@dataclass
class Run:
    folder: Path
    cmd: list[str]
    returncode: int | None
    log: str
    seconds: float

    def check(self) -> None:
        assert self.returncode == 0, (f"{' '.join(self.cmd)} " +
                                      ("timed out" if self.returncode is None else f"failed ({self.returncode})") +
                                      f":\n{self.log[-5000:]}")


def cluster_params() -> dict:
    """The tiny pipeline less its second pretraining and its student (every rule but teach still
    runs: data, pretraining, fine-tuning, prediction, evaluation, ensemble, report): each job through
    Slurm costs a submission and two Python start-ups, on cores three pipelines share."""
    p = tiny_params("models/tiny")
    del p["experiments"]["c"], p["experiments"]["d"], p["pretrainings"]["pf"]
    p["studies"] = [{"name": "s", "title": "Tiny study", "experiments": ["a", "b", "ab"]}]
    return p


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory, repo_root, tiny_model_dir) -> dict[str, Run]:
    """The tiny pipeline three times at once: everything locally; everything through the profile as
    shipped (no partition or account in it: the jobs go to the default partition); experiment a (data,
    fine-tuning and prediction, which ask for a GPU unless gpu=0, evaluation) through the profile with
    gpu=0 on the GPU-less partition. `--max-threads` caps the rules' threads at the nodes' 2 CPUs (this
    cluster refuses a job that asks for more CPUs than a node has; others leave it pending forever)."""
    slurm = [SNAKEMAKE, "--profile", "profiles/slurm", "--max-threads", str(NODE_CPUS), *FAST_POLLING]
    cpu_only = [CPU_ONLY_TARGET, "--config", "gpu=0"]   # the target first: --config takes every word after it
    # the documented way to pick a partition and account for one run: it replaces the profile's (empty)
    # default-resources block, and the rules keep their own resources (an account is accepted, unchecked,
    # by a cluster without accounting)
    cpu_only += ["--default-resources", f"slurm_partition={cluster.cpu_partition or 'gpu'}", f"slurm_account={ACCOUNT}"]
    commands = {
        "local": ([SNAKEMAKE, "--cores", str(NODE_CPUS)], os.environ),
        "slurm": (slurm, cluster.env),
        "slurm_cpu": (slurm + cpu_only, cluster.env),
    }
    procs = {}
    for name, (cmd, env) in commands.items():
        folder = tmp_path_factory.mktemp(name)
        make_copy(repo_root, folder, tiny_model_dir, cluster_params())
        log = open(folder.parent / f"{folder.name}.log", "w")
        # one torch thread per stage: three pipelines share this machine's cores, and spinning
        # OpenMP threads on busy cores slow every run several-fold (the results do not depend on it:
        # the three runs use the same setting)
        env = {**env, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        procs[name] = (folder, cmd, log, time.monotonic(),
                       subprocess.Popen(cmd, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True))
    deadline = time.monotonic() + RUN_TIMEOUT
    ended: dict[str, tuple[int | None, float]] = {}
    while len(ended) < len(procs):
        for name, (folder, cmd, log, start, proc) in procs.items():
            if name not in ended and proc.poll() is not None:
                ended[name] = (proc.returncode, time.monotonic() - start)
        if time.monotonic() > deadline:   # e.g. an executor that lost track of its jobs waits forever
            for name, (folder, cmd, log, start, proc) in procs.items():
                if name not in ended:
                    os.killpg(proc.pid, signal.SIGTERM)
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                    ended[name] = (None, time.monotonic() - start)
        time.sleep(0.5)
    out = {}
    for name, (folder, cmd, log, start, proc) in procs.items():
        log.close()
        rc, seconds = ended[name]
        out[name] = Run(folder, cmd, rc, Path(log.name).read_text(errors="replace"), seconds)
        print(f"{name}: exit {rc} after {seconds:.0f} s: {' '.join(cmd[1:])}")
    return out


# ---------------------------------------------------------------- checks

def _minutes(limit: str) -> int:
    """Slurm's time limit ([D-]HH:MM:SS) in minutes."""
    days, _, clock = limit.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return (int(days or 0) * 24 + h) * 60 + m + (s > 0)


def _megabytes(mem: str) -> int:
    m = re.fullmatch(r"([\d.]+)([KMGT]?)", mem)
    assert m, mem
    return round(float(m.group(1)) * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 ** 2}[m.group(2)])


def started_jobs(run: Run) -> Counter:
    """The jobs a run's Snakemake log shows it started (its shell commands, which --printshellcmds
    prints), each as the Slurm executor names it in a job's comment, rule_<rule>[_wildcards_<name>]
    (the rule from the run's own DAG; the target rule `all` runs nothing)."""
    from test_workflow import COMMAND

    jobs = dag.jobs("params.yaml", repo=run.folder)
    snake = dag.SnakemakeDag(jobs)
    by_cmd = {j.cmd: j for j in jobs}
    started = Counter()
    for cmd in COMMAND.findall(run.log):
        job = by_cmd[cmd]
        started[f"rule_{snake.rule_of[job.id]}" + (f"_wildcards_{job.name}" if job.name else "")] += 1
    return started


def rule_of(comment: str) -> str:
    return re.fullmatch(r"rule_(.+?)(?:_wildcards_.*)?", comment).group(1)


def check_submitted_jobs(cluster: Cluster, run: Run, local: Run, gpus: int, partition: str, account: str,
                         everything: bool = True) -> list[dict]:
    """The jobs of the local run (or some of them), each submitted through sbatch once, finished, with its
    rule's CPUs (threads capped at the node's), memory, time and GPUs."""
    run.check()
    local.check()
    expected = started_jobs(run)
    local_jobs = started_jobs(local)
    assert sum(local_jobs.values()) >= 8, local.log[-3000:]
    assert expected == local_jobs if everything else expected <= local_jobs
    assert {rule_of(c) for c in expected} >= {"prepare", "finetune", "predict", "evaluate"}
    submitted = re.findall(r"^Job \d+ has been submitted with SLURM jobid (\d+) ", run.log, flags=re.M)
    assert len(submitted) == sum(expected.values()), run.log[-3000:]
    run_id = re.search(r"^SLURM run ID: (\S+)", run.log, flags=re.M).group(1)
    jobs = cluster.jobs(run_id)
    assert sorted(j["JobId"] for j in jobs) == sorted(submitted)
    assert Counter(j["Comment"] for j in jobs) == expected
    for j in jobs:
        stage = rule_of(j["Comment"])
        want = dag.stage_resources(stage, gpus)
        where = f"{j['Comment']}: {j}"
        assert j["JobState"] == "COMPLETED", where
        assert j["Partition"] == partition and j["Account"] == account, where
        assert int(j["NumCPUs"]) == min(dag.STAGE_RESOURCES[stage]["threads"], NODE_CPUS), where
        assert _megabytes(j["MinMemoryNode"]) == want["mem_mb"], where
        assert _minutes(j["TimeLimit"]) == want["runtime"], where
        asked = j.get("TresPerJob", "(null)")     # what sbatch asked for
        got = j.get("JOB_GRES", "(null)")         # what Slurm allocated
        if want.get("gpu"):
            assert asked == f"gres:gpu:{want['gpu']}" and got.startswith(f"gpu:{want['gpu']}"), where
        else:
            assert "gpu" not in asked and "gpu" not in got, where
    return jobs


@pytest.mark.slow
def test_the_shipped_profile_submits_every_job_with_its_rule_resources(cluster, runs):
    # the default partition, no account (the profile names neither)
    jobs = check_submitted_jobs(cluster, runs["slurm"], runs["local"], gpus=1, partition="gpu", account="(null)")
    assert any(j.get("JOB_GRES", "").startswith("gpu:1") for j in jobs)


@pytest.mark.slow
def test_cpu_only_partition_with_gpu_0(cluster, runs):
    if cluster.cpu_partition:
        # the GPU-less partition refuses what the GPU stages ask for without gpu=0
        r = cluster.cmd("sbatch", "-p", cluster.cpu_partition, "--gpus=1", "--wrap", "true", check=False)
        assert r.returncode != 0 and "node configuration is not available" in r.stderr, r.stderr
    check_submitted_jobs(cluster, runs["slurm_cpu"], runs["local"], gpus=0, partition=cluster.cpu_partition or "gpu",
                         account=ACCOUNT, everything=False)


def planned_resources(profile: Path, repo_root: Path) -> list[tuple[str, dict]]:
    """`snakemake -n --forceall` with a profile (Snakemake's whole job blocks, not the one-line
    messages): each planned job's rule and resources."""
    config = re.search(r"^config: \{(.*)\}$", profile.joinpath("config.yaml").read_text(), flags=re.M)
    extra = ["--config", "messages=false"] + ([f"{k.strip()}={v.strip()}" for k, v in
                                                 (kv.split(":") for kv in config.group(1).split(","))] if config else [])
    r = subprocess.run([SNAKEMAKE, "-n", "--forceall", "--profile", str(profile), *extra], cwd=repo_root,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    planned = [(rule, dict(kv.split("=", 1) for kv in resources.split(", "))) for rule, resources
               in re.findall(r"^(?:rule|checkpoint) (\w+):\n(?:    .*\n)*?    resources: (.*)$", r.stdout, flags=re.M)
               if rule != "all"]
    assert {rule for rule, _ in planned} >= {"prepare", "finetune", "predict", "report"}, r.stdout[-3000:]
    return planned


def test_the_profile_plans_the_rule_resources(repo_root, tmp_path):
    """The shipped profile, and the profile as a user edits it for a GPU-less partition (the placeholders
    filled in, the `config: {gpu: 0}` line uncommented): every job carries its rule's memory and time,
    the partition and account when set, and a GPU for the network stages only without gpu=0."""
    shipped = (repo_root / "profiles" / "slurm" / "config.yaml").read_text()
    for rule, res in planned_resources(repo_root / "profiles" / "slurm", repo_root):
        want = dag.stage_resources(rule, 1)
        assert "slurm_partition" not in res and "slurm_account" not in res, (rule, res)
        assert int(res["mem_mb"]) == want["mem_mb"] and int(res["runtime"]) == want["runtime"], (rule, res)
        assert int(res.get("gpu", 0)) == want.get("gpu", 0), (rule, res)

    edited = shipped
    for pattern, repl in [(r"^(\s*)# slurm_partition: .*$", r'\1slurm_partition: "cpu"'),
                          (r"^(\s*)# slurm_account: .*$", rf'\1slurm_account: "{ACCOUNT}"'),
                          (r"^# config: \{gpu: 0\}$", "config: {gpu: 0}")]:
        edited, n = re.subn(pattern, repl, edited, flags=re.M)
        assert n == 1, f"profiles/slurm/config.yaml: no line {pattern}"
    (tmp_path / "config.yaml").write_text(edited)
    for rule, res in planned_resources(tmp_path, repo_root):
        want = dag.stage_resources(rule, 0)
        assert res["slurm_partition"] == "cpu" and res["slurm_account"] == ACCOUNT, (rule, res)
        assert int(res["mem_mb"]) == want["mem_mb"] and int(res["runtime"]) == want["runtime"], (rule, res)
        assert "gpu" not in res, (rule, res)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["slurm", "slurm_cpu"])
def test_results_equal_the_local_run(runs, name):
    local, other = runs["local"], runs[name]
    local.check()
    other.check()
    # everything the run made: all results, or experiment a's folder for the CPU-only run
    where = Path("results") if name == "slurm" else Path(CPU_ONLY_TARGET).parent
    found = lambda run, pattern: sorted(p.relative_to(run.folder) for p in (run.folder / where).rglob(pattern))  # noqa: E731
    metrics = found(other, "metrics.json")
    assert metrics == found(local, "metrics.json")
    assert len(metrics) >= 3 if name == "slurm" else metrics == [Path(CPU_ONLY_TARGET)]   # a, b, ab (, pretraining)
    for rel in metrics:
        assert json.loads((other.folder / rel).read_text()) == json.loads((local.folder / rel).read_text()), rel
    predictions = found(other, "predictions/*.csv")
    assert predictions and predictions == found(local, "predictions/*.csv")
    for rel in predictions:
        assert (other.folder / rel).read_bytes() == (local.folder / rel).read_bytes(), rel


@pytest.mark.slow
def test_job_states_without_accounting(cluster, runs):
    """The cluster has no accounting, so sacct fails; the plugin would pick sacct by default (the command
    exists), which loses every job. The profile asks for squeue, and MinJobAge keeps it from switching."""
    r = cluster.cmd("sacct", "-X", "--noheader", check=False)
    assert r.returncode != 0 and "accounting storage is disabled" in (r.stdout + r.stderr).lower()
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["slurm-status-command"] == "squeue"
    min_job_age = re.search(r"MinJobAge\s*=\s*(\d+)", cluster.cmd("scontrol", "show", "config").stdout)
    assert int(min_job_age.group(1)) >= 3 * 40     # the plugin's threshold with its default 40 s first wait
    for name in ("slurm", "slurm_cpu"):
        runs[name].check()
        assert "Falling back to 'sacct'" not in runs[name].log
    default = subprocess.run([sys.executable, "-c", "from snakemake_executor_plugin_slurm import "
                              "_get_status_command_default as d; print(d())"],
                             env=cluster.env, capture_output=True, text=True, timeout=60)
    if default.returncode == 0:    # a private helper of plugin 2.x: what the profile's setting overrides
        assert default.stdout.strip() == "sacct"
