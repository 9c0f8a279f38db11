"""The export job, as the export stage runs it and as `minbert export` runs it by hand.

Into its own folder (results/exports/E) it is the pipeline's job: recorded, and nothing to run when
its outputs are in place (minbert.pipeline.runinfo.running). Into `out`, a folder of the user's, it
writes the same files with the same fingerprint on the card, and no record: the pipeline does not
own that folder; it runs in the job's registry all the same (its declared tasks name the card's data).
"""
from __future__ import annotations

from minbert.core.provenance import fingerprint_of
from minbert.core.settings import ExportSettings, read_settings
from minbert.pipeline.job import Job
from minbert.pipeline.runinfo import running
from minbert.pipeline.stage import folder_of
from minbert.share.export import export_experiment


def export(job: Job, out: str | None = None, force: bool = False) -> list[str]:
    """Run the export job `job` (into `out` when given); the files written, relative to its folder."""
    s = read_settings(ExportSettings, job.settings, job.job_file)
    reads = (job.reads["model"][0], job.reads["record"][0], folder_of(job.reads["predictions"]), job.reads["splits"])
    if out is not None:     # in the job's registry all the same: export_experiment runs in its settings'
        return export_experiment(s, job.name, *reads, out, fingerprint=fingerprint_of(job.runtime_description()))
    with running(job, force=force) as r:
        r.fields["files"] = export_experiment(s, job.name, *reads, job.writes["export"][0], fingerprint=r.fingerprint)
    return r.fields["files"]
