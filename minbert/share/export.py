"""A trained multi-task model in the Hugging Face format, with a model card: what people share.

The folder (results/exports/<E>/, written by the export stage) holds

    config.json, model.safetensors       the encoder as `BertModel` (transformers.AutoModel loads it)
    tokenizer.json, vocab.txt,           the tokenizer (transformers.AutoTokenizer)
    tokenizer_config.json, special_tokens_map.json
    modules.json, sentence_bert_config.json, 1_Pooling/config.json [, 2_Dense/]
                                          the sentence-transformers pipeline: the encoder, then the
                                          experiment's pooling (`pooler`: the CLS vector through the
                                          pooler's dense layer and tanh, as 2_Dense)
    heads.safetensors, minbert.json      the task heads (and shared layers, branches) and what
                                          rebuilds the multi-task model (minbert.api.load_model)
    cross-encoder-<task>/                 a cross-encoder pair head in the form of
                                          `BertForSequenceClassification` (sentence_transformers.CrossEncoder
                                          loads it), when the head has that form (`cross_encoder_form`)
    README.md                            the model card: Hub metadata, scores with 95% intervals,
                                          training settings, data, provenance

`read_export` turns the folder back into a checkpoint dict (minbert.model.checkpoint.model_from_checkpoint),
so the pipeline's own code predicts from it. Uploading (`upload`) runs only when asked.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from minbert.core.errors import MinBertError
from minbert.core.tasks import LEADERBOARD_TASKS, TASKS

EXPORT_FORMAT = "minbert-export-1"
MANIFEST = "minbert.json"
HEADS_FILE = "heads.safetensors"
TOKEN_NAMES = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]",
               "unk_token": "[UNK]"}


# ---------------------------------------------------------------- writing

def write_tokenizer(folder: Path, tokenizer) -> None:
    """tokenizer.json (no truncation or padding of its own: the caller sets them), vocab.txt and
    the configs transformers.AutoTokenizer reads."""
    spec = json.loads(tokenizer.to_json())
    spec["truncation"], spec["padding"] = None, None
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False) + "\n", encoding="utf-8")
    vocab = tokenizer.vocabulary()
    (folder / "vocab.txt").write_text("".join(t + "\n" for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])),
                                      encoding="utf-8")
    lower = bool((spec.get("normalizer") or {}).get("lowercase", True))
    cfg = {"tokenizer_class": "BertTokenizer", "do_lower_case": lower, "model_max_length": tokenizer.max_length,
           "clean_up_tokenization_spaces": True, **TOKEN_NAMES}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps(TOKEN_NAMES, indent=2) + "\n", encoding="utf-8")


def _json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def write_sentence_transformers(folder: Path, model, max_length: int) -> str:
    """modules.json and the modules' configs: encoder, pooling (and the pooler's dense layer).
    Returns the pooling as the card says it."""
    from safetensors.torch import save_file

    H = model.encoder.config.hidden_size
    pooling = model.heads_cfg.pooling
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    mode = "mean" if pooling == "mean" else "cls"
    _json(folder / "1_Pooling" / "config.json", {
        "word_embedding_dimension": H, "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False, "include_prompt": True})
    if pooling == "pooler":
        modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
        _json(folder / "2_Dense" / "config.json", {"in_features": H, "out_features": H, "bias": True,
                                                    "activation_function": "torch.nn.modules.activation.Tanh"})
        dense = model.encoder.pooler.dense
        save_file({"linear.weight": dense.weight.detach().cpu().contiguous(),
                   "linear.bias": dense.bias.detach().cpu().contiguous()}, str(folder / "2_Dense" / "model.safetensors"))
    _json(folder / "modules.json", modules)
    _json(folder / "sentence_bert_config.json", {"max_seq_length": max_length, "do_lower_case": False})
    _json(folder / "config_sentence_transformers.json", {"model_type": "SentenceTransformer",
                                                         "similarity_fn_name": "cosine", "prompts": {},
                                                         "default_prompt_name": None})
    return {"mean": "mean of the token vectors", "cls": "the [CLS] token's vector",
            "pooler": "the [CLS] vector through the pooler (dense layer and tanh)"}[pooling]


def cross_encoder_form(model, task: str) -> str | None:
    """Why `task`'s head is not a `BertForSequenceClassification` (None when it is one: a cross
    view, the pooler's output, a single linear layer, nothing shared or added, one reading order)."""
    cfg = model.heads_cfg
    head = model.registry.heads[cfg.head_of(task)]
    if not head.builtin:
        return f"its head '{head.name}' is one of your own (module {head.module})"
    if model.views[task].name != "cross":
        return f"its {cfg.head_of(task)} head is a bi-encoder{' with a cross term' if model.views[task].name == 'hybrid' else ''}: " \
               f"it embeds each sentence apart"
    reasons = [(cfg.pooling_of(task) != "pooler", f"it reads the {cfg.pooling_of(task)} pooling, not the pooler's output"),
               (cfg.depth(task) > 0, "its head has hidden layers"),
               (model.shared is not None and task in cfg.shared.tasks, "it reads shared layers"),
               (cfg.symmetric_pairs, "its prediction averages both sentence orders")]
    return next((why for bad, why in reasons if bad), None)


def write_cross_encoder(folder: Path, model, task: str, tokenizer) -> None:
    """`task`'s cross-encoder head with the encoder as BertForSequenceClassification (one label):
    sentence_transformers.CrossEncoder(folder) predicts its logit through `activation_fn`
    (sigmoid: the paraphrase probability; identity: the raw similarity output)."""
    from safetensors.torch import save_file

    from minbert.model.weights import minbert_to_hf

    folder.mkdir(parents=True)
    enc_sd = {k: v for k, v in model.state_dict().items() if k.startswith("encoder.")}
    sd = {f"bert.{k}": v.cpu() for k, v in minbert_to_hf({k[len("encoder."):]: v for k, v in enc_sd.items()}).items()}
    linear = model.heads[task].net[-1]
    sd["classifier.weight"] = linear.weight.detach().cpu().contiguous()
    sd["classifier.bias"] = linear.bias.detach().cpu().contiguous()
    save_file(sd, str(folder / "model.safetensors"))
    spec = TASKS[task]
    activation = "Sigmoid" if spec.kind == "binary" else "Identity"
    module = "activation" if activation == "Sigmoid" else "linear"
    # one label per logit: a softmax task's classes, else the positive class or the score
    names = list(spec.classes) if spec.kind == "classification" else [spec.classes[1] if spec.classes else spec.name]
    _json(folder / "config.json", {
        "model_type": "bert", "architectures": ["BertForSequenceClassification"], **model.encoder.config.to_dict(),
        "id2label": {str(k): name for k, name in enumerate(names)}, "label2id": {n: k for k, n in enumerate(names)},
        "sentence_transformers": {"activation_fn": f"torch.nn.modules.{module}.{activation}"}})
    write_tokenizer(folder, tokenizer)


def export_model(model, tokenizer, folder: str | Path, card: str = "", extra: dict | None = None) -> dict:
    """Write the export folder (the caller makes it atomic). Returns what the card needs to say
    of the files: pooling and the cross-encoder forms."""
    from safetensors.torch import save_file

    from minbert.model.weights import save_hf_folder

    folder = Path(folder)
    model = model.cpu().eval()
    save_hf_folder(folder, model.encoder)
    write_tokenizer(folder, tokenizer)
    pooling = write_sentence_transformers(folder, model, tokenizer.max_length)
    heads = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if not k.startswith("encoder.")}
    save_file(heads, str(folder / HEADS_FILE), metadata={"format": EXPORT_FORMAT})
    from minbert.model.checkpoint import declared

    own = declared(model)       # the user's tasks and modules, which loading it again needs
    _json(folder / MANIFEST, {"format": EXPORT_FORMAT, "tasks": model.tasks, "heads": model.heads_cfg.model_dump(mode="json"),
                              **({"declared": own} if own else {}),
                              "calibration": model.calibration, "max_length": tokenizer.max_length, **(extra or {})})
    cross = {}
    for task in model.tasks:
        if TASKS[task].pair:
            why = cross_encoder_form(model, task)
            if why is None:
                write_cross_encoder(folder / f"cross-encoder-{task}", model, task, tokenizer)
            cross[task] = why
    if card:
        (folder / "README.md").write_text(card, encoding="utf-8")
    umask = os.umask(0)
    os.umask(umask)
    for p in folder.rglob("*"):          # safetensors writes its files for the owner only: a shared model is readable
        if p.is_file():
            p.chmod(0o666 & ~umask)
    return {"pooling": pooling, "cross": cross}


# ---------------------------------------------------------------- reading back

def read_export(folder: str | Path) -> dict:
    """An export folder as a checkpoint dict (minbert.model.checkpoint.model_from_checkpoint builds it)."""
    from safetensors.torch import load_file

    from minbert.model.weights import hf_to_minbert, read_config, read_state_dict

    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise MinBertError(f"{folder / MANIFEST}: cannot be read ({type(e).__name__}); export the model again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != EXPORT_FORMAT:
        raise MinBertError(f"{folder / MANIFEST}: not a {EXPORT_FORMAT} manifest; export the model again")
    config = read_config(folder)
    sd, weights_file = read_state_dict(folder)
    encoder_sd, _, unexpected = hf_to_minbert(sd, str(weights_file))
    if unexpected:
        raise MinBertError(f"{weights_file}: unexpected tensors ({unexpected[0]}); export the model again")
    try:
        heads = load_file(str(folder / HEADS_FILE))
    except Exception as e:  # a missing or damaged file: safetensors raises its own types
        raise MinBertError(f"{folder / HEADS_FILE}: cannot be read ({type(e).__name__}); export the model again") from None
    tokenizer_json = (folder / "tokenizer.json").read_text(encoding="utf-8")
    return {"format": "minbert-multitask-1", "encoder_config": config.to_dict(), "heads": manifest["heads"],
            "tasks": manifest["tasks"], "state_dict": {**{f"encoder.{k}": v for k, v in encoder_sd.items()}, **heads},
            "tokenizer_json": tokenizer_json, "max_length": manifest["max_length"],
            "calibration": manifest.get("calibration") or {}, **({"declared": manifest["declared"]}
                                                                  if manifest.get("declared") else {})}


# ---------------------------------------------------------------- the model card

def _fmt(x: float) -> str:
    return f"{x:.4f}"


def scores(predictions: str | Path) -> dict:
    """{split: {task: (value, low, high, n)}, "overall": ...} with 95% percentile bootstrap
    intervals (minbert.scoring.stats, as the report computes them) for every labelled split."""
    from minbert.core.layout import prediction_file
    from minbert.scoring.evaluate import labelled, read_predictions
    from minbert.scoring.stats import Sample, overall_estimates, task_estimate

    out: dict = {}
    for split in ("dev", "test"):
        ests = {}
        for task in TASKS:
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


def model_card(s, name: str, files: dict, score: dict, training: dict, data: dict, provenance: dict) -> str:
    """The README.md: Hub metadata (YAML), then what the model is (the model it started from, the
    data it was trained on: the synthetic demo data named as such), how to load it, its scores with
    95% intervals, its training settings, data and provenance. `s`: the export's settings
    (minbert.params.settings.ExportSettings). Scores on the demo data go to no Hub metadata: its
    model-index would claim SST-5, Quora and STS results for a model that never saw them."""
    import yaml

    tasks = training.get("finetune", {}).get("tasks") or list(LEADERBOARD_TASKS)
    titles = ", ".join(TASKS[t].title for t in tasks)
    trained_on = (f"the minBERT demo data: synthetic, template-generated sentences in the layout of {titles} "
                  f"(`{s.data}`), not those data sets; its scores below show that the pipeline works, not what the "
                  f"model is worth" if s.demo_data else f"{titles} (the data in `{s.data}`)")
    start = f"`{s.start_model}`" if s.start_model else "its base model"
    lineage = f"{start}, further pretrained by `{s.pretraining}`," if s.pretraining else start
    lines = ["---", yaml.safe_dump(_card_metadata(s, name, files, score), sort_keys=False, allow_unicode=True).rstrip(),
             "---", "", f"# {name}", "", (s.description or "A multi-task minBERT model.") + "", "",
             f"A BERT encoder: {lineage} then fine-tuned on {len(tasks)} tasks at once by the minBERT multi-task "
             f"pipeline, with one head per task. Trained on {trained_on}.", ""]
    if s.start_model and training.get("model") is None and training.get("pretrain"):
        training = {**training, "model": f"{s.start_model} after pretraining {training['pretrain']}"}
    lines += _card_usage(files, tasks) + _card_scores(score, s.demo_data)
    lines += ["", "## Training", "", "The settings the fine-tuning ran with (the pipeline's resolved job description):",
              "", "```yaml", yaml.safe_dump(training, sort_keys=True).rstrip(), "```", "", "## Data", ""]
    for key, value in data.items():
        lines.append(f"- {key}: {value}")
    lines += ["", "## Provenance", ""] + [f"- {k}: `{v}`" for k, v in provenance.items()] + [""]
    return "\n".join(lines)


def _card_metadata(s, name: str, files: dict, score: dict) -> dict:
    """The Hub's metadata: language, license, tags, base model, and the scores as its model-index
    (none for the synthetic demo data, which is no data set of the Hub's)."""
    results = []
    for split, row in score.items():
        for task, (value, *_rest) in row.items():
            if task in TASKS and not s.demo_data:
                results.append({"task": {"type": "text-classification" if TASKS[task].kind != "regression"
                                         else "sentence-similarity", "name": TASKS[task].title},
                                "dataset": {"name": f"{TASKS[task].title} ({split})", "type": task, "split": split},
                                "metrics": [{"type": "accuracy" if TASKS[task].metric == "acc" else "pearsonr",
                                             "value": round(float(value), 4),
                                             "name": f"{split} {TASKS[task].metric_header}"}]})
    return {"language": [s.language], "license": s.license, "library_name": "sentence-transformers",
            "pipeline_tag": "sentence-similarity",
            "tags": ["minbert", "bert", "multi-task", "sentence-transformers", "feature-extraction"] +
                    (["cross-encoder"] if any(v is None for v in files["cross"].values()) else []) +
                    (["synthetic-data"] if s.demo_data else []),
            **({"base_model": s.base_model, "base_model_relation": "finetune"} if s.base_model else {}),
            **({"model-index": [{"name": name, "results": results}]} if results else {})}


def _card_usage(files: dict, tasks: list[str]) -> list[str]:
    """How to load it: sentence-transformers, transformers, the pipeline's API, the cross-encoders."""
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
             "from minbert.api import load_model", "", 'm = load_model("path/to/this/folder")',
             *[f"m.{fn}({arg})" for t, fn, arg in (("sst", "sentiment", '["A gripping, funny film."]'),
                                                   ("para", "paraphrase", '[("How do I learn Python?", '
                                                                          '"What is the best way to learn Python?")]'),
                                                   ("sts", "similarity", '[("A man plays a guitar.", '
                                                                         '"A man is playing music.")]'))
               if t in tasks],
             "```", "", "or `minbert predict path/to/this/folder sentences.tsv` on a file.", ""]
    for task, why in files["cross"].items():
        if why is None:
            map_ = ("the paraphrase probability (sigmoid of the logit)" if TASKS[task].kind == "binary"
                    else "the raw output; the similarity on the 0-5 scale is `min(max(5 * output, 0), 5)`")
            lines += [f"The {TASKS[task].title} head is a cross-encoder in the form of `BertForSequenceClassification`, "
                      f"in `cross-encoder-{task}/`:", "", "```python", "from sentence_transformers import CrossEncoder",
                      "", f'ce = CrossEncoder("path/to/this/folder/cross-encoder-{task}")',
                      'ce.predict([("first sentence", "second sentence")])   # ' + map_, "```", ""]
        else:
            lines += [f"The {TASKS[task].title} head loads through the pipeline's API only ({why}).", ""]
    return lines


def _card_scores(score: dict, demo_data: bool = False) -> list[str]:
    lines = ["## Scores", "", "95% percentile bootstrap intervals (2000 resamples), as the pipeline's report computes "
             "them. Overall: the course leaderboard's (SST acc + Para acc + (STS r + 1) / 2) / 3.", ""]
    if demo_data:
        lines += ["On the synthetic demo data (its dev and test splits), not on SST-5, Quora or STS.", ""]
    lines += ["| split | task | metric | value | 95% interval | examples |", "|---|---|---|---|---|---|"]
    for split, row in score.items():
        for key, (value, low, high, n) in row.items():
            title = TASKS[key].title if key in TASKS else {"overall": "overall (leaderboard)", "mean": "plain mean"}[key]
            metric = TASKS[key].metric_header if key in TASKS else key
            lines.append(f"| {split} | {title} | {metric} | {_fmt(value)} | [{_fmt(low)}, {_fmt(high)}] | {n or ''} |")
    if not score:
        lines.append("| - | no labelled predictions | | | | |")
    return lines


# ---------------------------------------------------------------- the Hub

def upload(folder: str | Path, repo_id: str, private: bool = False, revision: str | None = None) -> str:
    """Upload an export folder to a Hub model repository (network; a token from `hf auth login`
    or HF_TOKEN). Never part of a pipeline run. Returns the repository's URL."""
    from huggingface_hub import HfApi

    folder = Path(folder)
    if not (folder / MANIFEST).is_file() or not (folder / "README.md").is_file():
        raise MinBertError(f"{folder}: not an export folder (no {MANIFEST} or README.md); run the export stage "
                           f"(snakemake --cores all results/exports/<experiment>)")
    api = HfApi()
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model", revision=revision,
                          commit_message=f"Upload {folder.name} (minBERT export)")
    except Exception as e:  # huggingface_hub's errors: no token, no network, no permission
        raise MinBertError(f"{repo_id}: upload failed ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); "
                           f"log in with `hf auth login` (or set HF_TOKEN) and check the network") from None
    return str(url)


# ---------------------------------------------------------------- the export stage

def _rows(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return max(sum(1 for _ in f) - 1, 0)


def export_experiment(s, name: str, model_path, training_record, predictions, train_splits: list[str], out_dir,
                      fingerprint: str = "") -> list[str]:
    """The export stage: the experiment's model, its card from its training record (settings,
    fingerprint, git revision), its predictions (scores with intervals) and its training data."""
    from minbert.core.io import atomic_path
    from minbert.core.provenance import git_revision
    from minbert.model.checkpoint import load_checkpoint

    model, tokenizer, ckpt = load_checkpoint(model_path, expect={"experiment": name, "stage": s.model_stage,
                                                                 "record_path": training_record})
    try:
        record = json.loads(Path(training_record).read_text(encoding="utf-8"))
        training = record["description"]["settings"]
    except (OSError, ValueError, KeyError, TypeError):
        raise MinBertError(f"{training_record}: the training run record cannot be read; re-run the "
                           f"{s.model_stage} stage of {name}") from None
    data = {"data folder": (f"`{s.data}`" + (" (the synthetic demo data: its README.md)" if s.demo_data else ""))
            if s.data else "-"}
    for path in train_splits:
        data[f"training rows, {Path(path).stem.replace('-train', '')}"] = _rows(path)
    ds = (training.get("finetune") or training.get("train") or {}).get("downsample")
    if ds:
        data["downsampling of the training data"] = json.dumps(ds, sort_keys=True)
    provenance = {"experiment": name, "model": f"{s.model_stage}/model.pt, epoch {ckpt.get('epoch', '-')}",
                  "training fingerprint": record.get("fingerprint", "-"),
                  "training git revision": record.get("git_revision", "-"),
                  "export fingerprint": fingerprint or "-", "export git revision": git_revision()}
    with atomic_path(out_dir) as tmp:
        files = export_model(model, tokenizer, tmp, extra={"experiment": name, "model_stage": s.model_stage})
        card = model_card(s, name, files, scores(predictions), training, data, provenance)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        written = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
    return written


__all__ = ["export_model", "export_experiment", "read_export", "model_card", "scores", "upload", "cross_encoder_form"]
