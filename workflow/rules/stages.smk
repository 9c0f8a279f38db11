# One rule per stage, built from the jobs of workflow/dag.py and the stage specs (the {name}
# wildcard is the experiment, pretraining or ensemble; its paths are the layout's with the name
# "{name}", its message and resources the stage specs'); a stage whose jobs declare outputs of different shapes
# (predictions of different task sets) gets one rule per shape (dag.rule_groups). A job's inputs
# are its job file and the outputs it reads; its command reads its job from the job file and
# writes its output to the rule's log.
#
# Every rule is a checkpoint: once a job has run, Snakemake judges the jobs that read its outputs
# again, by content (their checksums; profiles/default raises Snakemake's size limit for them), so
# a job whose outputs come out the same re-runs nothing after it, as under DVC. A job's input
# function asks for the checkpoints it reads from (dag.SnakemakeDag.inputs_after); a dry run
# (`snakemake -n`) does not, so its plan lists every job a target needs, not only the first ones.
#
# A job's priority is the number of network-running jobs on its longest chain (dag.chain_heights):
# among the jobs ready to run, the head of the longest chain (a pretraining) starts first.
#
# With `--config in_process=true` (and `--force-use-threads`) the stages run inside Snakemake's own
# process instead, as plain rules: the catalogue smoke test runs hundreds of tiny jobs without a Python
# start-up each, and without Snakemake re-planning after each one.

wildcard_constraints:
    name=dag.NAME_PATTERN,

RULE_STAGE = {rule_name: stage_name for rule_name, stage_name, _, _ in SNAKE.groups}
# one line per job (`message:`); `--config messages=false` prints Snakemake's whole job blocks
# instead (rule, wildcards, threads, resources: what a cluster submission will ask for)
MESSAGES = str(config.get("messages", True)).lower() not in ("false", "0", "no")
# jobs that run on this machine share its GPUs' cores (dag.stage_threads); a job sent to a cluster,
# or run inside a cluster allocation, takes the stage's own threads
ON_THIS_MACHINE = workflow.local_exec and not workflow.remote_exec


for rule_name, stage_name, sample_job, name_pattern in SNAKE.groups:   # in DAG order
    # a job that asks for GPUs runs on a GPU slot of its own (workflow/gpu_slot.py: Snakemake caps
    # how many such jobs run at once, not which device each gets), JOBS_PER_GPU sharing a device
    shell_cmd = (f"python -m workflow.gpu_slot --count {{resources.gpu}} --per-gpu {JOBS_PER_GPU} -- "
                 "{params.cmd} > {log} 2>&1") if "gpu" in dag.stage_resources(stage_name, GPUS) \
        else "{params.cmd} > {log} 2>&1"
    if config.get("in_process", False):
        # plain rules: a build of many tiny jobs from nothing runs each of them anyway, and judging
        # every job's readers again after each job costs Snakemake more than the jobs (time grows
        # with the square of their number); the whole DAG is known at the start, as in a dry run
        rule:
            name: rule_name
            input: lambda wc, s=stage_name: SNAKE.inputs_after(checkpoints, s, wc, dry_run=True)
            output: dag.snakemake_outputs(sample_job)
            log: dag.snakemake_log(sample_job)
            message: MESSAGES and dag.stage_message(stage_name)
            wildcard_constraints: name=name_pattern
            priority: lambda wc, s=stage_name: SNAKE.priority(s, wc)
            threads: 1
            run: dag.run_in_process(SNAKE.job(RULE_STAGE[rule], wildcards), log[0])
    else:
        checkpoint:
            name: rule_name
            input: lambda wc, s=stage_name: SNAKE.inputs_after(checkpoints, s, wc, workflow.dryrun)
            output: dag.snakemake_outputs(sample_job)
            log: dag.snakemake_log(sample_job)
            benchmark: dag.snakemake_benchmark(sample_job)
            message: MESSAGES and dag.stage_message(stage_name)
            wildcard_constraints: name=name_pattern
            priority: lambda wc, s=stage_name: SNAKE.priority(s, wc)
            params:
                cmd=lambda wc, s=stage_name: SNAKE.cmd(s, wc),
            threads: dag.stage_threads(stage_name, GPUS, JOBS_PER_GPU, workflow.cores, ON_THIS_MACHINE)
            resources: **dag.stage_resources(stage_name, GPUS)
            conda: "../envs/minbert.yaml"
            shell: shell_cmd
