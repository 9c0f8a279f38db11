# One rule per stage, built from the jobs of workflow/dag.py (the {name} wildcard is the
# experiment, pretraining or ensemble); a stage whose jobs declare outputs of different shapes
# (predictions of different task sets) gets one rule per shape (dag.rule_groups). A job's inputs
# are its description file and the outputs it reads; its command writes its output to the rule's
# log. With `--config in_process=true` (and `--force-use-threads`) the stages run inside
# Snakemake's own process instead: the catalogue smoke test runs hundreds of tiny jobs without a
# Python start-up each.
JOB_BY_ID = {j.id: j for j in JOBS}

wildcard_constraints:
    name=dag.NAME_PATTERN,

RULE_STAGE = {rule_name: stage_name for rule_name, stage_name, _, _ in dag.rule_groups(JOBS)}

for rule_name, stage_name, sample_job, name_pattern in dag.rule_groups(JOBS):   # in DAG order
    # a job that asks for GPUs runs on GPUs of its own (workflow/gpu_slot.py: Snakemake caps how many
    # such jobs run at once, not which device each gets)
    shell_cmd = "python -m workflow.gpu_slot --count {resources.gpu} -- {params.cmd} > {log} 2>&1" \
        if "gpu" in dag.stage_resources(stage_name, GPUS) else "{params.cmd} > {log} 2>&1"
    if config.get("in_process", False):
        rule:
            name: rule_name
            input: lambda wc, s=stage_name: dag.snakemake_inputs(dag.job_of(JOB_BY_ID, s, wc))
            output: dag.snakemake_outputs(sample_job)
            log: dag.snakemake_log(sample_job)
            wildcard_constraints: name=name_pattern
            threads: 1
            run: dag.run_in_process(dag.job_of(JOB_BY_ID, RULE_STAGE[rule], wildcards), log[0])
    else:
        rule:
            name: rule_name
            input: lambda wc, s=stage_name: dag.snakemake_inputs(dag.job_of(JOB_BY_ID, s, wc))
            output: dag.snakemake_outputs(sample_job)
            log: dag.snakemake_log(sample_job)
            benchmark: dag.snakemake_benchmark(sample_job)
            wildcard_constraints: name=name_pattern
            params:
                cmd=lambda wc, s=stage_name: dag.job_of(JOB_BY_ID, s, wc).cmd,
            threads: dag.STAGE_RESOURCES[stage_name]["threads"]
            resources: **dag.stage_resources(stage_name, GPUS)
            conda: "../envs/minbert.yaml"
            shell: shell_cmd


onsuccess:
    # Opt-in: record Snakemake's outputs in dvc.lock too (docs/workflow.md: the two engines' records).
    if config.get("dvc_commit", False):
        if not dag.dvc_commit(JOBS, dag.REPO):
            print("warning: `dvc commit --force` failed; run it by hand to update dvc.lock", file=sys.stderr)
