"""Every benchmark under bench/ runs on a CPU in seconds at a tiny size and prints what it promises,
so that a change to the library breaks a test here, not a user: bench/gpu_train.py our step and
transformers' beside it with the ratio and its range (no host sync in ours); bench/op_count.py the
operations a step dispatches on each path; bench/startup.py start-up and import cost against an
older tree with ratios; bench/encoder_throughput.py, train_throughput.py and frozen_features.py
their tables of speeds and ratios (on the tests' tiny BERT); bench/gpu_pipeline.py the paper scale's
real jobs beside their isolated steps; the GPU benchmark's catalogue projection adds up
params/papers.yaml's real update counts at the paper scale. Nothing here checks a timing."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO, child_env, shared_data_dir

RANGE = re.compile(r"^(\d+\.\d+) \((\d+\.\d+)-(\d+\.\d+)\)$")      # "median (low-high)"


def run_bench(*argv: str, timeout: int = 300) -> list[str]:
    out = subprocess.run([sys.executable, *argv], cwd=REPO, env=child_env(OMP_NUM_THREADS="1"), capture_output=True,
                         text=True, timeout=timeout, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def a_range(cell: str) -> tuple[float, float, float]:
    m = RANGE.match(cell)
    assert m, cell
    median, low, high = map(float, m.groups())
    assert low <= median <= high, cell
    return median, low, high


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_train_smoke_run_on_cpu_times_ours_and_the_reference():
    lines = run_bench("bench/gpu_train.py", "--quick")
    assert lines[0].startswith("CPU,") and "torch" in lines[0] and "transformers" in lines[0]
    assert any(line.startswith("ref graph: skipped (CUDA graphs need a CUDA device") for line in lines)
    header = cells(next(line for line in lines if line.startswith("| model |")))
    row = dict(zip(header, cells(next(line for line in lines if line.startswith("| tiny | 8 |")))))
    ours, _, _ = a_range(row["ours ms median (p10-p90)"])
    ref, _, _ = a_range(row["ref eager ms median (p10-p90)"])
    ratio, low, high = a_range(row["ours/ref eager (min-max)"])
    assert ours > 0 and ref > 0 and 0 < low <= ratio <= high
    assert "ref graph ms median (p10-p90)" not in row                  # no CUDA: no graph column
    assert float(row["real tok/s (ours)"].replace(",", "")) > 0 and row["host syncs/step"] == "0"
    paths = next(line for line in lines if line.startswith("paths: "))
    assert "ours: eager, padding removed" in paths and "ref eager: eager" in paths


def test_op_count_counts_each_path_and_the_reference():
    lines = run_bench("bench/op_count.py", "--shape", "tiny", "--batch", "8", "--rows", "64", "--top", "3")
    rows = [cells(line) for line in lines if line.startswith(("| ours |", "| transformers |"))]
    assert [(r[0], r[1]) for r in rows] == [("ours", "eager, padding removed"),
                                            ("ours", "padded buckets, parts run eagerly"), ("transformers", "eager")]
    for name, _, length, total, not_views, ratio_total, ratio_not_views in rows:
        assert 0 < int(not_views) < int(total) and int(length) % 8 == 0
        assert float(ratio_total) > 0 and float(ratio_not_views) > 0
    ref_total = int(rows[-1][3])
    assert rows[-1][5] == "1.00" and float(rows[0][5]) == pytest.approx(int(rows[0][3]) / ref_total, abs=0.006)
    assert sum(line.startswith(("ours (", "transformers (")) and "mm" in line for line in lines) == 3


def test_op_counter_counts_views_apart():
    import torch

    counter = load("op_count").OpCounter()
    x = torch.ones(4, 4)
    with counter:
        (x.t() @ x).view(16).sum()
    assert (counter.total, counter.not_views) == (4, 2)       # t, mm, view, sum: two of them views


def have_revision(rev: str) -> bool:
    return subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{rev}^{{commit}}"], capture_output=True,
                          check=False).returncode == 0


@pytest.mark.skipif(not have_revision("28500f9"), reason="the old revision is not in this clone")
def test_startup_compares_this_tree_with_the_old_one():
    lines = run_bench("bench/startup.py", "--quick", timeout=600)
    assert lines[0].startswith("start-up: this tree") and "against 28500f9" in lines[0]
    rows = {cells(line)[0]: cells(line)[1:] for line in lines if line.startswith("| ") and not line.startswith("| m")}
    assert len(rows) == 3, rows
    for new, old, ratio in rows.values():
        (n, n_lo, n_hi), (o, o_lo, o_hi), (r, _, _) = a_range(new), a_range(old), a_range(ratio)
        # the ratio is the median of the rounds' ratios (the two trees alternate round by round), so
        # it lies within what the two ranges allow, not exactly at the ratio of the medians
        assert n > 0 and o > 0 and n_lo / o_hi - 0.02 <= r <= n_hi / o_lo + 0.02, (new, old, ratio)   # 2 decimals printed
    assert "stages.evaluate imports torch: new no" in lines[-1]      # a stage reading predictions needs no torch


@pytest.mark.skipif(shared_data_dir() is None, reason="the real data is not here")
def test_catalogue_projection_adds_up_the_real_update_counts():
    bench = load("gpu_train")
    one = {("bert-base", b): 1.0 for b in (8, 16, 32)}
    hours = float(bench.projection(one)[0].split("about ")[1].split(" h")[0])
    double = float(bench.projection({k: 2.0 for k in one})[0].split("about ")[1].split(" h")[0])
    assert hours > 0 and double == pytest.approx(2 * hours, rel=1e-3)


def test_gpu_sharing_smoke_run_prints_each_mode_against_one_job_at_a_time():
    lines = run_bench("bench/gpu_sharing.py", "--quick")
    assert "2 jobs x 3 updates, tiny, batch 4, cpu" in lines
    rows = {line[:28].strip(): line[28:].split() for line in lines if "updates/s" in line}
    assert list(rows) == ["one at a time", "side by side, time slices"]          # no MPS without a GPU
    assert rows["one at a time"][2] == "x" and rows["one at a time"][3] == "1.00"
    for cells_ in rows.values():
        assert float(cells_[0]) > 0 and cells_[5:7] and all(float(r) > 0 for r in cells_[5:])


def median_min_max(cell: str) -> tuple[float, float, float]:
    m = re.match(r"^([\d,]+\.\d+) \(([\d,]+\.\d+)-([\d,]+\.\d+)\)$", cell)
    assert m, cell
    median, low, high = (float(x.replace(",", "")) for x in m.groups())
    assert low <= median <= high, cell
    return median, low, high


def test_gpu_pipeline_smoke_run_times_the_real_jobs_beside_their_isolated_steps():
    """The paper scale's real fine-tune and MLM pretraining jobs (the stages on their job files, a tiny
    model, the demo data) against their isolated steps in the same run, and a real prediction job
    against the training loop's evaluation pass."""
    lines = run_bench("bench/gpu_pipeline.py", "--quick", timeout=600)
    assert lines[0].startswith("papers catalogue, scale paper; model tiny;") and "torch" in lines[0]
    header = cells(next(line for line in lines if line.startswith("| job |")))
    rows = {r[0]: dict(zip(header[1:], r[1:])) for r in
            (cells(line) for line in lines if line.startswith(("| finetune ", "| pretrain ")))}
    pretrain = [r for r in rows if r.startswith("pretrain ")]
    assert set(rows) - set(pretrain) == {"finetune p000_mt_sequential_rr.seed11711 (batch 8)"}
    # one of 000's MLM pretrainings
    assert len(pretrain) == 1 and re.fullmatch(r"pretrain mlm_\w+ \(batch 8\)", pretrain[0]), pretrain
    for row in rows.values():
        iso, real = median_min_max(row["isolated step updates/s"])[0], median_min_max(row["real job updates/s"])[0]
        ratio = median_min_max(row["real/isolated"])[0]
        assert iso > 0 and real > 0 and ratio == pytest.approx(real / iso, abs=0.01)      # one round
        rounding = 1000 * 0.05 / real ** 2 + 1000 * 0.05 / iso ** 2 + 0.005      # the rates printed to 0.1
        assert float(row["host ms/update"]) == pytest.approx(1000 / real - 1000 / iso, abs=rounding)
        assert float(row["first update s"]) > 0
    ratios = next(line for line in lines if line.startswith("prediction / evaluation pass, per row: "))
    forward_first, forward_again, whole = (float(x) for x in re.findall(r"(\d+\.\d+)", ratios))
    assert 0 < whole <= forward_first and forward_again > 0   # the whole job pays its start-up besides its passes


# ---------------------------------------------------------------- the throughput benchmarks, in process

@pytest.fixture()
def one_thread():
    n = torch.get_num_threads()
    yield "1"
    torch.set_num_threads(n)


def test_encoder_throughput_prints_each_row_with_its_ratio(tiny_model_dir, one_thread, capsys):
    load("encoder_throughput").main(["--model", str(tiny_model_dir), "--batch-size", "4", "--batches", "1",
                                     "--rounds", "1", "--rows", "train-fp32,infer-fp32", "--threads", one_thread])
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()
            if line.startswith(("train-fp32", "infer-fp32"))}
    assert set(rows) == {"train-fp32", "infer-fp32"}
    for ours, ref, ratio, span, _ in rows.values():
        assert float(ours) > 0 and float(ref) > 0 and span == f"{ratio}-{ratio}"     # one round: min = max


def test_train_throughput_prints_both_loops_and_their_ratio(tiny_model_dir, one_thread, capsys):
    ratio = load("train_throughput").main(["--model", str(tiny_model_dir), "--rows", "16", "--batch-size", "4",
                                           "--steps", "1", "--rounds", "1", "--threads", one_thread])
    out = capsys.readouterr().out
    speeds = {line.split()[0]: float(line.split()[1]) for line in out.splitlines()
              if line.startswith(("ours ", "reference "))}
    assert speeds["ours"] > 0 and speeds["reference"] > 0
    assert f"ratio ours / reference: {ratio:.2f}" in out
    assert ratio == pytest.approx(speeds["ours"] / speeds["reference"], rel=0.01)


def test_frozen_features_times_both_jobs_both_ways(tiny_model_dir, one_thread, capsys):
    load("frozen_features").main(["--model", str(tiny_model_dir), "--train", "16", "--dev", "8", "--epochs", "1",
                                  "--rounds", "1", "--threads", one_thread])
    rows = [cells(line) for line in capsys.readouterr().out.splitlines() if line.startswith(("| frozen", "| retrain"))]
    assert [r[0] for r in rows] == ["frozen baseline", "retrain heads"]
    for _, cached, uncached, ratio in rows:
        assert float(cached) > 0 and float(uncached) > 0 and a_range(ratio)[0] > 0


# each benchmark and the test that runs it (steps.py is the steps gpu_train.py and op_count.py time)
RUN_BY = {"gpu_train": test_gpu_train_smoke_run_on_cpu_times_ours_and_the_reference,
          "op_count": test_op_count_counts_each_path_and_the_reference,
          "steps": test_op_count_counts_each_path_and_the_reference,
          "startup": test_startup_compares_this_tree_with_the_old_one,
          "encoder_throughput": test_encoder_throughput_prints_each_row_with_its_ratio,
          "train_throughput": test_train_throughput_prints_both_loops_and_their_ratio,
          "frozen_features": test_frozen_features_times_both_jobs_both_ways,
          "gpu_sharing": test_gpu_sharing_smoke_run_prints_each_mode_against_one_job_at_a_time,
          "gpu_pipeline": test_gpu_pipeline_smoke_run_times_the_real_jobs_beside_their_isolated_steps}


def test_every_benchmark_is_run_by_a_test():
    assert {p.stem for p in (REPO / "bench").glob("*.py")} == set(RUN_BY)
