"""An experiment's model in the Hugging Face format, with its model card.

    python -m stages.export --experiment E [--params params.yaml]

Runs for the experiments listed in params.yaml's `export.experiments` (an engine's jobs), or by hand
for any trained experiment (as `minbert export E`, which runs `export` below); writes
results/exports/E/ (config.json, model.safetensors, tokenizer, sentence-transformers files, heads,
the user's modules' code, README.md: minbert.share.export). Uploading is separate:
`minbert upload results/exports/E NAME/REPO`.
"""
from __future__ import annotations

from minbert.entry import run
from minbert.params.settings import ExportSettings
from minbert.pipeline.runinfo import running
from minbert.pipeline.stage import folder_of, stage_call
from minbert.share.export import export_experiment


def export(job, out: str | None = None, force: bool = False) -> list[str]:
    """The export job `job`: into its own folder, as the pipeline runs it (recorded; nothing to run
    when its outputs are in place), or into `out`, a folder of the user's (not the pipeline's: no record)."""
    s = ExportSettings(**job.settings)
    reads = (job.reads["model"][0], job.reads["record"][0], folder_of(job.reads["predictions"]), job.reads["splits"])
    if out is not None:
        from minbert.core.provenance import fingerprint_of

        return export_experiment(s, job.name, *reads, out, fingerprint=fingerprint_of(job.runtime_description()))
    with running(job, force=force) as r:
        r.fields["files"] = export_experiment(s, job.name, *reads, job.writes["export"][0], fingerprint=r.fingerprint)
    return r.fields["files"]


def main(argv=None):
    call = stage_call("export", __doc__, argv)
    export(call.job, force=call.args.force)


if __name__ == "__main__":
    run(main)
