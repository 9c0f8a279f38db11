"""An experiment's model in the Hugging Face format, with its model card.

    python -m stages.export --experiment E [--params params.yaml]

Runs for the experiments listed in params.yaml's `export.experiments`; writes results/exports/E/
(config.json, model.safetensors, tokenizer, sentence-transformers files, heads, README.md:
minbert.share.export). Uploading is separate: `minbert upload results/exports/E NAME/REPO`.
"""
from __future__ import annotations

from minbert.entry import run
from minbert.params.settings import ExportSettings
from minbert.pipeline.runinfo import running
from minbert.pipeline.stage import stage_call
from minbert.share.export import export_experiment


def main(argv=None):
    call = stage_call("export", __doc__, argv, named="experiment")
    s, L, name = ExportSettings(**call.job.settings), call.layout, call.name
    with running(call.job, force=call.args.force) as r:
        r.fields["files"] = export_experiment(s, name, L.model(name, s.model_stage), L.run_record(s.model_stage, name),
                                              L.predictions(name), [p for p in call.job.reads if p.endswith(".tsv")],
                                              L.export(name), fingerprint=r.fingerprint)


if __name__ == "__main__":
    run(main)
