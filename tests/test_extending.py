"""Extending without forking (docs/extending.md): tasks declared as data (the built-in ones too), losses
and heads as objects chosen by name, the guards reading the losses' declarations, the user's own
modules, and the declared tasks' files read with the bad-row rules. The end-to-end runs of the
documented catalogue (params/extending.yaml) under both engines are tests/test_extending_runs.py."""
from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from minbert.core.errors import MinBertError
from minbert.core.registry import Registry, builtin
from minbert.core.tasks import BUILTIN_TASKS, TASKS
from minbert.params import validate_params
from minbert.params.tasks import TaskParams

REPO = Path(__file__).resolve().parents[1]


def demo_params(**changes) -> dict:
    """The demo data with one tiny experiment `a` (a validation fixture: nothing runs)."""
    params = {"data": {"dir": str(REPO / "data/demo"), "nli_file": None},
              "base": {"model": "all-MiniLM-L6-v2", "finetune": {"batch_size": 8}},
              "experiments": {"a": {}}}
    for key, value in changes.items():
        params[key] = value
    return params


def error_of(raw) -> str:
    with pytest.raises(MinBertError) as e:
        validate_params(raw)
    assert "\n" not in str(e.value)
    return str(e.value)


# ---------------------------------------------------------------- tasks as data

def test_the_builtin_tasks_are_declared_as_a_params_file_declares_its_own():
    declared = yaml.safe_load((REPO / "minbert/core/tasks.yaml").read_text())
    assert list(declared) == ["sst", "para", "sts", "cfimdb"]
    for name, decl in declared.items():
        own = TaskParams.model_validate(decl).task(name)     # read as a params file's `tasks:` entry
        assert dataclasses.replace(own, builtin=True) == BUILTIN_TASKS[name]
    assert (TASKS["sst"].kind, TASKS["para"].kind, TASKS["sts"].kind) == ("classification", "binary", "regression")
    assert TASKS["sts"].label_range == (0.0, 5.0) and TASKS["sts"].metric == "pearson"


SNLI = {"title": "inference (SNLI)", "classes": ["entailment", "neutral", "contradiction"],
        "files": {"format": "jsonl", "train": "snli.jsonl", "dev_fraction": 0.2, "group": "captionID",
                  "texts": ["sentence1", "sentence2"], "label": "gold_label", "id": "pairID"}}


@pytest.mark.parametrize("change,message", [
    (lambda t: t.update(range=[0, 5]), "give either 'classes' (their names) or 'range'"),
    (lambda t: t["files"].pop("dev_fraction"), "give either a 'dev' file or 'dev_fraction'"),
    (lambda t: t["files"].update(texts=["a", "b", "c"]), "key 'tasks.mine.files.texts'"),
    (lambda t: t.update(metric="pearson"), "key 'tasks.mine.metric': pearson is for a regression task"),
    # a regression scored by accuracy would end in scikit-learn at the first dev evaluation
    (lambda t: (t.pop("classes"), t.update(range=[0, 5], metric="acc")),
     "key 'tasks.mine.metric': acc is for a task with classes; a regression task's ('range') is pearson"),
    # labels are float32: a range wider than it holds overflowed in fine-tuning
    (lambda t: (t.pop("classes"), t.update(range=[-1e308, 1e308])),
     "key 'tasks.mine.range': [-1e+308, 1e+308] is beyond what a float32 label holds"),
    (lambda t: (t.pop("classes"), t.update(range=[-3e38, 3e38])), "is beyond what a float32 label holds"),
    (lambda t: (t.pop("classes"), t.update(range=[1e10, 1e10 + 1])), "the low end must be below the high end"),
    (lambda t: t["files"].update(format="cs224n"), "format cs224n reads <prefix>"),
    (lambda t: t.update(head="nope"), "key 'tasks.mine.head': 'nope' is no head"),
])
def test_a_bad_task_declaration_is_one_line_naming_its_key(change, message):
    task = copy.deepcopy(SNLI)
    change(task)
    finetune = {"tasks": ["sst", "mine"]} if "head" in task else {}
    raw = demo_params(tasks={"mine": task}, experiments={"a": {"finetune": finetune}})
    msg = error_of(raw)
    assert msg.startswith("params.yaml: key 'tasks.mine") or "experiments.a" in msg, msg
    assert message in msg, msg


def test_a_declared_task_may_not_take_a_builtin_name_and_an_undeclared_one_is_unknown():
    assert "'sts' is a built-in task" in error_of(demo_params(tasks={"sts": SNLI}))
    msg = error_of(demo_params(experiments={"a": {"finetune": {"tasks": ["sst", "snli"]}}}))
    assert "unknown task 'snli'" in msg and "declare another under `tasks`" in msg


def test_a_params_file_declares_exactly_its_own_tasks():
    mine = validate_params(demo_params(tasks={"mine": SNLI}))
    assert "mine" in mine.registry.tasks and set(TASKS) == set(BUILTIN_TASKS)      # nothing else learns of it
    plain = validate_params(demo_params())
    assert "mine" not in plain.registry.tasks and "mine" in mine.registry.tasks


# ---------------------------------------------------------------- losses

def test_the_ranking_loss_against_an_independent_computation():
    """sentence-transformers' MultipleNegativesRankingLoss for labelled pairs, written out with numpy:
    each positive pair's cosine (x 20) against its anchor's cosines to every second sentence of the
    batch, by cross-entropy, averaged over the positive pairs."""
    gen = torch.Generator().manual_seed(0)
    u, v = torch.randn(6, 8, generator=gen, dtype=torch.float64), torch.randn(6, 8, generator=gen, dtype=torch.float64)
    labels = torch.tensor([1, 0, 1, 1, 0, 1])
    loss = builtin().loss("ranking")(torch.zeros(6), labels, (u, v))
    a, b = u.numpy(), v.numpy()
    a, b = a / np.linalg.norm(a, axis=1, keepdims=True), b / np.linalg.norm(b, axis=1, keepdims=True)
    terms = []
    for i in np.flatnonzero(labels.numpy()):
        scores = 20.0 * (b @ a[i])
        terms.append(np.log(np.exp(scores - scores.max()).sum()) + scores.max() - scores[i])
    assert float(loss) == pytest.approx(float(np.mean(terms)), rel=1e-5)
    # no positive pair: nothing to rank, a zero that still carries a graph
    none = builtin().loss("ranking")(torch.zeros(3), torch.zeros(3), (u[:3].requires_grad_(), v[:3]))
    assert float(none) == 0.0 and none.requires_grad


def test_every_loss_declares_what_the_guards_read():
    losses = builtin().losses
    assert {n for n, c in losses.items() if c.batch_statistic} == {"pearson", "mse+pearson", "ranking"}
    assert {n for n, c in losses.items() if c.calibrate} == {"pearson", "ranking"}
    assert losses["ranking"].reads == "pairs" and losses["ranking"].kinds == ("binary",)
    msg = error_of(demo_params(experiments={"a": {"finetune": {"heads": {"losses": {"para": "ranking"}}}}}))
    assert "para's loss 'ranking' ranks the pair's sentence embeddings: give para a bi-encoder head" in msg
    msg = error_of(demo_params(experiments={"a": {"finetune": {"heads": {"losses": {"sst": "mse"}}}}}))
    assert "key 'experiments.a.finetune.heads.losses.sst': sst's loss 'mse' trains regression tasks, and sst is " \
           "classification" in msg


BATCH_LOSS = '''
from minbert.core.register import Loss, register_loss


@register_loss
class BatchCentred(Loss):
    """Cross-entropy of the logits centred on the batch's mean: a statistic of the whole batch."""
    name, kinds, batch_statistic = "batch_centred", ("classification",), True

    def __call__(self, output, target, pair=None):
        import torch.nn.functional as F

        return F.cross_entropy(output - output.mean(0), target.long())
'''


def test_the_three_guards_read_a_losses_declaration(tmp_path, monkeypatch):
    """A loss of the user's declared a batch statistic is refused over batches of one by the params
    check, under torchrun's per-process slices, and over training data of one row."""
    from minbert.train.distributed import refuse_batch_statistics
    from minbert.train.experiment import refuse_one_row_batches

    monkeypatch.chdir(tmp_path)
    (tmp_path / "batch_loss.py").write_text(BATCH_LOSS)
    heads = {"losses": {"sst": "batch_centred"}}
    raw = demo_params(modules=["batch_loss.py"],
                      experiments={"a": {"finetune": {"tasks": ["sst"], "batch_size": 1, "heads": heads}}})
    msg = error_of(raw)
    assert msg.startswith("params.yaml: key 'experiments.a.finetune.batch_size': sst's loss 'batch_centred' is a "
                          "statistic of the whole batch, and a batch of 1 sst row carries none"), msg
    raw["experiments"]["a"]["finetune"]["batch_size"] = 2
    lp = validate_params(raw)
    exp = lp.experiments["a"]
    with lp.registry.active(), pytest.raises(MinBertError, match=r"sst's loss 'batch_centred' is a statistic of the "
                                                                 r"whole batch, which 2 processes would each compute"):
        refuse_batch_statistics(exp.finetune.heads, ["sst"], 2)
    with lp.registry.active(), pytest.raises(MinBertError, match=r"^a: sst's loss 'batch_centred' is a statistic of "
                                                                 r"the whole batch, and the sst training data has 1 row"):
        refuse_one_row_batches(exp.finetune, {"sst": [0]}, "a")
    # the same loss declared row by row: none of them refuses
    (tmp_path / "row_loss.py").write_text(BATCH_LOSS.replace("batch_centred", "row_centred")
                                          .replace(", True\n", ", False\n"))
    raw = demo_params(modules=["row_loss.py"], experiments={"a": {"finetune": {
        "tasks": ["sst"], "batch_size": 1, "heads": {"losses": {"sst": "row_centred"}}}}})
    lp = validate_params(raw)
    with lp.registry.active():
        refuse_batch_statistics(lp.experiments["a"].finetune.heads, ["sst"], 2)
        refuse_one_row_batches(lp.experiments["a"].finetune, {"sst": [0]}, "a")


# ---------------------------------------------------------------- the user's modules

def test_a_missing_or_broken_module_or_an_undefined_name_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert error_of(demo_params(modules=["ext/nowhere.py"])) == (
        "params.yaml: key 'modules': no file ext/nowhere.py; give a path from the project's folder or an importable "
        "module name")
    msg = error_of(demo_params(modules=["no_such_module_of_yours"]))
    assert msg.startswith("params.yaml: key 'modules': module 'no_such_module_of_yours' cannot be imported "
                          "(ModuleNotFoundError: No module named 'no_such_module_of_yours')"), msg
    (tmp_path / "broken.py").write_text("import torch\nraise RuntimeError('a bug in my module')\n")
    msg = error_of(demo_params(modules=["broken.py"]))
    assert "module 'broken.py' cannot be imported (RuntimeError: a bug in my module)" in msg, msg
    losses = str(REPO / "examples/extending/losses.py")
    wrong = {"a": {"finetune": {"heads": {"losses": {"sts": "hubber"}}}}}
    msg = error_of(demo_params(modules=[losses], experiments=wrong))
    assert "sts's loss 'hubber' is no loss (did you mean 'huber'?): neither built in nor registered by the modules " \
           "named (" in msg and losses in msg, msg
    msg = error_of(demo_params(modules=[losses], experiments={"a": {"finetune": {"heads": {"sts": "trilinear"}}}}))
    assert "key 'experiments.a.finetune.heads.sts': sts's head 'trilinear' is no pair head" in msg, msg


def test_a_modules_head_and_loss_are_used_by_name(tiny_model_dir):
    from minbert.model.multitask import MultitaskModel
    from minbert.model.weights import load_encoder
    from minbert.train.losses import task_loss

    raw = demo_params(modules=[str(REPO / "examples/extending/heads.py"), str(REPO / "examples/extending/losses.py")],
                      experiments={"a": {"finetune": {"heads": {"sts": "bilinear", "losses": {"sts": "huber"}}}}})
    lp = validate_params(raw)
    heads = lp.experiments["a"].finetune.heads
    model = MultitaskModel(load_encoder(tiny_model_dir)[0], heads, ["sts"], lp.registry)
    assert type(model.heads["sts"]).__name__ == "Bilinear" and model.views["sts"].name == "bi"
    out = torch.tensor([0.1, 0.9], requires_grad=True), torch.tensor([0.0, 5.0])
    expected = torch.nn.functional.huber_loss(out[0], out[1] / 5.0, delta=0.1)     # labels scaled to [0, 1]
    with lp.registry.active():
        assert float(task_loss("sts", heads, *out)) == pytest.approx(float(expected))
    with pytest.raises(KeyError):                  # another params file's registry knows no huber
        task_loss("sts", heads, *out)


# ---------------------------------------------------------------- reading a declared task's files

def test_a_declared_tasks_csv_is_read_with_the_bad_row_rules(tmp_path):
    from minbert.data.declared import read_declared

    path = tmp_path / "mine.csv"
    path.write_text('id,text,score\n1,"a quoted text, with a comma",3.5\n2,"two\nlines",1\n3,,2\n4,fine,2\n'
                    '4,again,1\n5,"ok",\n6,bad,9\n', encoding="utf-8")
    spec = TaskParams.model_validate({"range": [0, 5], "files": {"train": str(path), "dev_fraction": 0.5,
                                                                 "texts": ["text"], "label": "score", "id": "id"}})
    task = spec.task("mine")
    with Registry.of(tasks={"mine": spec.declaration()}).active():
        with pytest.raises(MinBertError, match=rf"^{path} line 5: column 'text' is empty \(id 3\); fix the file or set "
                                               r"data.on_bad_rows: drop"):
            read_declared(task, "train")
        frame, report, _ = read_declared(task, "train", on_bad_rows="drop")
    assert list(frame["sentence"]) == ["a quoted text, with a comma", "two lines", "fine"]
    assert list(frame["label"]) == [3.5, 1.0, 2.0] and list(frame["id"]) == ["1", "2", "4"]
    assert report.dropped == {"empty_text": 1, "duplicate_id": 1, "missing_label": 1, "bad_label": 1}
    assert report.read == 7 and report.kept == 3


# ---------------------------------------------------------------- the dev loss in batches, calibration

def test_the_dev_loss_is_computed_batch_by_batch(tiny_model_dir):
    """A mean loss over rows comes out as over the whole split; a batch statistic as the mean of the
    batches' (what training minimises), and a ranking loss never builds the split's square."""
    from contextlib import nullcontext
    from functools import partial

    import pandas as pd

    from minbert.data.batches import build_task_data
    from minbert.model.multitask import MultitaskModel, predict_task
    from minbert.model.tokenizer import Tokenizer
    from minbert.model.weights import load_encoder
    from minbert.params.finetune import HeadsParams
    from minbert.train.losses import task_loss

    tokenizer = Tokenizer(tiny_model_dir, 32)
    frame = pd.DataFrame({"id": [str(i) for i in range(10)], "label": [i % 5 for i in range(10)],
                          "sentence": [f"a sentence of {i} words" for i in range(10)]})
    torch.manual_seed(0)
    for heads, task in ((HeadsParams(), "sst"), (HeadsParams(losses={"sts": "pearson"}), "sts")):
        data_frame = frame if task == "sst" else frame.rename(columns={"sentence": "sentence1"}).assign(
            sentence2=frame["sentence"].str.upper(), label=frame["label"] * 1.0)
        model = MultitaskModel(load_encoder(tiny_model_dir)[0], heads, [task]).eval()
        data = build_task_data(task, data_frame, tokenizer, heads)
        res = predict_task(model, data, tokenizer, 4, torch.device("cpu"), nullcontext,
                           loss=partial(task_loss, task, heads))
        whole = float(task_loss(task, heads, res["output"], torch.tensor(data.labels)))
        if task == "sst":
            assert res["loss"] == pytest.approx(whole, rel=1e-5)
        else:       # batches of 4, 4 and 2 rows in length order: the rows' mean of each batch's 1 - r
            order = np.argsort(data.lengths(), kind="stable")
            parts = [order[k:k + 4] for k in range(0, 10, 4)]
            by_batch = sum(len(p) * float(task_loss(task, heads, res["output"][p], torch.tensor(data.labels[p])))
                           for p in parts) / 10
            assert res["loss"] == pytest.approx(by_batch, rel=1e-5) and res["loss"] != pytest.approx(whole, rel=1e-3)


def test_a_ranking_trained_heads_logit_is_calibrated_by_a_logistic_fit():
    from minbert.model.outputs import predictions
    from minbert.params.finetune import HeadsParams
    from minbert.train.evaluation import logistic_fit

    heads = HeadsParams(para="cosine", losses={"para": "ranking"})
    out = torch.tensor([-1.0, 0.0, 2.0])
    plain = predictions("para", HeadsParams(para="cosine"), out, None)["probs"]
    assert np.allclose(plain, torch.sigmoid(out).numpy())            # a head on the labels' scale
    fitted = predictions("para", heads, out, [2.0, -1.0])["probs"]
    assert np.allclose(fitted, torch.sigmoid(2.0 * out - 1.0).numpy())
    rng = np.random.default_rng(0)
    x = rng.normal(size=1000)
    y = (rng.random(1000) < 1 / (1 + np.exp(-(3.0 * x - 0.5)))).astype(float)
    scale, shift = logistic_fit(x, y)
    assert scale == pytest.approx(3.0, rel=0.2) and shift == pytest.approx(-0.5, abs=0.25)


def test_a_modules_path_is_one_spelling_so_one_job(tmp_path, monkeypatch):
    """`./ext/heads.py` for `ext/heads.py` (the same file) described another job: it re-trained every
    job that uses the module."""
    from minbert.pipeline.plan import job_for

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ext").mkdir()
    shutil.copyfile(REPO / "examples/extending/heads.py", tmp_path / "ext" / "heads.py")
    described = set()
    for spelling in ("ext/heads.py", "./ext/heads.py", "ext//heads.py", "ext/../ext/heads.py/"):
        raw = demo_params(modules=[spelling, "ext/heads.py"], experiments={"a": {"finetune": {"heads": {
            "sts": "bilinear"}}}})
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
        job = job_for("params.yaml", "finetune", "a")
        assert job.settings["modules"] == ["ext/heads.py"]
        described.add(json.dumps(job.description(), sort_keys=True))
    assert len(described) == 1
