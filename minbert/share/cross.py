"""A pair task's cross-encoder head as a folder that `sentence_transformers.CrossEncoder` loads
(`cross-encoder-<task>/` of an export, minbert.share.export), in one of two forms:

- `BertForSequenceClassification` (one label): a head that reads the pooler's output through one
  linear layer is exactly that model's classifier; every version of sentence-transformers (and
  `transformers.AutoModelForSequenceClassification`) loads it;
- sentence-transformers modules (`modules.json`): the encoder, the head's pooling (`mean`, `cls`, or
  the pooler as a `Dense` layer with tanh), each hidden layer of the head as a `Dense` layer with
  GELU, and its output layer as the `Dense` module that gives the scores; sentence-transformers 6
  and later load it as a CrossEncoder (the shipped `cross_encoder` experiment's mean pooling).

Either way `CrossEncoder.predict` gives what the pipeline predicts from the head's output: a binary
task's probability (sigmoid, the folder's activation), a regression task's raw output, which the
label range maps to the score (`min(max(lo + (hi - lo) * output, lo), hi)`: 5 * output on STS). A
head's calibration (a fitted map of its outputs, minbert.model.outputs) is folded into the output
layer. A head that reads more than the cross-encoded vector (shared layers, layers of its own above
the encoder, both reading orders) or is code of the user's own has no such form: `cross_encoder_form`
says why.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from minbert.core.tasks import Task
from minbert.model.weights import minbert_to_hf, save_hf_folder

ACTIVATIONS = {"sigmoid": "torch.nn.modules.activation.Sigmoid", "identity": "torch.nn.modules.linear.Identity",
               "tanh": "torch.nn.modules.activation.Tanh", "gelu": "torch.nn.modules.activation.GELU"}


def _json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def cross_encoder_form(model, task: str) -> str | None:
    """Why `task`'s head has no CrossEncoder form (None when it has one: a built-in head on the
    cross view that reads nothing but the encoder's cross-encoded vector, in one reading order)."""
    cfg = model.heads_cfg
    head = model.registry.heads[cfg.head_of(task, model.registry.tasks)]
    if not head.builtin:
        return f"its head '{head.name}' is one of your own (module {head.module})"
    if model.views[task].name != "cross":
        term = " with a cross term" if model.views[task].name == "hybrid" else ""
        return f"its {head.name} head is a bi-encoder{term}: " \
               f"it embeds each sentence apart"
    reasons = [(task in model.branches, "it reads layers of its own above the encoder (`extra_layers`)"),
               (model.shared is not None and task in cfg.shared.tasks, "it reads shared layers"),
               (cfg.symmetric_pairs, "its prediction averages both sentence orders")]
    return next((why for bad, why in reasons if bad), None)


def classification_form(model, task: str) -> bool:
    """Whether the head is exactly `BertForSequenceClassification`'s classifier: the pooler's output
    through one linear layer."""
    return model.heads_cfg.pooling_of(task) == "pooler" and model.heads_cfg.depth(task) == 0


def _layers(model, task: str) -> list[torch.nn.Linear]:
    return [m for m in model.heads[task].net if isinstance(m, torch.nn.Linear)]


def output_layer(model, task: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's output layer (weight, bias) with its calibration folded in: a binary task's logit
    mapped as fitted; a regression task's output such that the label range maps it to the calibrated
    score."""
    last = _layers(model, task)[-1]
    weight, bias = last.weight.detach().cpu().float().clone(), last.bias.detach().cpu().float().clone()
    calibration = model.calibration.get(task)
    spec = model.registry.tasks[task]
    if calibration:
        scale, shift = calibration
        if spec.kind == "binary":                  # logit' = scale * logit + shift
            weight, bias = weight * scale, bias * scale + shift
        elif spec.kind == "regression":            # lo + (hi - lo) * out' = scale * (lo + (hi - lo) * out) + shift
            lo, hi = spec.label_range
            weight, bias = weight * scale, bias * scale + (scale * lo + shift - lo) / (hi - lo)
    return weight.contiguous(), bias.contiguous()


def _labels(spec: Task) -> tuple[list[str], str]:
    """One label name per output, and the activation CrossEncoder.predict applies."""
    names = list(spec.classes) if spec.kind == "classification" else [spec.classes[1] if spec.classes else spec.name]
    return names, "sigmoid" if spec.kind == "binary" else "identity"


def write_cross_encoder(folder: Path, model, task: str, tokenizer) -> str:
    """Write `task`'s head with the encoder into `folder` (see the module docstring); returns its form:
    "BertForSequenceClassification" or "modules"."""
    from safetensors.torch import save_file

    from minbert.share.export import write_tokenizer

    folder.mkdir(parents=True)
    names, activation = _labels(model.registry.tasks[task])
    weight, bias = output_layer(model, task)
    if not classification_form(model, task):
        _write_modules(folder, model, task, tokenizer, (weight, bias), activation)
        write_tokenizer(folder, tokenizer)
        return "modules"
    enc_sd = {k: v for k, v in model.state_dict().items() if k.startswith("encoder.")}
    sd = {f"bert.{k}": v.cpu() for k, v in minbert_to_hf({k[len("encoder."):]: v for k, v in enc_sd.items()}).items()}
    sd["classifier.weight"], sd["classifier.bias"] = weight, bias
    save_file(sd, str(folder / "model.safetensors"))
    _json(folder / "config.json", {
        "model_type": "bert", "architectures": ["BertForSequenceClassification"], **model.encoder.config.to_dict(),
        "id2label": {str(k): name for k, name in enumerate(names)}, "label2id": {n: k for k, n in enumerate(names)},
        "sentence_transformers": {"activation_fn": ACTIVATIONS[activation]}})
    write_tokenizer(folder, tokenizer)
    return "BertForSequenceClassification"


def _dense(folder: Path, linear: tuple[torch.Tensor, torch.Tensor], activation: str, scores: bool = False) -> dict:
    """A sentence-transformers `Dense` module's folder; returns its config."""
    from safetensors.torch import save_file

    weight, bias = linear
    config = {"in_features": weight.shape[1], "out_features": weight.shape[0], "bias": True,
              "activation_function": ACTIVATIONS[activation], "module_input_name": "sentence_embedding",
              "module_output_name": "scores" if scores else "sentence_embedding"}
    _json(folder / "config.json", config)
    save_file({"linear.weight": weight.detach().cpu().float().contiguous(),
               "linear.bias": bias.detach().cpu().float().contiguous()}, str(folder / "model.safetensors"))
    return config


def _write_modules(folder: Path, model, task: str, tokenizer, output: tuple, activation: str) -> None:
    """The encoder, the pooling, the head's layers and its output as sentence-transformers modules."""
    save_hf_folder(folder, model.encoder)
    H = model.encoder.config.hidden_size
    pooling = model.heads_cfg.pooling_of(task)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"}]
    _json(folder / "1_Pooling" / "config.json", {"embedding_dimension": H, "pooling_mode": "mean" if pooling == "mean"
                                                 else "cls", "include_prompt": True})
    dense = [(model.encoder.pooler.dense.weight, model.encoder.pooler.dense.bias, "tanh")] if pooling == "pooler" else []
    dense += [(lin.weight, lin.bias, "gelu") for lin in _layers(model, task)[:-1]]
    dense += [(*output, "identity")]
    for k, (weight, bias, act) in enumerate(dense, start=2):
        path = f"{k}_Dense"
        _dense(folder / path, (weight, bias), act, scores=k == len(dense) + 1)
        modules.append({"idx": k, "name": str(k), "path": path, "type": "sentence_transformers.base.modules.dense.Dense"})
    _json(folder / "modules.json", modules)
    _json(folder / "sentence_bert_config.json", {"transformer_task": "feature-extraction",
                                                 "max_seq_length": tokenizer.max_length, "do_lower_case": False})
    _json(folder / "config_sentence_transformers.json", {"model_type": "CrossEncoder",
                                                         "activation_fn": ACTIVATIONS[activation], "prompts": {},
                                                         "default_prompt_name": None})
