"""An experiment's model in the Hugging Face format, with its model card.

    python -m stages.export --experiment E [--params params.yaml]

Runs for the experiments listed in params.yaml's `export.experiments`; writes results/exports/E/
(config.json, model.safetensors, tokenizer, sentence-transformers files, heads, README.md:
minbert.share.export). Uploading is separate: `minbert upload results/exports/E NAME/REPO`.
"""
from __future__ import annotations

from minbert.params.settings import ExportSettings
from minbert.pipeline.runinfo import running
from minbert.share.export import export_experiment

from ._cli import experiment_parser, job, run


def main(argv=None):
    args = experiment_parser(__doc__.splitlines()[0]).parse_args(argv)
    name = args.experiment
    the_job, L = job(args, "export", name)
    s = ExportSettings(**the_job.settings)
    with running(the_job) as r:
        r.fields["files"] = export_experiment(s, name, L.model(name, s.model_stage), L.run_record(s.model_stage, name),
                                              L.predictions(name), [p for p in the_job.reads if p.endswith(".tsv")],
                                              L.export(name), fingerprint=r.fingerprint)


if __name__ == "__main__":
    run(main)
