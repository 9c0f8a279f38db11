"""The pipeline's real jobs against the isolated training step, measured in the same run on the same device.

    python bench/gpu_pipeline.py                          # CUDA: 4 of the paper scale's fine-tunes side by side, 60 s
    python bench/gpu_pipeline.py --jobs 8 --seconds 90 --sharing mps
    python bench/gpu_pipeline.py --device cpu --model tiny --jobs 1 --seconds 20   # a CPU: the host's work per update
    python bench/gpu_pipeline.py --quick                  # smoke run on a CPU (tests/test_bench.py)

The paper scale (`catalogue: papers`, `scale: paper`, params/papers.yaml) is planned in a
scratch folder as the engines plan it (its job files), with the model and device given here, and
its prepare job runs. Then, for each kind of job, the real thing against its isolated step, in rounds:

- **fine-tune**: N of the scale's fine-tune jobs run side by side as the engines run them
  (`python -m stages.finetune --job FILE`, on CUDA through workflow/gpu_slot.py: time slices or
  MPS). Once every one has made its first update, rounds: the jobs run for `--seconds` (paused
  otherwise: SIGSTOP), each one's updates per second read from its own progress file (the update
  counter and the time it wrote there, every 2 s) and per second of CPU time its process used; then
  the isolated steps, side by side in as many processes, each built as its stage builds its run
  (its data, model, heads, plan, the captured step on CUDA), run the very updates their real job
  just made (the same tasks, batches, learning rates), timed alone: no batch drawn in the timing,
  no evaluation, no checkpoint, no progress;
- **pretrain**: the scale's MLM pretraining job against its isolated update the same way;
- **predict**: a prediction job (the first picked fine-tune's, from a model.pt written for it),
  its rows per second over its whole run and over its forward passes alone (its run record says),
  against the training loop's evaluation pass over the same dev rows in one warm process
  (`dev_metrics`).

Printed per job: the medians over rounds (min-max) of the isolated step's updates/s, the real
job's, their ratio (real / isolated: the share of the job's time spent in the step), the host's
time per update beside the step (1000/real - 1000/isolated), the same ratio per CPU second (on a
CPU that other work shares, what the job itself did), and its time to the first update; then all
jobs together. Nothing here checks a time: the test runs it at a tiny size and reads what it prints.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# as every process of the pipeline runs (minbert/__init__.py), before torch loads OpenMP: its threads
# sleep while they wait, so that the steps timed here meet the cores as the jobs do
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128}


# ---------------------------------------------------------------- the scratch pipeline

def tiny_model(folder: Path) -> Path:
    """A 2-layer hidden-64 BERT with random weights and MiniLM's vocabulary (bench/steps.py's tiny)."""
    import torch

    from minbert.model.bert import BertConfig, BertModel
    from minbert.model.weights import packaged_minilm_folder, save_hf_folder

    if not (folder / "config.json").is_file():
        torch.manual_seed(0)
        save_hf_folder(folder, BertModel(BertConfig(**TINY)), tokenizer_folder=packaged_minilm_folder())
    return folder


def data_dirs(which: str) -> tuple[Path, Path | None]:
    """(the CS224N files, the NLI file): the real data beside the repository, else the demo's."""
    shared = REPO.parent / "shared" / "data"
    if which == "real" and (shared / "cs224n" / "quora-train.csv").is_file():
        return shared / "cs224n", shared / "nli" / "snli-sample.jsonl"
    return REPO / "data" / "demo", REPO / "data" / "demo" / "nli-sample.jsonl"


def catalogue_file(name: str) -> Path:
    """A catalogue's file: params/NAME.yaml, or params.yaml for the demo's."""
    return REPO / "params.yaml" if name == "demo" else REPO / "params" / f"{name}.yaml"


def write_params(work: Path, args) -> Path:
    """The catalogue's file as it stands, its scale, model, device, threads and data set here."""
    import yaml

    raw = yaml.safe_load(catalogue_file(args.catalogue).read_text(encoding="utf-8"))
    raw.pop("catalogue", None)
    data, nli = data_dirs(args.data)
    if "scales" in raw:
        raw["scale"] = args.scale
    raw["data"].update(dir=str(data), nli_file=str(nli) if nli and nli.is_file() else None)
    if not (data / "ids-cfimdb-train.csv").is_file():      # the demo data: 004's Objective 2 left out
        raw["data"]["include_cfimdb"] = False
        raw["studies"] = [st for st in raw["studies"] if st.get("name") != "p004_objective2"]
        raw["experiments"] = {k: v for k, v in raw["experiments"].items() if not k.startswith("p004_obj2")}
    raw["base"].update(model=args.model_path, device=args.device, threads=args.threads)
    path = work / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def plan(params: Path):
    """Every job of the params file, its job file written (the engines' planning)."""
    from minbert.pipeline.plan import pipeline, write_job_file

    jobs = pipeline(params)
    for job in jobs:
        write_job_file(job)
    return jobs


def child_env(args, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": str(threads)}
    if args.sharing == "slices":
        env["MINBERT_MPS"] = "0"
    return env


def command(args, job, n: int) -> list[str]:
    """The engines' command of a job (on CUDA through the GPU slot wrapper, n jobs per GPU), forced:
    a job that ran here before runs again, from the start (its resumable state removed first)."""
    import shutil

    from minbert.core.layout import Layout

    shutil.rmtree(Layout(job.results).state(job.stage, job.name), ignore_errors=True)
    cmd = job.cmd.split() + ["--force"]
    cmd[0] = sys.executable
    if args.device == "cuda":
        cmd = [sys.executable, "-m", "workflow.gpu_slot", "--count", "1", "--per-gpu", str(n),
               "--mps", "auto" if args.sharing == "mps" else "off", "--", *cmd]
    return cmd


def run_to_end(args, job, threads: int) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(command(args, job, 1), env=child_env(args, threads), capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"{job.id} failed:\n{out.stderr[-3000:]}")
    return time.perf_counter() - t0


def pick(jobs, stage: str, n: int, names: list[str] | None, runnable) -> list:
    """n jobs of `stage`: those named, else one seed of each row whose inputs exist now, the rows that
    train the encoder first, taken in turn from each batch size (so that a few jobs cover the scale's
    shapes), in the plan's order."""
    of_stage = [j for j in jobs if j.stage == stage]
    if names:
        chosen = [j for j in of_stage if j.name in names]
        missing = set(names) - {j.name for j in chosen}
        if missing:
            raise SystemExit(f"no {stage} job named {', '.join(sorted(missing))} in this scale")
        return chosen
    rows: dict[str, object] = {}
    for job in of_stage:
        if runnable(job):
            rows.setdefault(job.name.split(".seed")[0], job)
    by_batch: dict[int, list] = {}
    for job in rows.values():
        if not job.settings["finetune"]["freeze_encoder"]:
            by_batch.setdefault(job.settings["finetune"]["batch_size"], []).append(job)
    turns = [j for group in itertools.zip_longest(*by_batch.values()) for j in group if j is not None]
    return (turns + [j for j in rows.values() if j not in turns])[:n]


def reads_made_by(job, made: set[str]) -> bool:
    """Whether every input of `job` that some job makes is one of `made`."""
    return all(dep in made or not dep.startswith("results/") or dep.startswith("results/jobs/")
               for dep in job.deps)


# ---------------------------------------------------------------- real jobs and isolated steps, in rounds

def progress_file(job) -> Path:
    from minbert.core.layout import Layout
    from minbert.core.progress import PROGRESS_FILE

    return Path(Layout(job.results).state(job.stage, job.name)) / PROGRESS_FILE


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system, every thread) a process has used (Linux: /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RealJobs:
    """Jobs run as the engines run them, side by side, each in a process group of its own that can be
    paused (SIGSTOP) while the isolated steps run and resumed (SIGCONT) for its own rounds. A job's
    rate in a round comes from its progress file: the updates it had made and when it wrote them
    (every 2 s), between the first and last writes of that round."""

    def __init__(self, args, jobs: list, threads: int):
        self.jobs, self.launched = jobs, time.time()
        self.procs = [subprocess.Popen(command(args, job, len(jobs)), env=child_env(args, threads),
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                       start_new_session=True) for job in jobs]
        self.first: dict[str, float] = {}

    def _read(self, job):
        try:
            info = json.loads(progress_file(job).read_text())
        except (OSError, ValueError):
            return None
        return (info["updated"], info["update"]) if info.get("update") else None

    def _check(self) -> None:
        for job, p in zip(self.jobs, self.procs):
            if p.poll() not in (None, 0):
                raise SystemExit(f"{job.id} failed:\n{p.stderr.read()[-3000:]}")
            if p.poll() == 0:
                raise SystemExit(f"{job.id} finished before the rounds did: give it more work (another job, the "
                                 f"real data) or fewer, shorter rounds")

    def started(self) -> None:
        """Wait until every job has made its first update, then pause them all."""
        while len(self.first) < len(self.jobs):
            self._check()
            for job in self.jobs:
                sample = self._read(job)
                if sample and job.id not in self.first:
                    self.first[job.id] = sample[0] - self.launched
            time.sleep(0.2)
        self.signal(signal.SIGSTOP)

    def signal(self, sig, procs=None) -> None:
        for p in procs or self.procs:
            os.killpg(p.pid, sig)

    def round(self, seconds: float) -> list[dict]:
        """Resume every job for about `seconds`, each paused again at its first progress write after
        them; per job its updates per second and per CPU second between its first and last writes of
        the round (the CPU time of its process read as each write appears), and which updates those
        were (the run's update counter at both: `updates`)."""
        first: dict[str, tuple] = {}
        last: dict[str, tuple] = {}
        seen = {j.id: self._read(j) for j in self.jobs}
        t0 = time.time()
        self.signal(signal.SIGCONT)
        while len(last) < len(self.jobs):
            self._check()
            for job, p in zip(self.jobs, self.procs):
                sample = self._read(job)
                if job.id in last or sample is None or sample == seen[job.id]:
                    continue
                seen[job.id] = sample
                point = (*sample, cpu_seconds(p.pid))
                if job.id not in first:
                    first[job.id] = point
                elif time.time() - t0 >= seconds:
                    self.signal(signal.SIGSTOP, [p])
                    last[job.id] = point
            time.sleep(0.01)
        out = []
        for j in self.jobs:
            (t0, u0, c0), (t1, u1, c1) = first[j.id], last[j.id]
            out.append({"rate": (u1 - u0) / (t1 - t0), "cpu_rate": (u1 - u0) / max(c1 - c0, 1e-9), "updates": (u0, u1)})
        return out

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


class Isolated:
    """Each job's isolated step in a process of its own (`worker`), all side by side: each builds its
    run as the stage does; then, round by round, runs the very updates its real job made in the round
    before (the same tasks, batches and learning rates, drawn as the run draws them), timed alone."""

    def __init__(self, args, jobs: list, threads: int):
        self.jobs = jobs
        # each in a session of its own, as each real job: where the kernel shares the CPU between
        # sessions (autogroups), a process in the benchmark's own session would get less of it
        self.procs = [subprocess.Popen([sys.executable, __file__, "--worker", job.job_file],
                                       env=child_env(args, threads), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, start_new_session=True) for job in jobs]
        for job, p in zip(jobs, self.procs):
            if p.stdout.readline().strip() != "ready":
                p.wait()
                raise SystemExit(f"the isolated step of {job.id} failed:\n{p.stderr.read()[-3000:]}")

    def round(self, ranges: list[tuple[int, int]]) -> list[dict]:
        for p, (u0, u1) in zip(self.procs, ranges):
            p.stdin.write(f"{u0} {u1}\n")
            p.stdin.flush()
        out = []
        for job, p in zip(self.jobs, self.procs):
            line = p.stdout.readline()
            if not line:
                p.wait()
                raise SystemExit(f"the isolated step of {job.id} failed:\n{p.stderr.read()[-3000:]}")
            out.append(json.loads(line))
        return out

    def stop(self) -> None:
        for p in self.procs:
            p.stdin.close()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def rounds(args, jobs: list, threads: int) -> list[dict]:
    """Rounds of `args.seconds` of the real jobs, each followed by their isolated steps on the updates
    they just made: per job, the medians over rounds of each rate and of the per-round ratios real /
    isolated (per second, and per second of CPU time), with their min-max."""
    real = RealJobs(args, jobs, threads)
    try:
        real.started()
        iso = Isolated(args, jobs, threads)
        try:
            got = []
            for _ in range(args.rounds):
                made = real.round(args.seconds)
                got.append((made, iso.round([m["updates"] for m in made])))
        finally:
            iso.stop()
    finally:
        real.stop()
    out = []
    for k, job in enumerate(jobs):
        r, i = [m[k] for m, _ in got], [t[k] for _, t in got]
        out.append({"job": job, "real": [x["rate"] for x in r], "iso": [x["rate"] for x in i],
                    "first": real.first[job.id], "ratios": [a["rate"] / b["rate"] for a, b in zip(r, i)],
                    "cpu_ratios": [a["cpu_rate"] / b["cpu_rate"] for a, b in zip(r, i)]})
    return out


def serve(walk, step, sync, cuda: bool) -> None:
    """Say "ready", then for each line "u0 u1" read from stdin run the run's updates u0 to u1 - 1 as
    `walk` draws them (every update of the run, in order: (its index, its batches)), timed, and print
    their rates (per second, per CPU second of this process) as a JSON line. On CUDA each range runs
    once untimed first (its shapes captured, as the real job had them)."""
    print("ready", flush=True)
    drawn = iter(walk)
    for line in sys.stdin:
        u0, u1 = (int(x) for x in line.split())
        todo = []
        for index, batches in drawn:
            if index >= u0:
                todo.append((index, batches))
            if index + 1 >= u1:
                break
        if cuda:
            for index, batches in todo:
                step(index, batches)
            sync()
        t0, c0 = time.perf_counter(), time.process_time()
        for index, batches in todo:
            step(index, batches)
        sync()
        n = max(len(todo), 1)
        print(json.dumps({"rate": n / (time.perf_counter() - t0), "cpu_rate": n / max(time.process_time() - c0, 1e-9)}),
              flush=True)


def worker(job_file: str) -> None:
    """The isolated step of one job: its run built by the stage's own code, the training function
    swapped for `serve`, which runs the updates it is asked for alone."""
    import torch

    from minbert.pipeline.job import Job

    described = json.loads(Path(job_file).read_text(encoding="utf-8"))["description"]
    job = Job.read(job_file, described["stage"], described["name"])
    cuda = torch.cuda.is_available() and job.settings.get("device") in ("auto", "cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if job.stage == "finetune":
        from minbert.params.settings import FinetuneSettings
        from minbert.train import experiment, loop
        from minbert.train.training import FitOptions, TrainState

        def fit(model, tokenizer, train, dev, cfg, options):
            tr, plan_ = loop.start_run(model, tokenizer, train, dev, cfg, options)
            loop.store_frozen_features(tr, plan_)
            state = TrainState()

            def walk():                          # the run's updates in order, as run_epoch draws them
                index = 0
                for (phase, epoch), updates in plan_.epochs.items():
                    state.phase, state.epoch = phase, epoch
                    streams = loop.epoch_streams(tr, state, plan_)
                    for tasks in updates:
                        yield index, loop.draw_update(streams, tasks, cfg.gradient_accumulation_steps)
                        index += 1

            def step(index, batches):
                state.update = index
                loop.update(tr, state, plan_, *batches)
                if index % 64 == 0:              # the outputs the totals keep: an epoch's at most
                    tr.totals.reset()
            loop.train_mode(tr)
            serve(walk(), step, sync, cuda)

        experiment.fit = fit
        scratch = Path(tempfile.mkdtemp(prefix="isolated-"))
        options = FitOptions(scratch / "out", state_dir=scratch / "state", resume=False, progress=False)
        experiment.finetune_experiment(FinetuneSettings(**job.settings), _folder(job.reads["splits"]), options,
                                       cache_dir=_cache(job))
    elif job.stage == "pretrain":
        from minbert.params.settings import PretrainSettings
        from minbert.train import pretrain

        def train(objective, pparams, s, runtime, desc, *_, **__):
            u, sampler, per_epoch = pretrain.start_updates(objective, pparams, s, runtime, desc)

            def walk():                          # the run's steps in order, as `train` draws them
                index = 0
                for epoch in range(1, pparams.epochs + 1):
                    sampler.set_epoch(epoch)
                    for _, indices in zip(range(per_epoch), sampler):
                        yield index, objective.batch("train", indices, runtime.device)
                        index += 1
            for m in objective.modules():
                m.train()
            serve(walk(), lambda index, batch: u.step(batch, index), sync, cuda)
            raise _Timed

        pretrain.train = train
        s = PretrainSettings(**job.settings)
        data = pretrain.read_pretraining_data(_folder(job.reads["splits"]), s)
        try:
            if s.pretraining.kind == "mlm":
                pretrain.pretrain_mlm(s, data, s.model, _cache(job))
            else:
                pretrain.pretrain_nli(s, data, s.model, _cache(job), _folder(job.reads["splits"]))
        except _Timed:
            pass


class _Timed(Exception):
    """The isolated pretraining step has been timed: the rest of the job does not run."""


def _folder(paths: list[str]) -> str:
    from minbert.pipeline.stage import folder_of

    return folder_of(paths)


def _cache(job) -> str:
    from minbert.core.layout import Layout

    return Layout(job.results).token_cache


# ---------------------------------------------------------------- prediction

def prediction(args, predict_job, finetune_job, threads: int) -> dict:
    """The prediction job (its model.pt written here: the fine-tune's model before training) over
    its whole run, and the training loop's evaluation pass over the same dev rows (`evaluation_pass`)."""
    import torch

    from minbert.model.checkpoint import save_checkpoint
    from minbert.model.multitask import MultitaskModel
    from minbert.model.tokenizer import Tokenizer
    from minbert.model.weights import load_encoder
    from minbert.params.settings import FinetuneSettings, PredictSettings

    s = FinetuneSettings(**finetune_job.settings)
    ps = PredictSettings(**predict_job.settings)
    torch.manual_seed(0)
    encoder, _, folder = load_encoder(s.model)
    model = MultitaskModel(encoder, s.finetune.heads, s.finetune.tasks)
    path = Path(predict_job.reads["model"][0])
    path.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(path, model, Tokenizer(folder, s.max_length), experiment=finetune_job.name, stage=ps.model_stage)
    wall = run_to_end(args, predict_job, threads)
    record = json.loads(Path(predict_job.run_record).read_text())
    rows = sum(record["files"].values())
    out = subprocess.run([sys.executable, __file__, "--eval-pass", predict_job.job_file, "--device", args.device],
                         env=child_env(args, threads), capture_output=True, text=True, start_new_session=True,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"the evaluation pass failed:\n{out.stderr[-3000:]}")
    evaluation = json.loads(out.stdout.strip().splitlines()[-1])
    part = (record.get("seconds") or {}).get("predict")
    return {"job": predict_job, "rows": rows, "wall": wall, "job_rows_per_s": rows / wall,
            "predict_rows_per_s": rows / part if part else None, **evaluation}


def evaluation_pass(job_file: str, device: str) -> dict:
    """The training loop's evaluation pass (`dev_metrics`) over a prediction job's dev rows with its
    model, in a fresh process: its first pass (as a job's first) and a second one, rows per second."""
    from minbert.core.runtime import configure_precision, pick_device
    from minbert.data.batches import load_task_data
    from minbert.model.checkpoint import load_checkpoint
    from minbert.pipeline.job import Job
    from minbert.train.evaluation import dev_metrics

    described = json.loads(Path(job_file).read_text(encoding="utf-8"))["description"]
    job = Job.read(job_file, described["stage"], described["name"])
    dev_type = pick_device(device)
    precision = configure_precision(dev_type, job.settings["precision"])
    model, tok, _ = load_checkpoint(job.reads["model"][0], trust_remote_code=True)
    model.to(dev_type)
    dev = load_task_data(_folder(job.reads["splits"]), model.tasks, model.heads_cfg, tok, splits=("dev",),
                         cache_dir=_cache(job))["dev"]
    rows, rates = sum(len(d) for d in dev.values()), []
    for _ in range(2):
        t0 = time.perf_counter()
        dev_metrics(model, dev, tok, dev_type, precision)
        rates.append(rows / (time.perf_counter() - t0))
    return {"dev_rows": rows, "eval_first_rows_per_s": rates[0], "eval_rows_per_s": rates[1]}


# ---------------------------------------------------------------- printing

def machine(device: str) -> str:
    import platform

    import torch

    if device == "cuda":
        return f"GPU {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        pass
    simd = " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags) or "no AVX2"
    load = os.getloadavg()[0]
    return (f"CPU {platform.processor() or platform.machine()} ({os.cpu_count()} cores, {simd}), load average "
            f"{load:.1f} at the start, torch {torch.__version__}")


def label(job) -> str:
    """A job as the table names it: its stage, name and batch size."""
    settings = job.settings["finetune"] if job.stage == "finetune" else job.settings["pretraining"]
    return f"{job.stage} {job.name} (batch {settings['batch_size']})"


def median_range(values: list[float], digits: int = 1) -> str:
    """"median (min-max)" of finite values."""
    v = sorted(x for x in values if not math.isnan(x))
    if not v:
        return "n/a"
    return f"{statistics.median(v):,.{digits}f} ({v[0]:,.{digits}f}-{v[-1]:,.{digits}f})"


HEADER = ("| job | isolated step updates/s | real job updates/s | real/isolated | host ms/update | "
          "real/isolated per CPU second | first update s |")


def table(name_of, results: list[dict], together: bool) -> list[str]:
    """A row per job (and one for all of them together): medians over rounds, with min-max."""
    lines = []
    for r in results:
        iso, real = statistics.median(r["iso"]), statistics.median(r["real"])
        host = 1000 * (1 / real - 1 / iso) if real and iso else float("nan")
        lines.append(f"| {name_of(r['job'])} | {median_range(r['iso'])} | {median_range(r['real'])} | "
                     f"{median_range(r['ratios'], 2)} | {host:.2f} | {median_range(r['cpu_ratios'], 2)} | "
                     f"{r['first']:.1f} |")
    if together:
        iso = [sum(x) for x in zip(*(r["iso"] for r in results))]
        real = [sum(x) for x in zip(*(r["real"] for r in results))]
        lines.append(f"| all together | {median_range(iso)} | {median_range(real)} | "
                     f"{median_range([a / b for a, b in zip(real, iso)], 2)} | | | |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=4, help="fine-tune jobs side by side (default 4)")
    ap.add_argument("--experiments", default=None, help="which fine-tunes (comma-separated names; default: one seed "
                    "of a row of each batch size in turn, rows that train the encoder and start from no "
                    "pretraining first)")
    ap.add_argument("--seconds", type=float, default=None, help="each round's time for the real jobs, and as much "
                    "for the isolated steps (default 20, quick 3; a job writes its progress every 2 s)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds, alternating which goes first (default 3, "
                    "quick 1)")
    ap.add_argument("--model", default=None, help="the encoder: a name or folder, or 'tiny' (a 2-layer random BERT); "
                    "default: the catalogue's")
    ap.add_argument("--catalogue", default="papers", help="params/NAME.yaml (default papers), or demo: "
                    "params.yaml's")
    ap.add_argument("--scale", default="paper")
    ap.add_argument("--data", default="real", choices=["real", "demo"], help="the CS224N files (else the demo's)")
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=None, help="torch threads per job (default: the cores shared out)")
    ap.add_argument("--sharing", default="slices", choices=["slices", "mps"], help="how jobs share a GPU")
    ap.add_argument("--skip", default="", help="parts left out: finetune, pretrain, predict (comma-separated)")
    ap.add_argument("--work", default=None, help="the scratch folder (default: a new temporary one)")
    ap.add_argument("--quick", action="store_true", help="smoke run on a CPU: a tiny model, the demo data, 1 job, 3 s")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--eval-pass", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # the jobs it started are stopped on the way out
    if args.worker:
        worker(args.worker)
        return 0
    if args.eval_pass:
        print(json.dumps(evaluation_pass(args.eval_pass, args.device)))
        return 0
    if args.quick:
        args.jobs, args.model, args.data, args.device = 1, "tiny", "demo", "cpu"
        args.seconds, args.rounds, args.threads = args.seconds or 3.0, args.rounds or 1, args.threads or 1
        args.experiments = args.experiments or "p000_mt_sequential_rr.seed11711"
    args.seconds, args.rounds = args.seconds or 20.0, args.rounds or 3
    if args.work:
        return measure_all(args, Path(args.work).resolve())
    import shutil

    scratch = Path(tempfile.mkdtemp(prefix="gpu-pipeline-"))
    try:
        return measure_all(args, scratch)
    finally:
        os.chdir(REPO)
        shutil.rmtree(scratch, ignore_errors=True)


def measure_all(args, work: Path) -> int:
    """Plan the scale in `work`, run its prepare job, then measure and print (see the module docstring)."""
    work.mkdir(parents=True, exist_ok=True)
    args.model_path = str(tiny_model(work / "tiny-bert")) if args.model == "tiny" else args.model
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(1, args.jobs))
    os.chdir(work)
    if args.model_path is None:
        import yaml

        args.model_path = yaml.safe_load(catalogue_file(args.catalogue).read_text())["base"]["model"]
    jobs = plan(write_params(work, args))
    prepare = [j for j in jobs if j.stage == "prepare"]
    for job in prepare:
        run_to_end(args, job, threads)
    made = {o for j in prepare for o in j.outputs}
    names = args.experiments.split(",") if args.experiments else None
    finetunes = pick(jobs, "finetune", args.jobs, names, lambda j: reads_made_by(j, made))
    print(f"{args.catalogue} catalogue, scale {args.scale}; model {args.model or args.model_path}; "
          f"data {data_dirs(args.data)[0]}; {machine(args.device)}")
    skip = set(args.skip.split(","))
    print(f"{len(finetunes)} fine-tune job(s) side by side, {threads} thread(s) each"
          + (f", sharing the GPU by {'MPS' if args.sharing == 'mps' else 'time slices'}" if args.device == "cuda"
             else "") + f"; {args.rounds} round(s) of {args.seconds:g} s of the real jobs, each followed by their "
          "isolated steps on the same updates")
    print("\n" + HEADER)
    print("|---|---|---|---|---|---|---|")
    groups = [finetunes] if "finetune" not in skip else []
    if "pretrain" not in skip:
        pre = [j for j in jobs if j.stage == "pretrain" and j.settings["pretraining"]["kind"] == "mlm"][:1]
        # the MLM pretraining alone (a smoke run: beside the fine-tunes, one round for both)
        groups = [groups[0] + pre] if args.quick and groups else groups + [pre]
    for group in (g for g in groups if g):
        results = rounds(args, group, threads)
        for line in table(label, results, sum(j.stage == "finetune" for j in group) > 1):
            print(line)
    if "predict" not in skip:
        pj = next((j for j in jobs if j.stage == "predict" and j.name == finetunes[0].name), None)
        if pj is not None:
            p = prediction(args, pj, finetunes[0], threads)
            print(f"\nprediction, {pj.name}: {p['rows']:,} rows in {p['wall']:.1f} s, the whole job "
                  f"{p['job_rows_per_s']:,.1f} rows/s"
                  + (f", its forward passes {p['predict_rows_per_s']:,.1f} rows/s" if p["predict_rows_per_s"] else "")
                  + f"; the training loop's evaluation pass over its {p['dev_rows']:,} dev rows in a fresh process: "
                  f"first {p['eval_first_rows_per_s']:,.1f} rows/s, again {p['eval_rows_per_s']:,.1f} rows/s")
            print("prediction / evaluation pass, per row: "
                  + (f"forward passes / first pass {p['predict_rows_per_s'] / p['eval_first_rows_per_s']:.2f}, "
                     f"/ again {p['predict_rows_per_s'] / p['eval_rows_per_s']:.2f}; " if p["predict_rows_per_s"] else "")
                  + f"whole job / first pass {p['job_rows_per_s'] / p['eval_first_rows_per_s']:.2f}")
    print("medians over the rounds (min-max); real/isolated: the median of the rounds' ratios (1: the job runs at "
          "its step's speed); host ms/update: what the job spends per update beyond its step, 1000/real - "
          "1000/isolated; per CPU second: the same ratio of updates per second of CPU time its process used (on a "
          "CPU shared with other work, what the job itself did); first update: seconds from its launch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
