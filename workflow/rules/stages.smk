# One rule per stage, built from workflow/dag.py's jobs. A job's `config` (its resolved settings)
# is a rule param, so Snakemake's params trigger re-runs exactly the jobs whose settings changed;
# its code (stages/<stage>.py and the minbert/ package) is an input, so editing code re-runs it.
from pathlib import Path

JOB_BY_ID = {j.id: j for j in JOBS}
STAGES = list(dict.fromkeys(j.stage for j in JOBS))   # in DAG order

wildcard_constraints:
    name=r"[A-Za-z0-9][A-Za-z0-9_.-]*",


def job_of(stage, wildcards):
    return JOB_BY_ID[stage if "name" not in wildcards.keys() else f"{stage}@{wildcards.name}"]


def wildcard_path(path, sample):
    """A job's path with its name replaced by the {name} wildcard."""
    if sample.name is None:
        return path
    folder = f"/{sample.name}/" if f"/{sample.name}/" in path else f"/{sample.name}"
    return path.replace(folder, folder.replace(sample.name, "{name}"), 1)


def as_output(path):
    return path if "." in Path(path).name else directory(path)   # folders have no suffix


rule all:
    default_target: True
    input: "reports/final.html"


for stage_name in STAGES:
    sample_job = next(j for j in JOBS if j.stage == stage_name)
    rule:
        name: stage_name
        input: lambda wc, s=stage_name: dag.code_files(job_of(s, wc).deps)
        output: [as_output(wildcard_path(o, sample_job)) for o in sample_job.outputs]
        params:
            config=lambda wc, s=stage_name: job_of(s, wc).fingerprint,
            cmd=lambda wc, s=stage_name: job_of(s, wc).cmd,
        threads: workflow.cores if stage_name in dag.GPU_STAGES else 1
        shell: "{params.cmd}"


onsuccess:
    # Keep DVC's record true after a Snakemake run: dvc.lock then lists what Snakemake produced.
    import shutil
    if Path(".dvc").is_dir() and Path(".git").exists() and shutil.which("dvc") and config.get("dvc_commit", True):
        if not dag.dvc_commit(JOBS, Path(workflow.basedir)):
            print("warning: `dvc commit --force` failed; run it by hand to update dvc.lock", file=sys.stderr)
