"""Training: task heads and losses, the multi-task model, schedules, the batch sampler, SMART and
PCGrad, the fine-tuning loop, pretraining (masked LM, NLI, paraphrase first), distillation, frozen
features, and an experiment's stages from settings to prediction files. Imports the layers below
(core, params, data, model)."""
