"""The CS224N default final project's submission files, from an experiment's or ensemble's predictions.

The course's starter code (multitask_classifier.py, `test_model_multitask` in evaluation.py) writes
six files into predictions/, and prepare_submit.py zips that folder for the leaderboard:

    predictions/{sst,para,sts}-{dev,test}-output.csv
    header   `id \\t Predicted_Sentiment \\n` (Predicted_Is_Paraphrase, Predicted_Similiary [sic])
    rows     `<id> , <prediction> \\n`: the id lower-cased and stripped as the starter reads it; SST the
             class 0-4 (`3`), Quora the rounded sigmoid as a float (`1.0`), STS the score as the
             float32 the starter holds, printed as a Python float (`3.4567000865936279`)

`write_submission` writes them in the same bytes, in the data files' order, from the pipeline's
predictions CSVs (the predict or ensemble stage's), and the zip with `./predictions/<file>` entries.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from minbert.core.errors import MinBertError
from minbert.core.io import atomic_path, write_text
from minbert.core.layout import Layout, prediction_file
from minbert.core.outputs import refuse_over_inputs, writable_folder, writable_output

HEADERS = {"sst": "Predicted_Sentiment", "para": "Predicted_Is_Paraphrase", "sts": "Predicted_Similiary"}
SPLITS = ("dev", "test")
ZIP_NAME = "cs224n_default_final_project_submission.zip"


def output_name(task: str, split: str) -> str:
    return f"{task}-{split}-output.csv"


def starter_value(task: str, prediction: float) -> str:
    """A prediction as the starter's f-string prints the numpy value it holds (a float32 formats as
    the Python float it widens to: `3.4567000865936279`)."""
    if task == "sst":
        return f"{np.int64(round(prediction))}"
    return f"{np.float32(prediction)}"     # para: sigmoid().round() is a float32 0.0 / 1.0


def starter_text(task: str, ids, predictions) -> str:
    lines = [f"id \t {HEADERS[task]} \n"]
    lines += [f"{str(i).lower().strip()} , {starter_value(task, float(p))} \n" for i, p in zip(ids, predictions)]
    return "".join(lines)


def predictions_folder(source: str | Path) -> Path:
    """An experiment's or ensemble's folder, or a predictions folder itself."""
    p = Path(source)
    if (p / "predictions").is_dir():
        return p / "predictions"
    if p.is_dir() and any(p.glob("*-dev.csv")):
        return p
    raise MinBertError(f"{p}: no predictions here; give an experiment's or ensemble's folder (results/experiments/E, "
                       f"results/ensembles/N) after its predict or ensemble stage ran")


def results_folder(folder: Path) -> Path:
    """The results folder a predictions folder lies in (<results>/experiments/E/predictions or
    <results>/ensembles/N/predictions), whose prepared splits the predictions are checked against."""
    return folder.resolve().parent.parent.parent


def zip_default(out_dir: str | Path) -> Path:
    """Where the zip goes by default: the starter's name, in the folder that holds `out_dir` (as
    prepare_submit.py zips predictions/ from the folder above it), said as `out_dir` is (relative
    where it is relative, as the six files are printed)."""
    out = Path(out_dir)
    return (out.parent if out.name not in ("", ".", "..") else out.absolute().parent) / ZIP_NAME


def write_submission(source: str | Path, out_dir: str | Path = "predictions", zip_path: str | Path | None = None,
                     results: str | Path | None = None) -> list[str]:
    """Write the six files into `out_dir` and the zip (default: `zip_default(out_dir)`); returns the
    paths written (list of str). Each predictions file is first checked against the prepared split it
    claims, as the evaluate stage checks it (every id of <results>/data/<task>-<split>.tsv once, no
    other; `results`: the results folder, default the one the predictions lie in): a file with rows
    missing never becomes a submission."""
    from minbert.scoring.evaluate import check_against_split, read_predictions

    folder = predictions_folder(source)
    layout = Layout(str(results) if results is not None else str(results_folder(folder)))
    out = Path(out_dir)
    zip_path = Path(zip_path) if zip_path else zip_default(out)
    writable_folder(out, "--out")
    writable_output(zip_path, "submission zip", "--zip", ZIP_NAME)
    reads = [Path(layout.split(task, split)) for task in HEADERS for split in SPLITS]
    refuse_over_inputs(out, "--out", folders=[folder])
    for path, flag in [(out / output_name(t, s), "--out") for t in HEADERS for s in SPLITS] + [(zip_path, "--zip")]:
        refuse_over_inputs(path, flag, files=reads, folders=[folder])      # a link in --out included
    texts = {}
    for task in HEADERS:
        for split in SPLITS:
            path = Path(prediction_file(folder, task, split))
            if not path.is_file():
                raise MinBertError(f"{path}: missing; the submission needs dev and test predictions of sst, para and "
                                   f"sts (train those tasks, prepare the test splits, and leave the experiment's "
                                   f"predict_test on)")
            frame = read_predictions(path, task)
            split_path = Path(layout.split(task, split))
            if not split_path.is_file():
                raise MinBertError(f"{path}: cannot be checked against its prepared split: {split_path} not found; "
                                   f"give --results the results folder these predictions came from")
            check_against_split(frame, path, task, split_path)
            texts[output_name(task, split)] = starter_text(task, frame["id"], frame["prediction"])
    written = []
    for name, text in texts.items():
        write_text(out / name, text)
        written.append(str(out / name))
    with atomic_path(zip_path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zz:
        for name, text in texts.items():       # a fixed date: the same predictions give the same zip
            zz.writestr(zipfile.ZipInfo(f"./predictions/{name}", date_time=(1980, 1, 1, 0, 0, 0)), text)
    written.append(str(zip_path))
    return written
