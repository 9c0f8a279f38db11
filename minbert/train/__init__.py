"""Training: losses, objectives, schedules, SMART and PCGrad, the fine-tuning loop and its
captured CUDA step, pretraining (masked LM, NLI, paraphrase first), distillation, frozen features,
and an experiment's training from settings to model files. Imports the layers below (core, params,
data, model)."""

# The module each kind of pretraining runs (its `pretrain` function): a pretraining job's code is
# the stage and this module's closure, so masked-LM pretraining never re-runs for a change to the
# fine-tuning loop that paraphrase-first runs.
PRETRAINING_MODULES = {"mlm": "minbert.train.pretrain", "nli": "minbert.train.pretrain",
                       "para_first": "minbert.train.para_first"}
