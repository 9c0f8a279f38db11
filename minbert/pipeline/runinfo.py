"""Running a job: clean start, fingerprint, and the run record (provenance) at the end.

`running(job)` wraps a stage's work:
- first: no path the job writes under the results folder is (or lies under) a symlink, and the
  job's lock is taken (minbert.pipeline.lock: one process per job, whichever engine started it;
  a job that finds another process running it waits for it);
- the job's fingerprint, once: the hash of its resolved description (minbert.pipeline.job), the
  content hashes of what it reads, and, for a stage that runs the network, where and how it runs
  (device type, the precision `auto` resolves to here, processes). The stage receives its network
  settings with `auto` resolved (`Running.settings`), and the training stages resume only a state
  saved under this very fingerprint;
- nothing runs (`UpToDate`) only when the job's outputs are, byte for byte, what its last finished
  run of this fingerprint wrote (minbert.pipeline.finished, every file hashed again), and either it
  waited for another process that ran it (an engine's job started while a hand run, or an orphan of
  a killed engine, ran it) or it was started by hand without `--force`. A job an engine starts
  without waiting always runs: an engine runs a job because it judged it stale or was told to
  (`snakemake --forcerun`, `dvc repro -f`), and it deletes the job's outputs first anyway;
- before: the job's declared outputs left from an earlier run are removed (a failure can then
  never leave a stale output behind) and temporaries left by a killed run beside them are deleted;
  a folder outside the results folder (the report's pages under --out) loses only the files its
  manifest says the stage wrote there, never a user's own;
- throughout: the registry of the job's settings (minbert.core.registry: the built-in tasks, losses
  and heads with the user's tasks and modules the job names) is the one in use, so a stage works
  from its job's registry alone, whether an engine or a hand run started it;
- after success: results/runs/<stage>/<name>.json with the git revision, the environment and
  device, the precision that ran, wall time and peak memory, the fingerprint and the resolved
  description; then what the run wrote is recorded by content (minbert.pipeline.finished).
"""
from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import resource
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from minbert.core.errors import MinBertError
from minbert.core.io import MANIFEST, clean_stale_temporaries, refuse_links, remove_owned, write_json
from minbert.core.layout import Layout
from minbert.core.plain import changed
from minbert.core.provenance import fingerprint_of, git_revision, with_runtime
from minbert.core.registry import Registry, RegistryProblem
from minbert.pipeline import finished
from minbert.pipeline.job import Job, inside, refuse_inputs_inside_outputs
from minbert.pipeline.lock import engine, job_lock

CHECKOUT = Path(__file__).resolve().parents[2]    # the code's revision, whatever folder the job runs from


def peak_rss_mib() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(kb / 1024, 1)


def hardware(device="cpu") -> dict:
    """Where the job ran. torch is asked only when the stage loaded it (evaluate, ensemble and the
    report do not, and start faster without it)."""
    torch = sys.modules.get("torch")
    try:
        version = torch.__version__ if torch else importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        version = None
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "torch": version, "cpu_count": os.cpu_count(), "threads": torch.get_num_threads() if torch else None,
            "device": str(device)}
    if torch and str(device).startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


@dataclass
class Running:
    """A running job: its fingerprint and description, its settings as it runs them (a network
    stage's with device and precision resolved), and fields for its run record."""
    job: Job
    fingerprint: str
    description: dict
    settings: object = None
    fields: dict = field(default_factory=dict)


def _remove(path: Path, results: Path) -> None:
    """Remove an output left by an earlier run: a file; a folder under the results folder (the
    pipeline owns it whole); a folder elsewhere (the report's pages under --out) only as far as
    its manifest lists what the stage wrote there."""
    if path.is_dir() and not path.is_symlink():
        if (path / MANIFEST).is_file() or not inside(path, results):
            remove_owned(path)
        else:
            shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


class UpToDate(Exception):
    """The job's outputs for this very description and inputs are in place: nothing to run."""


def resolve_network(network) -> tuple[object, dict]:
    """A network stage's settings (minbert.params.settings.NetworkSettings) with the device and the
    precision `auto` resolved here, once, and the runtime its run record and fingerprint hold:
    device type, precision, processes (torchrun's WORLD_SIZE)."""
    from minbert.core.runtime import pick_device, precision_on

    device = pick_device(network.device)
    precision = precision_on(network.precision, device)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    return changed(network, device=device.type, precision=precision), \
        {"device": device.type, "precision": precision, "world": world}


def up_to_date(job: Job, fingerprint: str, waited: bool, force: bool) -> str | None:
    """Why the job has nothing to run (its outputs are, by content, what its last finished run of this
    fingerprint wrote, and it waited for that run or was started by hand), or None."""
    if force or not (waited or engine() == "hand") or not finished.in_place(job, fingerprint):
        return None
    if waited:
        return f"{job.id}: finished by the process it waited for, for these settings, inputs and code; its outputs " \
               f"are in place (checked by content): nothing to run"
    return f"{job.id}: up to date (its outputs for these settings, inputs and code are in place, as its last run " \
           f"wrote them); nothing to run (--force runs it again)"


@contextlib.contextmanager
def running(job: Job, network=None, main_process: bool = True, force: bool = False):
    """Run `job`'s body (see the module docstring); yields a `Running`. `network`: the settings of a
    stage that runs the network (its device and precision go into the record and the fingerprint,
    resolved once); `force`: run even when the job's finished outputs are in place."""
    L = Layout(job.results)
    lock = job_lock(L.lock(job.stage, job.name), job.id) if main_process else contextlib.nullcontext()
    if main_process:
        for path in owned_paths(job):
            refuse_links(path, job.results)
        refuse_inputs_inside_outputs(job)
    settings, runtime = resolve_network(network) if network is not None else (None, {"device": "cpu"})
    with lock as holding, job_registry(job).active():
        description = job.runtime_description()
        if network is not None:
            description = with_runtime(description, runtime["device"], runtime["precision"], runtime["world"])
        run = Running(job, fingerprint_of(description), description, settings)
        why = up_to_date(job, run.fingerprint, bool(holding and holding["waited"]), force) if main_process else None
        if why:
            raise UpToDate(why)
        before = finished.replaced(job) if main_process else None
        if main_process:
            for out in job.outputs:
                path = Path(out)
                clean_stale_temporaries(path.parent, path.name)
                _remove(path, Path(job.results))
        start, t0 = dt.datetime.now(dt.timezone.utc), time.perf_counter()
        yield run
        if main_process:
            write_json(Path(job.run_record), {
                "stage": job.stage, "name": job.name, "git_revision": git_revision(CHECKOUT),
                "started": start.isoformat(timespec="seconds"),
                "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "wall_seconds": round(time.perf_counter() - t0, 2), "peak_rss_mib": peak_rss_mib(),
                **hardware(runtime["device"]), **({"precision": runtime["precision"]} if network is not None else {}),
                **run.fields, "fingerprint": run.fingerprint, "description": description,
            })
            finished.record(job, run.fingerprint, before)    # outputs as they were: their dates as they were


def job_registry(job: Job) -> Registry:
    """The registry of the job's settings: its declared tasks and the user's modules it names (as
    its settings model wrote them; the report, whose settings are the params file itself, reads the
    params and uses theirs)."""
    settings = job.settings if isinstance(job.settings, dict) and job.spec.model is not None else {}
    try:
        return Registry.of(settings.get("modules") or [], settings.get("tasks") or {})
    except RegistryProblem as e:
        raise MinBertError(f"{job.job_file}: setting '{e.key}' of {job.id}: {e}") from None


def owned_paths(job: Job) -> list[str]:
    """Every path under the results folder the job writes, removes or resumes from: its outputs, its
    run record and description, its resumable state, its lock, the shared token cache."""
    L = Layout(job.results)
    return [*job.outputs, L.job_file(job.stage, job.name), L.state(job.stage, job.name),
            L.finished(job.stage, job.name), L.lock(job.stage, job.name), L.token_cache]
