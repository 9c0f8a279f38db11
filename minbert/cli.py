"""The `minbert` command: a trained model on new text, the course's submission files, uploads, and
where a running pipeline stands.

    minbert predict MODEL [INPUT] [--task sst] [--out FILE]    # INPUT: .tsv/.csv/.jsonl/.txt, or stdin
    minbert submission SOURCE --out DIR                      # the CS224N starter's six prediction files + zip
                                                             # (the zip beside DIR, the starter's name)
    minbert export EXPERIMENT [--out DIR]                    # a trained experiment in the Hugging Face format
    minbert upload FOLDER REPO_ID                            # an export folder to the Hugging Face Hub
    minbert estimate [--params params.yaml]                  # how long its pipeline will take here
    minbert progress [--watch [SECONDS]]                     # where a running pipeline stands
    minbert accept-code [JOB...]                             # keep finished work after a reviewed no-op edit

MODEL is an experiment's folder (results/experiments/E), its model.pt, or an export folder
(results/exports/E). An input file has a header row naming `sentence` (one-sentence tasks: sst,
cfimdb) or `sentence1` and `sentence2` (pair tasks: para, sts), and optionally `id`; a .txt file
or plain text on stdin is one sentence per line. Bad input prints one line naming the file, the
line and what to do, and exits with status 2.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from minbert.api import load_model, model_sources
from minbert.core.devices import DEVICES
from minbert.core.errors import MinBertError
from minbert.core.io import MAX_INPUT_BYTES, _human, read_input, write_text
from minbert.core.layout import Layout
from minbert.core.outputs import folders_read, refuse_over_inputs, writable_folder, writable_output
from minbert.core.tasks import Task
from minbert.data.read import refuse_repeated_columns
from minbert.entry import run
from minbert.scoring.inputs import PAIR, SINGLE, Origin, check_texts, tasks_for, text_columns
from minbert.share.submission import write_submission

FORMATS = ("tsv", "csv", "jsonl", "txt")
SUFFIXES = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".txt": "txt"}


# ---------------------------------------------------------------- reading new text

def input_format(name: str, text: str, given: str | None) -> str:
    """The format of an input: as given, by the file's suffix, or (stdin) by its first line."""
    if given:
        return given
    if name != "<stdin>" and Path(name).suffix.lower() in SUFFIXES:
        return SUFFIXES[Path(name).suffix.lower()]
    first = text.lstrip("\ufeff").split("\n", 1)[0]
    if first.lstrip().startswith("{"):
        return "jsonl"
    if "\t" in first:
        return "tsv"
    if first.strip() in ("sentence", "sentence1,sentence2", "id,sentence", "id,sentence1,sentence2"):
        return "csv"
    return "txt"


def text_lines(text: str) -> list[str]:
    """The lines of a text split at line feeds only (a CR before one is dropped): U+2028, a form feed
    or a file separator inside a line are characters of its text, not line breaks as for
    `str.splitlines`, and JSON allows them raw inside a string."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()                      # the newline that ends the last line
    return [line.removesuffix("\r") for line in lines]


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


def read_rows(name: str, text: str, fmt: str) -> tuple[pd.DataFrame, list[int]]:
    """An input's rows and the line each starts on: every line after a header (every line of a
    .txt) is a row, a blank one too, whose empty text `check_texts` then refuses, naming the line,
    whatever the format. Values are strings, but a JSONL text as JSON has it (a number is no text)."""
    text = text.lstrip("\ufeff")
    if fmt == "txt":
        lines = text_lines(text)
        return pd.DataFrame({"sentence": lines}), list(range(1, len(lines) + 1))
    if fmt == "jsonl":
        records, where = [], []
        for k, line in enumerate(text_lines(text), 1):
            if not line.strip():       # a blank line: a row without text, refused as in every format
                records.append({})
                where.append(k)
                continue
            try:
                rec = json.loads(line, object_pairs_hook=_unique_keys)
            except _DuplicateKey as e:
                raise MinBertError(f"{name}:{k}: key '{e.args[0]}' appears twice in the object; keep one") from None
            except RecursionError:
                raise MinBertError(f"{name}:{k}: nested too deeply; write one flat object per line") from None
            except ValueError as e:
                raise MinBertError(f"{name}:{k}: not a JSON object ({e.msg}); write one object per line, e.g. "
                                   f'{{"sentence": "..."}}') from None
            if not isinstance(rec, dict):
                raise MinBertError(f"{name}:{k}: expected a JSON object, found {type(rec).__name__}")
            # texts as they are (a number is no sentence: minbert.scoring.inputs says so), the rest as strings
            records.append({key: v if v is None or key in SINGLE + PAIR else str(v) for key, v in rec.items()})
            where.append(k)
        return pd.DataFrame.from_records(records), where
    # TSV is read unquoted, as the prepared splits and the CS224N files are (no field holds a tab);
    # a field of any length is read, so a text too long is refused as in every format (check_texts)
    with _any_field_size():
        return _read_table(name, text, fmt)


@contextlib.contextmanager
def _any_field_size():
    """The csv module reads a field of any length (its default limit is 131,072 characters)."""
    before = csv.field_size_limit(2**31 - 1)
    try:
        yield
    finally:
        csv.field_size_limit(before)


def _read_table(name: str, text: str, fmt: str) -> tuple[pd.DataFrame, list[int]]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t" if fmt == "tsv" else ",",
                        quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL)
    try:
        header = next(reader, None)
        if header is None:
            return pd.DataFrame(), []
        header = [h.strip() for h in header]
        refuse_repeated_columns(f"{name}:1", header)
        rows, where, start = [], [], reader.line_num + 1
        for row in reader:
            if row == []:              # a blank line: a row without text, refused as in every format
                row = [""] * len(header)
            if len(row) != len(header):
                raise MinBertError(f"{name}:{start}: {len(row)} fields where the header has {len(header)} "
                                   f"({', '.join(header)}); quote fields that hold the separator")
            rows.append(row)
            where.append(start)
            start = reader.line_num + 1
    except csv.Error as e:
        raise MinBertError(f"{name}:{reader.line_num}: cannot be read as {fmt.upper()} ({e}); check its quoting") from None
    return pd.DataFrame(rows, columns=header), where


# ---------------------------------------------------------------- output

def prediction_columns(spec: Task, result: pd.DataFrame) -> pd.DataFrame:
    """A task's predictions as output columns: <task>_label, <task>_class, <task>_prob_k, or <task>_score."""
    task = spec.name
    if spec.kind == "regression":
        return pd.DataFrame({f"{task}_score": result["prediction"].to_numpy()})
    out = pd.DataFrame({f"{task}_label": result["prediction"].astype(int).to_numpy(),
                        f"{task}_class": result["class"].to_numpy()})
    for c in spec.prob_columns:
        out[f"{task}_{c}"] = result[c].to_numpy()
    return out


def _cell(v) -> str:
    if isinstance(v, (float, np.floating)):
        return "%.6g" % v
    return " ".join(str(v).split("\t")).replace("\r", " ").replace("\n", " ")


def write_output(frame: pd.DataFrame, out: str | None, fmt: str) -> None:
    if fmt == "jsonl":
        text = frame.to_json(orient="records", lines=True, force_ascii=False, double_precision=6)
        text = text if text.endswith("\n") or not text else text + "\n"
    elif fmt == "tsv":   # unquoted, as it is read: a text holding a tab or line break gets a space instead
        cells = [[_cell(v) for v in row] for row in frame.itertuples(index=False)]
        text = "".join("\t".join(r) + "\n" for r in [list(map(str, frame.columns))] + cells)
    else:
        text = frame.to_csv(index=False, float_format="%.6g", lineterminator="\n")
    if out in (None, "-"):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        write_text(out, text)
    except OSError as e:
        raise MinBertError(f"{out}: cannot write the predictions ({e.strerror or e}); give --out a file in a "
                           f"folder you can write") from None


def check_out(out: str | None, input_name: str, model: str) -> None:
    """--out names a file that can be written, and none that the command reads (the input, the model
    or anything in its folder); checked before the model runs."""
    if out in (None, "-"):
        return
    writable_output(out, "predictions", "--out", "predictions.tsv")
    files, folders = model_sources(model)
    refuse_over_inputs(out, "--out", files=files + ([] if input_name == "<stdin>" else [input_name]), folders=folders)


# ---------------------------------------------------------------- commands

def read_stdin() -> bytes:
    """stdin, in chunks (Ctrl-C stops it at once) and no more than any input file may be."""
    chunks, total = [], 0
    while chunk := sys.stdin.buffer.read(1 << 20):
        total += len(chunk)
        if total > MAX_INPUT_BYTES:
            raise MinBertError(f"<stdin>: more than {_human(MAX_INPUT_BYTES)} of input, the most an input may be; "
                               f"split it into several files")
        chunks.append(chunk)
    return b"".join(chunks)


def predict_command(a) -> None:
    for flag, value in (("--batch-size", a.batch_size), ("--threads", a.threads)):
        if value is not None and value < 1:
            raise MinBertError(f"{flag} {value}: expected a positive number (e.g. {flag} 32)")
    name = "<stdin>" if a.input in (None, "-") else a.input
    check_out(a.out, name, a.model)
    if name == "<stdin>":
        if sys.stdin is None or sys.stdin.isatty():
            raise MinBertError("no input: give a file (TSV, CSV, JSONL or TXT) or pipe text into stdin, "
                               "e.g. echo 'A gripping film.' | minbert predict MODEL")
        raw = read_stdin()
    else:
        raw = read_input(name, "input file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MinBertError(f"{name}: not UTF-8 text (byte {e.start}); save the file as UTF-8") from None
    fmt = input_format(name, text, a.format)
    frame, lines = read_rows(name, text, fmt)
    model = load_model(a.model, device=a.device, batch_size=a.batch_size, threads=a.threads,
                       precision="bf16" if a.bf16 else a.precision, trust_remote_code=a.trust_remote_code)
    for t in a.task or []:
        model.has(t)
    known = {t: model.registry.tasks[t] for t in model.tasks}     # the model's own tasks, from its registry
    origin = Origin(name, lines)
    tasks = tasks_for(origin, frame.columns, a.task, known)
    check_texts(origin, frame, text_columns(known[t] for t in tasks))
    if len(frame) == 0:
        raise MinBertError(f"{name}: no rows to predict; give a header line and one row per sentence or pair")
    keep = [c for c in ["id"] + SINGLE + PAIR if c in frame.columns]
    parts = [frame[keep].reset_index(drop=True)]
    for t in tasks:                   # the model predicts in its own registry (minbert.api)
        cols = frame[PAIR if known[t].pair else SINGLE]
        cols = cols.assign(id=frame["id"]) if "id" in frame.columns else cols
        parts.append(prediction_columns(known[t], model.predict(t, cols, progress=None if not a.quiet else False)))
    out_fmt = a.out_format or (SUFFIXES.get(Path(a.out).suffix.lower()) if a.out not in (None, "-") else None) \
        or ("jsonl" if fmt == "jsonl" else "tsv")
    write_output(pd.concat(parts, axis=1), a.out, "tsv" if out_fmt == "txt" else out_fmt)


def submission_command(a) -> None:
    written = write_submission(a.source, a.out, zip_path=a.zip, results=a.results)
    for path in written:
        print(path)


def export_command(a) -> None:
    """The pipeline's export job for the experiment (as the export stage runs it), its model and
    predictions being what params.yaml describes now; into its own folder, or --out."""
    from minbert.pipeline.exporting import export
    from minbert.pipeline.plan import job_for

    layout = Layout(a.results)
    job = job_for(a.params, "export", a.experiment, layout)
    for stage in (job.settings["model_stage"], "predict"):
        made_now(job_for(a.params, stage, a.experiment, layout), layout.metrics(a.experiment))
    if a.out is not None:
        check_export_out(a.out, job, a.force)
    files = export(job, out=a.out, force=a.force)
    print(f"{a.out or job.writes['export'][0]}: {len(files)} files (README.md: its model card)")


def made_now(job, target: str) -> None:
    """A one-line error unless the job's last run was of the description the params give it now."""
    try:
        ran = json.loads(Path(job.run_record).read_text(encoding="utf-8"))["description"]
    except (OSError, ValueError, KeyError, TypeError):
        ran = None
    if ran is None:
        raise MinBertError(f"{job.id}: has not run (no {job.run_record}); run the pipeline first: snakemake --cores "
                           f"all {target} (or dvc repro)")
    if {k: v for k, v in ran.items() if k not in ("read_hashes", "runtime")} != job.description():
        raise MinBertError(f"{job.id}: its last run had other settings, inputs or code than the params give it now; "
                           f"run the pipeline first: snakemake --cores all {target} (or dvc repro)")


def check_export_out(out: str, job, force: bool = False) -> None:
    """--out: a new folder, or an export to replace that holds nothing but what an export wrote (another
    experiment's only with --force); never a folder the export reads or the pipeline owns, nor any
    other existing folder (it is replaced whole)."""
    from minbert.share.export import replaceable

    writable_folder(out, "--out")
    replaceable(out, job.name, force)
    refuse_over_inputs(out, "--out", files=job.read_paths, folders=folders_read(job.read_paths, job.results))


def upload_command(a) -> None:
    from minbert.share.export import upload

    print(upload(a.folder, a.repo_id, private=a.private, revision=a.revision))


class _Parser(argparse.ArgumentParser):
    """Argument errors as the other errors: one line and status 2 (not the usage text before them)."""

    def error(self, message):
        self.exit(2, f"error: {self.prog}: {message}; see {self.prog} --help\n")


def progress_command(a: argparse.Namespace) -> None:
    import time

    from minbert.core.layout import Layout
    from minbert.pipeline.progress import interval, job_states, summary, watch

    if a.watch is not None:
        watch(interval(a.watch, "--watch "), Layout(results=a.results))
        return
    stamp = time.strftime("%H:%M:%S")
    print("\n".join(f"{stamp} {line}" if k == 0 else line
                    for k, line in enumerate(summary(job_states(Layout(results=a.results))))), flush=True)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="minbert", description="Use a trained minBERT multi-task model.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    p = sub.add_parser("predict", help="predict sentiment, paraphrase or similarity on new text",
                       description="Predict each row of a file (or stdin) with a trained model: a label with the "
                                   "class probabilities, or a similarity score (clipped to the label range 0-5), per task.")
    p.add_argument("model", metavar="MODEL",
                   help="an experiment's folder (results/experiments/E), its model.pt, or an export folder")
    p.add_argument("input", metavar="INPUT", nargs="?",
                   help="a .tsv/.csv/.jsonl file with a header (sentence, or sentence1 and sentence2; id optional) "
                        "or a .txt file of one sentence per line; '-' or none: stdin")
    p.add_argument("--task", action="append", metavar="TASK",
                   help="a task of the model to predict (sst, para, sts, cfimdb or one of your own; repeat for "
                        "several); default: every task of the model the input's columns fit")
    p.add_argument("--out", "-o", help="write here instead of stdout (format by suffix)")
    p.add_argument("--format", choices=FORMATS, help="the input's format (default: by suffix; stdin: guessed)")
    p.add_argument("--out-format", choices=FORMATS[:3], help="the output's format (default: by --out's suffix, "
                                                               "else JSONL for JSONL input and TSV otherwise)")
    p.add_argument("--batch-size", type=int, help="rows per batch (default: the experiment's predict stage's, "
                                                  "else 64)")
    p.add_argument("--device", default="auto", choices=DEVICES, help="default: cuda when available")
    p.add_argument("--precision", choices=["auto", "bf16", "fp16", "fp32"],
                   help="default: the experiment's predict stage's setting, else auto (bf16 where it is native): "
                        "the stage's batches and precision give its numbers")
    p.add_argument("--bf16", action="store_true", help="the same as --precision bf16")
    p.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run the code a model names or carries (a head or loss of the user's: a module's path or "
                        "name, an export's code/: read it first); without it such a model is refused")
    p.set_defaults(func=predict_command)

    s = sub.add_parser("submission", help="the CS224N starter's six prediction files and the submission zip",
                       description="Write an experiment's or ensemble's dev and test predictions as the CS224N "
                                   "starter code's predictions/*-output.csv files, and zip them for the leaderboard.")
    s.add_argument("source", metavar="SOURCE",
                   help="an experiment's or ensemble's folder (results/experiments/E, results/ensembles/N) or its "
                        "predictions folder")
    s.add_argument("--out", default="predictions", help="the folder for the six files (default: predictions)")
    s.add_argument("--zip", help="the submission zip (default: cs224n_default_final_project_submission.zip, the "
                                 "starter's name, in the folder that holds --out, as the starter's prepare_submit.py "
                                 "writes it)")
    s.add_argument("--results", help="the results folder whose prepared splits (data/<task>-<split>.tsv) the "
                                     "predictions are checked against: every row present (default: the one SOURCE "
                                     "lies in)")
    s.set_defaults(func=submission_command)
    x = export_parser(sub)

    u = sub.add_parser("upload", help="upload an export folder to the Hugging Face Hub (network, a token)",
                       description="Upload an export folder (results/exports/E) to a Hub model repository with "
                                   "huggingface_hub (log in first: `hf auth login`, or set HF_TOKEN).")
    u.add_argument("folder", metavar="FOLDER")
    u.add_argument("repo_id", metavar="REPO_ID", help="e.g. your-name/minbert-multitask")
    u.add_argument("--private", action="store_true")
    u.add_argument("--revision", help="a branch of the repository (default: main)")
    u.set_defaults(func=upload_command)
    ap.commands = {"predict": p, "submission": s, "export": x, "upload": u, "estimate": estimate_parser(sub),
                   "progress": progress_parser(sub), "accept-code": accept_parser(sub)}
    return ap


def export_parser(sub) -> argparse.ArgumentParser:
    x = sub.add_parser("export", help="an experiment's model in the Hugging Face format, with its model card",
                       description="Export a trained experiment as the pipeline's export stage does (results/exports/E, "
                                   "or --out): the encoder for transformers and sentence-transformers, every head, the "
                                   "code of your own modules it uses, and a model card (docs/sharing.md). Its model and "
                                   "predictions must be what params.yaml describes now.")
    x.add_argument("experiment", metavar="EXPERIMENT", help="an experiment's name in params.yaml")
    x.add_argument("--out", help="the export folder (default: results/exports/EXPERIMENT, the pipeline's; elsewhere: "
                                 "a new folder, or an export folder to replace)")
    x.add_argument("--params", default="params.yaml", help="the params file (default: params.yaml)")
    x.add_argument("--results", default="results", help="the results folder (default: results)")
    x.add_argument("--force", action="store_true", help="export again even when the pipeline's export is in place; "
                                                         "with --out, replace another experiment's export")
    x.set_defaults(func=export_command)
    return x


def progress_parser(sub) -> argparse.ArgumentParser:
    g = sub.add_parser("progress", help="where a running pipeline stands: its jobs, each training job's epoch, "
                                        "rate and time left",
                       description="Where the pipeline run in this folder stands, under either engine: how many of "
                                   "its jobs are done, running and waiting, the time left, and each running job "
                                   "(training jobs: phase, epoch, updates, updates/s, ETA). Reads the job files, "
                                   "locks, run records and each training job's progress.json; writes nothing.")
    g.add_argument("--results", default="results", help="the results folder (default: results)")
    g.add_argument("--watch", nargs="?", type=float, const=5.0, metavar="SECONDS",
                   help="print again every SECONDS (default 5) until nothing is waiting, or nothing runs and no "
                        "engine runs in this folder (Ctrl-C stops)")
    g.set_defaults(func=progress_command)
    return g


def estimate_parser(sub) -> argparse.ArgumentParser:
    e = sub.add_parser("estimate", help="how long a params file's pipeline will take on this machine",
                       description="Every job's work priced by the pipeline's own update, evaluation, checkpoints and "
                                   "start-up measured here now, then the jobs scheduled as `snakemake --cores all` "
                                   "runs them (minbert.pipeline.estimate).")
    e.add_argument("--params", default="params.yaml", help="the params file (default: params.yaml)")
    e.add_argument("--device", default=None, choices=DEVICES, help="default: the params' base device")
    e.add_argument("--threads", type=int, help="the most threads the engine gives a job (as `snakemake "
                                               "--max-threads`; default: a network stage's 8, at most the cores)")
    e.add_argument("--cores", type=int, help="the cores the engine uses (default: all this process may use)")
    e.add_argument("--jobs-per-gpu", type=int, default=4, help="network jobs sharing one GPU (default 4, as "
                                                                "`--config jobs_per_gpu`)")
    e.add_argument("--cpu-time", action="store_true", help="measure the costs in CPU seconds, not wall seconds: on "
                                                              "cores other work shares, about what jobs of one thread "
                                                              "would take on idle ones")
    e.set_defaults(func=estimate_command)
    return e


def accept_parser(sub) -> argparse.ArgumentParser:
    a = sub.add_parser("accept-code", help="after a reviewed edit that changes nothing computed, keep the finished "
                                           "jobs it re-describes instead of running them",
                       description="Record the code now as the code of the finished jobs whose settings and inputs "
                                   "are unchanged (their finished records, job files, dvc.lock), as `dvc commit` accepts a changed "
                                   "dependency; a job whose settings or inputs changed is refused "
                                   "(docs/workflow.md, Re-run rules).")
    a.add_argument("jobs", nargs="*", metavar="JOB", help="jobs as stage@name (finetune@base, report); default: every "
                                                          "finished job whose code changed")
    a.add_argument("--params", default="params.yaml", help="the params file (default: params.yaml)")
    a.add_argument("--results", default="results", help="the results folder (default: results)")
    a.set_defaults(func=accept_command)
    return a


def accept_command(args) -> None:
    from minbert.pipeline.accept import accept_code

    print("\n".join(accept_code(args.params, args.jobs, Layout(args.results))))


def estimate_command(args) -> None:
    from minbert.pipeline.estimate import estimate_lines

    for line in estimate_lines(args.params, args.device, args.threads, args.cores, args.jobs_per_gpu, args.cpu_time):
        print(line)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, a command's options anywhere among its arguments (`minbert predict MODEL
    --task sst pairs.csv` as `minbert predict --task sst MODEL pairs.csv`), as a user expects of any
    command; argparse alone takes options only before or after the positional arguments of a
    command with an optional one."""
    ap = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    command = ap.commands.get(argv[0]) if argv else None
    return command.parse_intermixed_args(argv[1:]) if command is not None else ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    run(lambda _: args.func(args))


if __name__ == "__main__":
    main()
