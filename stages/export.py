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
from minbert.pipeline.stage import folder_of, stage_call
from minbert.share.export import export_experiment


def main(argv=None):
    call = stage_call("export", __doc__, argv)
    s, job = ExportSettings(**call.job.settings), call.job
    with running(job, force=call.args.force) as r:
        r.fields["files"] = export_experiment(s, call.name, job.reads["model"][0], job.reads["record"][0],
                                              folder_of(job.reads["predictions"]), job.reads["splits"],
                                              job.writes["export"][0], fingerprint=r.fingerprint)


if __name__ == "__main__":
    run(main)
