"""Pretraining stage: `python -m stages.pretrain --name P` (masked-LM, NLI or paraphrase-first).

Writes results/pretrain/P/: model/ (Hugging Face layout, tokenizer files included; for mlm also
the MLM head), history.csv (epoch, train_loss, dev_loss), metrics.json, run.json, pretrain.log.
The whole folder is built under a temporary name and renamed into place, so an interrupted run
leaves nothing behind. Experiments name a pretraining, so all experiments with the same one share
this single output.
"""
from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from minbert.errors import MinBertError
from minbert.io import atomic_path, write_json
from minbert.params import ExperimentParams, load_params
from minbert.runinfo import recorded_run
from minbert.runtime import pick_device, setup_logging
from minbert.weights import save_hf_folder, resolve_model

from ._cli import parser, run

HISTORY_COLUMNS = ["epoch", "train_loss", "dev_loss"]


def main(argv: list[str] | None = None) -> None:
    p = parser("Further pretraining (masked-LM, NLI or paraphrase-first) before multi-task fine-tuning.")
    p.add_argument("--name", required=True, help="pretraining name in params.yaml `pretrainings:`")
    p.add_argument("--data", default="results/data", help="prepared data folder (default: results/data)")
    p.add_argument("--out", default=None, help="output folder (default: results/pretrain/NAME)")
    p.add_argument("--cache", default="results/cache/tokens", help="tokenisation cache folder (default: results/cache/tokens)")
    args = p.parse_args(argv)

    loaded = load_params(args.params)
    pparams = loaded.pretraining(args.name)
    exp = ExperimentParams.model_validate(loaded.params.base)
    if pparams.bf16 is not None:
        exp = exp.model_copy(update={"bf16": pparams.bf16})
    model_name = loaded.pretrain_model(args.name)
    out = Path(args.out or f"results/pretrain/{args.name}")
    data_dir = Path(args.data)
    if not data_dir.is_dir():
        raise MinBertError(f"{data_dir}: prepared data folder not found; run `python -m stages.prepare` first")

    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        logger = setup_logging(tmp / "pretrain.log")
        logger.info("pretraining '%s' (%s) from %s", args.name, pparams.kind, model_name)
        with recorded_run(tmp / "run.json", "pretrain", args.name, device=pick_device(exp.device),
                          kind=pparams.kind, model=model_name) as info:
            metrics = _pretrain(pparams, exp, data_dir, model_name, tmp / "model", args.cache)
            write_json(tmp / "metrics.json", metrics)
            info["dev_loss_last"] = metrics.get("dev_loss_last")
        for h in list(logging.getLogger().handlers):   # release the log file before the rename
            if isinstance(h, logging.FileHandler):
                h.close()
                logging.getLogger().removeHandler(h)
    print(f"pretraining '{args.name}' ({pparams.kind}) written to {out}")


def _pretrain(pparams, exp, data_dir: Path, model_name: str, model_dir: Path, cache_dir) -> dict:
    """Run the pretraining kind, save the model folder and history.csv; return metrics.json's dict."""
    if pparams.kind == "para_first":
        from minbert.experiment import pretrain_paraphrase_first

        result = pretrain_paraphrase_first(pparams, exp, data_dir, model_name, model_dir, cache_dir,
                                           work_dir=model_dir.parent / "para_first")
        hist = result.history
        history = [{"epoch": int(r["epoch"]), "train_loss": r.get("train_para_loss"), "dev_loss": r.get("dev_para_loss")}
                   for r in hist.to_dict("records")]
        _write_history(model_dir.parent / "history.csv", history)
        return {"kind": "para_first", "dev_loss_before": (result.dev_before or {}).get("para_loss"),
                "dev_loss_first": history[0]["dev_loss"] if history else None,
                "dev_loss_last": history[-1]["dev_loss"] if history else None,
                "dev_para_acc_best": result.best_dev.get("para_acc"), "best_epoch": result.best_epoch,
                "epochs": len(history)}

    from minbert import pretrain

    run_kind = pretrain.pretrain_mlm if pparams.kind == "mlm" else pretrain.pretrain_nli
    result = run_kind(pparams, exp, data_dir, model_name, cache_dir)
    head = result.mlm_head.checkpoint_tensors() if result.mlm_head is not None else None
    save_hf_folder(model_dir, result.encoder, tokenizer_folder=resolve_model(model_name), mlm_head=head)
    _write_history(model_dir.parent / "history.csv", result.history)
    return {"kind": pparams.kind, **result.metrics}


def _write_history(path: Path, rows: list[dict]) -> None:
    frame = pd.DataFrame(rows)
    for col in HISTORY_COLUMNS:
        if col not in frame.columns:
            frame[col] = pd.Series(dtype=float)
    frame[HISTORY_COLUMNS].to_csv(path, index=False)


if __name__ == "__main__":
    run(main)
