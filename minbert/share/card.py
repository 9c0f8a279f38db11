"""An export's model card (its README.md): what the model is, what it was trained on, how to load
it, its scores with 95% intervals, its training settings and provenance.

What it was trained on comes from each task's declaration (minbert.core.tasks): a task in the
course's layout is read from `data.dir`, a task of the user's from the files it names. Rows from
the synthetic demo data (a folder whose README marks it: minbert.core.datasets) are named as such,
and their scores go to no Hub metadata (its model-index would claim SST-5, Quora or STS results for
a model that never saw them); rows from any other files are named by those files.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from minbert.core.datasets import is_demo_data, raw_path
from minbert.core.layout import prediction_file
from minbert.core.tasks import Task
from minbert.scoring.evaluate import labelled, read_predictions
from minbert.scoring.stats import Sample, overall_estimates, task_estimate


@dataclass(frozen=True)
class TaskData:
    files: tuple[str, ...]      # the raw files its splits are read from, as the settings name them
    synthetic: bool             # the generated demo data, not the data set its name says


def task_data(s, tasks: list[str]) -> dict[str, TaskData]:
    """Where each task's rows come from, by its declaration (in the settings' registry): the course's
    layout in `data.dir` (the demo data when the settings say so), or the files a task of the user's
    names (the demo's when they lie in the demo folder)."""
    out = {}
    for task in tasks:
        spec = s.registry.tasks[task]
        if spec.format == "cs224n":
            files = tuple(raw_path(s.data, task, split).as_posix() for split in spec.splits)
            out[task] = TaskData(files, bool(s.demo_data))
        else:
            files = tuple(spec.files.values())
            out[task] = TaskData(files, any(is_demo_data(Path(f).parent) for f in files))
    return out


def _fmt(x: float) -> str:
    return f"{x:.4f}"


def _files(files) -> str:
    return ", ".join(f"`{f}`" for f in files)


def scores(predictions: str | Path, tasks: Mapping[str, Task]) -> dict:
    """{split: {task: (value, low, high, n)}, "overall": ...} with 95% percentile bootstrap
    intervals (minbert.scoring.stats, as the report computes them) for every labelled split of
    `tasks` (the model's registry's)."""
    out: dict = {}
    for split in ("dev", "test"):
        ests = {}
        for task in tasks:
            path = Path(prediction_file(predictions, task, split))
            if path.is_file():
                frame = read_predictions(path, task)
                estimate = task_estimate(task, Sample.of(frame)) if labelled(frame, path) else None
                if estimate is not None:         # an undefined metric has no score on the card
                    ests[task] = (estimate, len(frame))
        if ests:
            row = {t: (e.value, e.interval().low, e.interval().high, n) for t, (e, n) in ests.items()}
            for key, e in overall_estimates({t: e for t, (e, _) in ests.items()}).items():
                row[key] = (e.value, e.interval().low, e.interval().high, None)
            out[split] = row
    return out


def trained_on(sources: dict[str, TaskData], tasks: Mapping[str, Task]) -> str:
    """What the model was trained on, in a sentence's words: the synthetic tasks together, each
    other task with its files."""
    fake = [t for t, d in sources.items() if d.synthetic]
    parts = []
    if fake:
        folders = dict.fromkeys(Path(f).parent.as_posix() for t in fake for f in sources[t].files)
        parts.append(f"the minBERT demo data: synthetic, template-generated sentences in the layout of "
                     f"{', '.join(tasks[t].title for t in fake)} ({_files(folders)}), not those data sets; its scores "
                     f"below show that the pipeline works, not what the model is worth")
    parts += [f"{tasks[t].title} from the files {_files(d.files)}" for t, d in sources.items() if not d.synthetic]
    return "; and on ".join(parts)


def model_card(s, name: str, files: dict, score: dict, training: dict, rows: dict, provenance: dict) -> str:
    """The README.md: Hub metadata (YAML), then what the model is (the model it started from, the
    data it was trained on), how to load it, its scores with 95% intervals, its training settings,
    each task's data and the provenance. `s`: the export's settings (minbert.params.settings.ExportSettings);
    `files`: what export_model wrote (pooling, cross-encoders, carried code); `rows`: training rows by task."""
    tasks, known = list(s.predicts), s.registry.tasks
    sources = task_data(s, tasks)
    start = f"`{s.start_model}`" if s.start_model else "its base model"
    lineage = f"{start}, further pretrained by `{s.pretraining}`," if s.pretraining else start
    lines = ["---", yaml.safe_dump(_card_metadata(s, name, files, score, sources), sort_keys=False,
                                   allow_unicode=True).rstrip(),
             "---", "", f"# {name}", "", (s.description or "A multi-task minBERT model.") + "", "",
             f"A BERT encoder: {lineage} then fine-tuned on {len(tasks)} tasks at once by the minBERT multi-task "
             f"pipeline, with one head per task. Trained on {trained_on(sources, known)}.", ""]
    if s.start_model and training.get("model") is None and training.get("pretrain"):
        training = {**training, "model": f"{s.start_model} after pretraining {training['pretrain']}"}
    synthetic = [t for t, d in sources.items() if d.synthetic]
    lines += _card_usage(files, tasks, known) + _card_scores(score, synthetic, known)
    lines += ["", "## Training", "", "The settings the fine-tuning ran with (the pipeline's resolved job description):",
              "", "```yaml", yaml.safe_dump(training, sort_keys=True).rstrip(), "```", ""]
    lines += _card_data(sources, rows, training, known) + ["", "## Provenance", ""]
    lines += [f"- {k}: `{v}`" for k, v in provenance.items()] + [""]
    return "\n".join(lines)


def _card_data(sources: dict[str, TaskData], rows: dict, training: dict, tasks: Mapping[str, Task]) -> list[str]:
    lines = ["## Data", ""]
    for task, d in sources.items():
        what = "synthetic demo data (not the data set its name says)" if d.synthetic else "real data"
        kept = f"; {rows[task]} rows in the prepared training split" if task in rows else ""
        lines.append(f"- {tasks[task].title}: {what}, from {_files(d.files)}{kept}")
    ds = (training.get("finetune") or training.get("train") or {}).get("downsample")
    if ds:
        lines.append(f"- downsampling of the training data: {json.dumps(ds, sort_keys=True)}")
    return lines


def _card_metadata(s, name: str, files: dict, score: dict, sources: dict[str, TaskData]) -> dict:
    """The Hub's metadata: language, license, tags, base model, and the scores of the tasks trained
    on real data as its model-index (none for the synthetic demo data, which is no data set of the Hub's)."""
    results, known = [], s.registry.tasks
    for split, row in score.items():
        for task, (value, *_rest) in row.items():
            if task in sources and not sources[task].synthetic:
                results.append({"task": {"type": "text-classification" if known[task].kind != "regression"
                                         else "sentence-similarity", "name": known[task].title},
                                "dataset": {"name": f"{known[task].title} ({split})", "type": task, "split": split},
                                "metrics": [{"type": "accuracy" if known[task].metric == "acc" else "pearsonr",
                                             "value": round(float(value), 4),
                                             "name": f"{split} {known[task].metric_header}"}]})
    return {"language": [s.language], "license": s.license, "library_name": "sentence-transformers",
            "pipeline_tag": "sentence-similarity",
            "tags": ["minbert", "bert", "multi-task", "sentence-transformers", "feature-extraction"] +
                    (["cross-encoder"] if any(v is None for v in files["cross"].values()) else []) +
                    (["synthetic-data"] if any(d.synthetic for d in sources.values()) else []),
            **({"base_model": s.base_model, "base_model_relation": "finetune"} if s.base_model else {}),
            **({"model-index": [{"name": name, "results": results}]} if results else {})}


EXAMPLES = {"sst": ("sentiment", '["A gripping, funny film."]'),
            "para": ("paraphrase", '[("How do I learn Python?", "What is the best way to learn Python?")]'),
            "sts": ("similarity", '[("A man plays a guitar.", "A man is playing music.")]')}


def _api_calls(tasks: list[str], known: Mapping[str, Task]) -> list[str]:
    """One call per task: the built-in ones by their methods, any other through `predict`."""
    out = []
    for t in tasks:
        if t in EXAMPLES:
            out.append(f"m.{EXAMPLES[t][0]}({EXAMPLES[t][1]})")
        else:
            out.append(f'm.predict("{t}", {EXAMPLES["para" if known[t].pair else "sst"][1]})')
    return out


def _card_usage(files: dict, tasks: list[str], known: Mapping[str, Task]) -> list[str]:
    """How to load it: sentence-transformers, transformers, the pipeline's API, the cross-encoders."""
    code = files.get("code") or []
    named = files.get("modules") or code            # any module it names is code to trust, carried or not
    trust = ", trust_remote_code=True" if named else ""
    lines = ["## Use it", "",
             "Sentence embeddings (" + files["pooling"] + "), with sentence-transformers:", "", "```python",
             "from sentence_transformers import SentenceTransformer", "",
             'model = SentenceTransformer("path/to/this/folder")     # or its Hub id, once uploaded',
             'model.encode(["A gripping, funny film."])',
             "```", "", "The encoder alone, with transformers:", "", "```python",
             "from transformers import AutoModel, AutoTokenizer", "",
             'encoder = AutoModel.from_pretrained("path/to/this/folder")',
             'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
             "```", "", "Every task head, with the pipeline's API (`pip install` the minBERT pipeline):", "", "```python",
             "from minbert.api import load_model", "", f'm = load_model("path/to/this/folder"{trust})',
             *_api_calls(tasks, known), "```", "",
             f"or `minbert predict path/to/this/folder{' --trust-remote-code' if named else ''} sentences.tsv` on a file.",
             ""]
    if code:
        lines += [f"Its heads or losses are code of the trainer's own, carried in `code/` ({_files(code)}): read it "
                  f"before you load the model, which runs it only when told to (`trust_remote_code=True`, "
                  f"`--trust-remote-code`), and refuses a file that differs from the one exported.", ""]
    for task, why in files["cross"].items():
        if why is None:
            lo, hi = known[task].label_range if known[task].kind == "regression" else (0, 1)
            scaled = f"{hi - lo:g} * output" if lo == 0 else f"{lo:g} + {hi - lo:g} * output"
            map_ = (f"the probability of '{known[task].classes[1] if known[task].classes else 'positive'}' "
                    f"(sigmoid of the logit)" if known[task].kind == "binary"
                    else f"the raw output; the score on the {lo:g}-{hi:g} scale is `min(max({scaled}, {lo:g}), {hi:g})`")
            form = ("in the form of `BertForSequenceClassification`"
                    if files.get("cross_forms", {}).get(task, "BertForSequenceClassification") ==
                    "BertForSequenceClassification" else "as sentence-transformers modules (sentence-transformers 6 "
                    "or later)")
            lines += [f"The {known[task].title} head is a cross-encoder {form}, "
                      f"in `cross-encoder-{task}/`:", "", "```python", "from sentence_transformers import CrossEncoder",
                      "", f'ce = CrossEncoder("path/to/this/folder/cross-encoder-{task}")',
                      'ce.predict([("first sentence", "second sentence")])   # ' + map_, "```", ""]
        else:
            lines += [f"The {known[task].title} head loads through the pipeline's API only ({why}).", ""]
    return lines


def _card_scores(score: dict, synthetic: list[str], tasks: Mapping[str, Task]) -> list[str]:
    lines = ["## Scores", "", "95% percentile bootstrap intervals (2000 resamples), as the pipeline's report computes "
             "them. Overall: the course leaderboard's (SST acc + Para acc + (STS r + 1) / 2) / 3.", ""]
    if synthetic:
        lines += [f"The scores of {', '.join(tasks[t].title for t in synthetic)} are on the synthetic demo data (its "
                  f"dev and test splits), not on those data sets.", ""]
    lines += ["| split | task | metric | value | 95% interval | examples |", "|---|---|---|---|---|---|"]
    for split, row in score.items():
        for key, (value, low, high, n) in row.items():
            title = tasks[key].title if key in tasks else {"overall": "overall (leaderboard)",
                                                           "mean": "plain mean"}[key]
            metric = tasks[key].metric_header if key in tasks else key
            lines.append(f"| {split} | {title} | {metric} | {_fmt(value)} | [{_fmt(low)}, {_fmt(high)}] | {n or ''} |")
    if not score:
        lines.append("| - | no labelled predictions | | | | |")
    return lines
