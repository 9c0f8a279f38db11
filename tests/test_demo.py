"""The committed demo data: reproducible, well formed, balanced, not trivially separable."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from minbert.data.demo import SIZES, generate
from minbert.data.raw import raw_path, read_cs224n, read_nli


def test_committed_demo_files_equal_a_fresh_generation(tmp_path, repo_root):
    written = generate(tmp_path)
    committed = repo_root / "data" / "demo"
    assert sorted(p.name for p in written) == sorted(p.name for p in committed.iterdir())
    for p in written:
        assert p.read_bytes() == (committed / p.name).read_bytes(), f"{p.name} differs; run python -m minbert.data.demo"


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_demo_files_read_cleanly_and_balanced(repo_root, task):
    demo = repo_root / "data" / "demo"
    texts = set()
    for split, n in SIZES.items():
        frame, report = read_cs224n(raw_path(demo, task, split), task, labelled=split != "test")
        assert report.kept == report.read == n
        cols = [c for c in frame.columns if c.startswith("sentence")]
        rows = set(map(tuple, frame[cols].values.tolist()))
        assert not rows & texts                      # no example repeated across splits
        texts |= rows
        if split == "train":
            labels = frame["label"]
            if task == "sts":
                hist = np.histogram(labels, bins=[0, 1, 2, 3, 4, 5.01])[0]
                assert hist.min() >= 0.1 * n          # every score band is well populated
            else:
                counts = Counter(labels)
                assert max(counts.values()) <= 1.3 * min(counts.values())


def _best_single_token_accuracy(texts, labels):
    """Accuracy of the best rule 'label = majority label of sentences with / without token t'."""
    labels = np.asarray(labels)
    vocab = sorted({w for t in texts for w in t.lower().split()})
    best = 0.0
    for w in vocab:
        has = np.array([w in t.lower().split() for t in texts])
        acc = sum(Counter(labels[m]).most_common(1)[0][1] for m in (has, ~has) if m.any()) / len(labels)
        best = max(best, acc)
    return best


def test_no_single_token_gives_the_label_away(repo_root):
    demo = repo_root / "data" / "demo"
    sst, _ = read_cs224n(raw_path(demo, "sst", "train"), "sst")
    assert _best_single_token_accuracy(sst["sentence"].tolist(), sst["label"]) < 0.35    # chance 0.2
    para, _ = read_cs224n(raw_path(demo, "para", "train"), "para")
    pairs = (para["sentence1"] + " " + para["sentence2"]).tolist()
    assert _best_single_token_accuracy(pairs, para["label"]) < 0.65                      # chance 0.5


def test_demo_nli(repo_root):
    frame, report = read_nli(repo_root / "data" / "demo" / "nli-sample.jsonl")
    assert report.kept == 600 and not report.dropped
    per_premise = frame.groupby("group")["label"].apply(sorted)
    assert (per_premise.map(tuple) == ("contradiction", "entailment", "neutral")).all()
