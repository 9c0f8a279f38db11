# The pipeline for Snakemake: `snakemake --cores all reports/final.html` (docs/workflow.md).
# The jobs come from workflow/dag.py, which also generates dvc.yaml: both engines run the same
# stage commands on the same files. Another params file: `snakemake --config params=other.yaml`.
import importlib
import sys

sys.path.insert(0, workflow.basedir)
dag = importlib.import_module("workflow.dag")   # `workflow` here is Snakemake's object, so no plain import

PARAMS = config.get("params", "params.yaml")
JOBS = dag.jobs(PARAMS)

include: "workflow/rules/stages.smk"
