"""NLI objectives against hand-computed values; triplet building on real SNLI rows."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from minbert.core.errors import MinBertError
from minbert.train.nli import build_triplets, contrastive_loss, embed, regression_loss, regression_targets, triplet_loss


def test_regression_loss_by_hand():
    u = torch.tensor([[1.0, 0.0], [2.0, 0.0], [1.0, 0.0]])
    v = torch.tensor([[3.0, 0.0], [0.0, 5.0], [-1.0, 0.0]])   # cos = 1, 0, -1
    target = regression_targets(["entailment", "neutral", "contradiction"])
    assert target.tolist() == [1.0, 0.5, 0.0]
    # ((1-1)^2 + (0-0.5)^2 + (-1-0)^2) / 3
    assert regression_loss(u, v, target).item() == pytest.approx(1.25 / 3, abs=1e-6)
    with pytest.raises(MinBertError, match="'-'"):
        regression_targets(["entailment", "-"])


def test_contrastive_loss_by_hand():
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    p = torch.tensor([[3.0, 0.0], [1.0, 1.0]])
    n = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])
    tau = 0.5
    r2 = 1 / math.sqrt(2)
    # row 1: cos with p1, p2, n1, n2 = 1, 1/sqrt2, 0, -1; the answer is p1
    l1 = -math.log(math.exp(1 / tau) / sum(math.exp(c / tau) for c in (1, r2, 0, -1)))
    # row 2: cos = 0, 1/sqrt2, 1, 0; the answer is p2 (its hard negative n2 is orthogonal)
    l2 = -math.log(math.exp(r2 / tau) / sum(math.exp(c / tau) for c in (0, r2, 1, 0)))
    assert contrastive_loss(a, p, n, tau).item() == pytest.approx((l1 + l2) / 2, abs=1e-5)


def test_triplet_loss_by_hand():
    a = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    p = torch.tensor([[3.0, 4.0], [1.0, 2.0]])   # distances 5, 1
    n = torch.tensor([[0.0, 1.0], [1.0, 4.0]])   # distances 1, 3
    # max(5 - 1 + 1, 0) = 5 and max(1 - 3 + 1, 0) = 0
    assert triplet_loss(a, p, n, margin=1.0).item() == pytest.approx(2.5, abs=1e-6)
    assert triplet_loss(a, p, n, margin=3.0).item() == pytest.approx((7 + 1) / 2, abs=1e-6)


def test_objectives_give_gradients_through_the_encoder(tiny_model_dir):
    from minbert.model.tokenizer import Tokenizer
    from minbert.model.weights import load_encoder

    enc, _, folder = load_encoder(tiny_model_dir)
    tok = Tokenizer(folder, 32)
    batch = tok(["a man plays guitar", "a dog runs", "two women talk", "nobody is outside"] * 2)
    h = embed(enc, batch, "mean")
    assert h.shape == (8, enc.config.hidden_size)
    torch.testing.assert_close(embed(enc.eval(), batch, "cls"), enc(**batch)[0][:, 0])
    loss = triplet_loss(h[:2], h[2:4], h[4:6]) + contrastive_loss(h[:2], h[2:4], h[4:6]) \
        + regression_loss(h[:2], h[2:4], torch.tensor([1.0, 0.0]))
    loss.backward()
    assert enc.embeddings.word.weight.grad.abs().sum() > 0


@pytest.fixture(scope="module")
def snli(shared_data) -> pd.DataFrame:
    raw = pd.read_json(shared_data / "nli" / "snli-sample.jsonl", lines=True)
    raw = raw[raw["gold_label"].isin(["entailment", "neutral", "contradiction"])]
    return pd.DataFrame({"id": raw["pairID"], "group": raw["captionID"], "sentence1": raw["sentence1"],
                         "sentence2": raw["sentence2"], "label": raw["gold_label"]})


def test_triplets_on_real_snli(snli):
    triplets = build_triplets(snli)
    premises = snli.groupby(["group", "sentence1"]).ngroups
    assert 0.8 * premises <= len(triplets) <= len(snli) / 2
    label_of = {(r.group, r.sentence1, r.sentence2): r.label for r in snli.itertuples()}
    for t in triplets.itertuples():
        assert label_of[(t.group, t.anchor, t.positive)] == "entailment"
        assert label_of[(t.group, t.anchor, t.negative)] == "contradiction"
    # no hypothesis serves in two triplets of the same premise
    assert not triplets.duplicated(["group", "anchor", "positive"]).any()
    assert not triplets.duplicated(["group", "anchor", "negative"]).any()


def test_triplets_pair_within_group_only():
    frame = pd.DataFrame({
        "group": ["g1", "g1", "g1", "g2", "g2", "g3"],
        "sentence1": ["P1", "P1", "P1", "P2", "P2", "P3"],
        "sentence2": ["e1", "n1", "c1", "e2", "n2", "c3"],
        "label": ["entailment", "neutral", "contradiction", "entailment", "neutral", "contradiction"]})
    t = build_triplets(frame)
    assert t[["anchor", "positive", "negative"]].values.tolist() == [["P1", "e1", "c1"]]
    with pytest.raises(MinBertError, match="'group'"):
        build_triplets(frame.drop(columns="group"), "results/data/nli-train.tsv")


# ---------------------------------------------------------------- the NLI data: one thing, not a task

def test_the_nli_data_is_one_source_beside_the_tasks_and_every_module_reads_it_from_one_place():
    """The NLI pretraining's data (its name, files, splits, columns, labels) is stated once, in
    minbert.core.nli_data; the reader, the prepared files, the checks and the reserved names follow it,
    and no other module spells its name or its files (a pretraining *kind* named `nli` is another
    thing: the params' `kind: nli`)."""
    import ast
    from pathlib import Path

    from minbert.core.nli_data import NLI_DATA
    from minbert.core.tasks import BUILTIN_TASKS
    from minbert.data.read import prepared, prepared_sources
    from minbert.params.tasks import reserved_task_names

    assert NLI_DATA.name not in BUILTIN_TASKS and NLI_DATA.name in prepared_sources()
    assert prepared(NLI_DATA.name).columns == NLI_DATA.columns and prepared(NLI_DATA.name).splits == NLI_DATA.splits
    assert [prepared(NLI_DATA.name).parse(x) for x in (*NLI_DATA.labels, "-")] == [*NLI_DATA.labels, None]
    assert NLI_DATA.name in reserved_task_names() and NLI_DATA.files == ("nli-train.tsv", "nli-dev.tsv")
    spelled = []
    root = Path(__file__).resolve().parents[1] / "minbert"
    for path in sorted(root.rglob("*.py")):
        if path.name == "nli_data.py" and path.parent.name == "core":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Constant) and s.value == NLI_DATA.name for s in sides) and not any(
                        isinstance(s, ast.Attribute) and s.attr == "kind" or isinstance(s, ast.Name) and s.id == "kind"
                        for s in sides):
                    spelled.append(f"{path.relative_to(root)}:{node.lineno}: compares with '{NLI_DATA.name}'")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NLI_DATA.files:
                spelled.append(f"{path.relative_to(root)}:{node.lineno}: names {node.value}")
    assert not spelled, "\n".join(spelled)
