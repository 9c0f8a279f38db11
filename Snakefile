# The pipeline for Snakemake: `snakemake --cores all` builds reports/final.html (docs/workflow.md).
# The jobs come from the library (minbert.pipeline.plan, rendered by workflow/dag.py), which also
# generates dvc.yaml: both engines run the same stage commands on the same files. profiles/default
# (used by Snakemake without being named) holds the settings every run here shares.
#   another params file:       snakemake --cores all --config params=params/minilm.yaml
#   ... beside the default's:  snakemake --cores all --config params=laptop.yaml results=results-laptop
#                              (its results there, its reports in results-laptop/reports)
#   a cluster:                 snakemake --profile profiles/slurm   (--config gpu=0 without GPUs)
#   jobs sharing one GPU:      snakemake --cores all --config jobs_per_gpu=4   (the default)
#   not recorded in dvc.lock:  snakemake --cores all --config dvc_commit=false   (default: recorded in a DVC repository)
#   progress lines every N seconds: snakemake --cores all --config progress=N   (0: only the count when a job
#                              finishes; default 30 on a terminal)
#   any setting, as dvc exp run -S: snakemake --cores all --config set='++experiments.multitask_rr.finetune.lr=5e-5'
#                              (several: set='KEY=VALUE KEY=VALUE'; minbert/params/overrides.py)
from snakemake.utils import min_version

min_version("9.0")

import importlib
import sys

from snakemake.exceptions import WorkflowError

sys.path.insert(0, workflow.basedir)
dag = importlib.import_module("workflow.dag")   # `workflow` here is Snakemake's object, so no plain import
dvc = importlib.import_module("workflow.dvc")

PARAMS = config.get("params", "params.yaml")
LAYOUT = dag.layout_for(config.get("results"), config.get("reports"))
try:
    GPUS = dag.whole_number(config, "gpu", 1, "GPUs for each job that runs the network (0: none)")
    JOBS_PER_GPU = max(1, dag.whole_number(config, "jobs_per_gpu", 4, "jobs that share one GPU"))
    # where the run stands (jobs done, each training job's epoch, rate and ETA) on this terminal
    PROGRESS = dag.whole_number(config, "progress", 30 if sys.stderr.isatty() else 0,
                                "seconds between progress lines (0: only the count when a job finishes)")
    if PROGRESS:
        from minbert.pipeline.progress import interval

        interval(PROGRESS, "--config progress=")
    # Every job file is rewritten here when it changed: it is each job's first input, so a changed
    # setting, input list or code file re-runs exactly the jobs it concerns. A dry run writes none
    # where a real run reads them: the job files it would write are read from a folder of its own.
    OVERRIDES = dag.split_set(config.get("set"))
    if dag.plans_only(workflow):
        JOBS, STAND_INS = dag.plan_only(PARAMS, workflow.basedir, OVERRIDES, LAYOUT)
    else:
        JOBS, STAND_INS = dag.resolve(PARAMS, workflow.basedir, OVERRIDES, LAYOUT), {}
    dag.check_sources(JOBS, PARAMS, workflow.basedir)
except dag.MinBertError as e:
    raise WorkflowError(str(e)) from None
SNAKE = dag.SnakemakeDag(JOBS, LAYOUT, STAND_INS)


# Every declared output is asked for, not only the report: a deleted intermediate output (one
# predictions file, say) re-runs the job that writes it, and the exports params.yaml lists are
# built, as under DVC.
rule all:
    default_target: True
    input: LAYOUT.final_report, dag.all_outputs(JOBS)


include: "workflow/rules/stages.smk"


# the outputs of the jobs this run was started for (Snakemake's plan, as it starts): what the
# progress counts and the run's last lines speak of (Snakemake's own count, which counts the target
# rule as a step and never reaches it after checkpoints, is quieted in profiles/default)
RUN_OUTPUTS = set()
PRINTING = {}


onstart:
    # not in a dry run: Snakemake runs this only when jobs are about to run
    from minbert.pipeline.progress import print_every

    RUN_OUTPUTS.update(str(f) for job in workflow.dag.needrun_jobs() for f in job.output)
    PRINTING["thread"] = print_every(PROGRESS, LAYOUT, outputs=RUN_OUTPUTS)


onsuccess:
    # the dates the next resolve would give (a job that kept its outputs as they were), so that a
    # dry run after this one plans nothing (workflow/jobfiles.py: settle_dates)
    if RUN_OUTPUTS:
        dag.settle_dates(JOBS, dag.REPO)
    # the count, all done, and the report's summary (the best model, its scores, where the report is)
    if RUN_OUTPUTS:
        from minbert.pipeline.progress import run_end
        from stages.report import SUMMARY_HEADER

        run_end(RUN_OUTPUTS, LAYOUT, report_log=LAYOUT.log("report"), header=SUMMARY_HEADER, printing=PRINTING.get("thread"))
    # In a DVC repository, Snakemake's outputs are recorded in dvc.lock too, so `dvc status` and
    # `dvc repro` find nothing to do (docs/workflow.md: the two engines' records); `--config
    # dvc_commit=false` leaves dvc.lock alone.
    if dvc.records_in_dvc(config.get("dvc_commit"), dag.REPO, PARAMS, LAYOUT, JOBS, OVERRIDES):
        if not dvc.dvc_commit(JOBS, dag.REPO):
            print("warning: `dvc commit --force` failed; run `python -m workflow.dag --dvc-commit` to update dvc.lock",
                  file=sys.stderr)
