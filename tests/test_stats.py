"""minbert.scoring.stats against independent references: scipy.stats.bootstrap on the same statistic and
the same resamples, the normal approximation of a proportion's interval, paired differences with
known answers, the seed statistics and determinism."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.stats as ss

from minbert.core.errors import MinBertError
from minbert.core.metrics import overall_score, pearson
from minbert.scoring import stats


def _ids(n, prefix="x"):
    return [f"{prefix}{i:05d}" for i in range(n)]          # already in sorted order


def _classification(rng, n, skill, classes=5):
    true = rng.integers(0, classes, n)
    pred = np.where(rng.random(n) < skill, true, rng.integers(0, classes, n))
    return pred.astype(float), true.astype(float)


def _regression(rng, n, noise):
    true = rng.uniform(0, 5, n)
    return true + rng.normal(0, noise, n), true


def test_accuracy_interval_matches_scipy_bootstrap_on_the_same_resamples():
    rng = np.random.default_rng(1)
    pred, true = _classification(rng, 733, 0.5)
    est = stats.task_estimate("sst", stats.Sample(_ids(733), pred, true))
    correct = (pred == true).astype(float)
    ref = ss.bootstrap((correct,), np.mean, n_resamples=stats.RESAMPLES, batch=stats.chunk_size(733),
                       method="percentile", confidence_level=0.95, rng=stats.stream("sst"))
    assert est.value == pytest.approx(correct.mean(), abs=1e-15)
    np.testing.assert_allclose(np.sort(est.replicates), np.sort(ref.bootstrap_distribution), atol=1e-12)
    iv = est.interval()
    assert iv.low == pytest.approx(ref.confidence_interval.low, abs=1e-12)
    assert iv.high == pytest.approx(ref.confidence_interval.high, abs=1e-12)


def test_pearson_interval_matches_scipy_bootstrap_on_the_same_resamples():
    rng = np.random.default_rng(2)
    pred, true = _regression(rng, 411, 1.4)
    est = stats.task_estimate("sts", stats.Sample(_ids(411), pred, true), resamples=1500)

    def r(x, y, axis=-1):
        return ss.pearsonr(x, y, axis=axis)[0]

    ref = ss.bootstrap((pred, true), r, paired=True, vectorized=True, n_resamples=1500,
                       batch=stats.chunk_size(411), method="percentile", rng=stats.stream("sts"))
    assert est.value == pytest.approx(pearson(pred, true), abs=1e-12)
    np.testing.assert_allclose(est.replicates, ref.bootstrap_distribution, atol=1e-10)
    assert est.interval().low == pytest.approx(ref.confidence_interval.low, abs=1e-10)
    assert est.interval().high == pytest.approx(ref.confidence_interval.high, abs=1e-10)


def test_rows_are_aligned_by_id_whatever_their_order():
    rng = np.random.default_rng(3)
    pred, true = _classification(rng, 300, 0.6, classes=2)
    ids = _ids(300)
    perm = rng.permutation(300)
    a = stats.task_estimate("para", stats.Sample(ids, pred, true))
    b = stats.task_estimate("para", stats.Sample([ids[i] for i in perm], pred[perm], true[perm]))
    np.testing.assert_array_equal(a.replicates, b.replicates)


def test_large_n_accuracy_interval_is_the_normal_approximation():
    """For n = 20,000 and p = 0.7 the bootstrap interval is p ± 1.96 sqrt(p (1 - p) / n)."""
    n, k = 20_000, 14_000
    true = np.zeros(n)
    pred = np.where(np.arange(n) < k, 0.0, 1.0)
    iv = stats.task_estimate("para", stats.Sample(_ids(n), pred, true)).interval()
    half = 1.959964 * np.sqrt(0.7 * 0.3 / n)                 # 0.00635
    assert iv.low == pytest.approx(0.7 - half, abs=6e-4)
    assert iv.high == pytest.approx(0.7 + half, abs=6e-4)


def test_overall_combines_independent_task_resamples_with_the_leaderboard_formula():
    rng = np.random.default_rng(4)
    by_task = {"sst": stats.task_estimate("sst", stats.Sample(_ids(200, "s"), *_classification(rng, 200, 0.5))),
               "para": stats.task_estimate("para", stats.Sample(_ids(300, "p"), *_classification(rng, 300, 0.8, 2))),
               "sts": stats.task_estimate("sts", stats.Sample(_ids(150, "t"), *_regression(rng, 150, 1.0)))}
    out = stats.overall_estimates(by_task)
    s, p, t = (by_task[k] for k in ("sst", "para", "sts"))
    assert out["overall"].value == pytest.approx(overall_score(s.value, p.value, t.value))
    np.testing.assert_allclose(out["overall"].replicates,
                               (s.replicates + p.replicates + (t.replicates + 1) / 2) / 3)
    np.testing.assert_allclose(out["mean"].replicates, (s.replicates + p.replicates + t.replicates) / 3)
    # the tasks' streams are independent: their replicates are (nearly) uncorrelated
    assert abs(np.corrcoef(s.replicates, p.replicates)[0, 1]) < 0.1
    assert stats.overall_estimates({"sst": s, "para": p}) == {}


def test_identical_predictions_give_a_zero_width_difference():
    rng = np.random.default_rng(5)
    pred, true = _classification(rng, 500, 0.5)
    frame = pd.DataFrame({"id": _ids(500), "label": true, "prediction": pred})
    diff = stats.paired_difference("sst", frame, frame.sample(frac=1.0, random_state=0))
    assert diff.value == 0 and diff.interval() == stats.Interval(0.0, 0.0)
    assert not diff.significant()


def test_a_clearly_better_model_is_significant_and_a_tie_is_not():
    rng = np.random.default_rng(6)
    true = rng.integers(0, 5, 1101).astype(float)
    weak = np.where(rng.random(1101) < 0.40, true, (true + 1) % 5)
    strong = np.where(rng.random(1101) < 0.55, true, weak)          # right wherever weak is, and more
    frame = lambda pred: pd.DataFrame({"id": _ids(1101), "label": true, "prediction": pred})
    better = stats.paired_difference("sst", frame(strong), frame(weak))
    assert better.value > 0.1 and better.significant() and better.interval().low > 0
    # a tie: the same accuracy with different mistakes
    other = weak.copy()
    wrong, right = np.flatnonzero(weak != true)[:60], np.flatnonzero(weak == true)[:60]
    other[wrong], other[right] = true[wrong], (true[right] + 2) % 5
    tie = stats.paired_difference("sst", frame(other), frame(weak))
    assert tie.value == 0 and not tie.significant()
    assert tie.interval().low < 0 < tie.interval().high


def test_paired_is_narrower_than_unpaired_for_correlated_models():
    rng = np.random.default_rng(7)
    pred, true = _regression(rng, 600, 1.0)
    close = pred + rng.normal(0, 0.2, 600)
    fa = pd.DataFrame({"id": _ids(600), "label": true, "prediction": pred})
    fb = fa.assign(prediction=close)
    paired = stats.paired_difference("sts", fa, fb).interval()
    a = stats.task_estimate("sts", stats.Sample.of(fa)).interval()
    assert paired.width < 0.5 * a.width


def test_different_ids_are_refused():
    rng = np.random.default_rng(8)
    pred, true = _classification(rng, 100, 0.5)
    fa = pd.DataFrame({"id": _ids(100), "label": true, "prediction": pred})
    fb = fa.assign(id=_ids(99) + ["other"])
    with pytest.raises(MinBertError, match=r"different examples .*1 id\(s\) only in the first.*'x00099'"):
        stats.paired_difference("sst", fa, fb)
    est = stats.task_estimates("sst", {"a": stats.Sample.of(fa), "b": stats.Sample.of(fb)})
    with pytest.raises(MinBertError, match="cannot pair"):
        est["a"].minus(est["b"])
    with pytest.raises(MinBertError, match="appears twice"):
        stats.task_estimate("sst", stats.Sample(["a", "a"], [1.0, 1.0], [1.0, 0.0]))


def test_unlabelled_rows_are_left_out():
    frame = pd.DataFrame({"id": ["a", "b", "c", "d"], "label": [1, 0, None, 1], "prediction": [1, 1, 0, 1]})
    est = stats.task_estimate("para", stats.Sample.of(frame))
    value, iv = est.value, est.interval()
    assert value == pytest.approx(2 / 3) and 0 <= iv.low <= value <= iv.high <= 1


def test_constant_resamples_score_zero_correlation_like_the_metric():
    est = stats.task_estimate("sts", stats.Sample(_ids(3), [1.0, 1.0, 2.0], [0.0, 1.0, 3.0]), resamples=500)
    assert est.value == pytest.approx(pearson([1.0, 1.0, 2.0], [0.0, 1.0, 3.0]))
    assert np.isfinite(est.replicates).all() and (est.replicates == 0).any()     # e.g. all three draws the same row


def test_seed_mean_and_mean_std():
    rng = np.random.default_rng(9)
    true = rng.integers(0, 2, 400).astype(float)
    samples = {s: stats.Sample(_ids(400), np.where(rng.random(400) < 0.7, true, 1 - true), true) for s in range(3)}
    ests = stats.task_estimates("para", samples)
    group = stats.seed_mean(list(ests.values()), "rr")
    values = [e.value for e in ests.values()]
    assert group.value == pytest.approx(np.mean(values)) and group.seeds == 3
    assert group.basis == ests[0].basis                         # still paired with the same examples
    # the two-level interval is at least as wide as the example-only interval of the seed mean
    example_only = stats.percentile_interval(np.mean([e.replicates for e in ests.values()], axis=0))
    assert group.interval().width >= example_only.width
    again = stats.seed_mean(list(ests.values()), "rr")
    np.testing.assert_array_equal(group.replicates, again.replicates)
    mean, std, n = stats.mean_std(values + [None])
    assert (mean, n) == (pytest.approx(np.mean(values)), 3) and std == pytest.approx(np.std(values, ddof=1))
    assert stats.mean_std([0.5]) == (0.5, None, 1) and stats.mean_std([]) == (None, None, 0)


def test_deterministic_with_the_seed_and_different_without():
    rng = np.random.default_rng(10)
    sample = stats.Sample(_ids(250), *_classification(rng, 250, 0.5))
    a = stats.task_estimate("sst", sample)
    b = stats.task_estimate("sst", sample)
    c = stats.task_estimate("sst", sample, seed=stats.SEED + 1)
    np.testing.assert_array_equal(a.replicates, b.replicates)
    assert not np.array_equal(a.replicates, c.replicates)
    with pytest.raises(MinBertError, match="cannot pair"):
        a.minus(c)                                          # other resamples: no pairing


def test_batched_estimates_equal_one_at_a_time():
    rng = np.random.default_rng(11)
    true = rng.uniform(0, 5, 300)
    samples = {k: stats.Sample(_ids(300), true + rng.normal(0, k + 0.5, 300), true) for k in range(4)}
    together = stats.task_estimates("sts", samples)
    for k, s in samples.items():
        np.testing.assert_allclose(together[k].replicates, stats.task_estimate("sts", s).replicates, atol=1e-12)


def test_fast_enough_for_a_report():
    """A Quora-sized dev set (40,429 pairs) for ten runs in one pass: well under a few seconds."""
    import time

    rng = np.random.default_rng(12)
    n = 40_429
    true = rng.integers(0, 2, n).astype(float)
    samples = {k: stats.Sample(_ids(n), np.where(rng.random(n) < 0.8, true, 1 - true), true) for k in range(10)}
    start = time.perf_counter()
    stats.task_estimates("para", samples)
    assert time.perf_counter() - start < 20            # ~2 s on 2 idle cores; generous for loaded CI machines


def test_same_ids_with_other_labels_are_not_paired():
    ids = _ids(50)
    a = stats.Sample(ids, np.ones(50), np.ones(50))
    b = stats.Sample(ids, np.ones(50), np.r_[np.zeros(1), np.ones(49)])
    est = stats.task_estimates("para", {"a": a, "b": b})
    with pytest.raises(MinBertError, match="same ids and labels"):
        est["a"].minus(est["b"])


def test_an_undefined_metric_has_no_estimate_and_the_export_card_leaves_it_out(tmp_path):
    """Similarity scores all clipped to 0 (a tiny model): Pearson r is undefined, so no estimate,
    and the export's scores leave the task (and the overall) out instead of failing."""
    import pandas as pd

    from minbert.core.tasks import BUILTIN_TASKS
    from minbert.scoring.stats import Sample, task_estimate
    from minbert.share.export import scores

    frame = pd.DataFrame({"id": [f"t{i}" for i in range(20)], "label": [i / 4 for i in range(20)],
                          "prediction": [0.0] * 20})
    assert task_estimate("sts", Sample.of(frame)) is None
    folder = tmp_path / "predictions"
    folder.mkdir()
    frame.assign(sentence1="a", sentence2="b").to_csv(folder / "sts-dev.csv", index=False)
    pd.DataFrame({"id": [f"s{i}" for i in range(20)], "sentence": "x", "label": [i % 5 for i in range(20)],
                  "prediction": [(i + 1) % 5 for i in range(20)], **{f"prob_{k}": 0.2 for k in range(5)}}
                 ).to_csv(folder / "sst-dev.csv", index=False)
    got = scores(folder, BUILTIN_TASKS)
    assert set(got["dev"]) == {"sst"}
