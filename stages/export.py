"""An experiment's model in the Hugging Face format, with its model card.

    python -m stages.export --experiment E [--params params.yaml]

Runs for the experiments listed in params.yaml's `export.experiments` (an engine's jobs), or by hand
for any trained experiment (as `minbert export E`, which runs the same job: minbert.pipeline.exporting);
writes results/exports/E/ (config.json, model.safetensors, tokenizer, sentence-transformers files,
heads, the user's modules' code, README.md: minbert.share.export). Uploading is separate:
`minbert upload results/exports/E NAME/REPO`.
"""
from __future__ import annotations

from minbert.entry import run
from minbert.pipeline.exporting import export
from minbert.pipeline.stage import stage_call


def main(argv=None):
    call = stage_call("export", __doc__, argv)
    export(call.job, force=call.args.force)


if __name__ == "__main__":
    run(main)
