# The pipeline for Snakemake: `snakemake --cores all` builds reports/final.html (docs/workflow.md).
# The jobs come from the library (minbert.jobs, rendered by workflow/dag.py), which also generates
# dvc.yaml: both engines run the same stage commands on the same files.
#   another params file:       snakemake --cores all --config params=params/minilm.yaml
#   a cluster without GPUs:    snakemake --profile profiles/slurm --config gpu=0
#   record outputs in DVC too: snakemake --cores all --config dvc_commit=true
from snakemake.utils import min_version

min_version("9.0")

import importlib
import sys

sys.path.insert(0, workflow.basedir)
dag = importlib.import_module("workflow.dag")   # `workflow` here is Snakemake's object, so no plain import

PARAMS = config.get("params", "params.yaml")
GPUS = int(config.get("gpu", 1))
# Every job's description file is rewritten here when it changed: it is each job's first input,
# so a changed setting, input list or code file re-runs exactly the jobs it concerns.
JOBS = dag.resolve(PARAMS, workflow.basedir)


# Every declared output is asked for, not only the report: a deleted intermediate output (one
# predictions file, say) re-runs the job that writes it, as under DVC.
rule all:
    default_target: True
    input: dag.LAYOUT.final_report, dag.all_outputs(JOBS)


include: "workflow/rules/stages.smk"
