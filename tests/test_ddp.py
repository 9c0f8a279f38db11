"""Data parallelism on CPU with gloo (two processes): PCGrad projects the global task gradients
(equal to one process), a non-finite loss on one rank is seen by every rank (none hangs), the
configurations DDP cannot run as one process would are refused in one line."""
from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minbert.core.errors import MinBertError
from minbert.params import FinetuneParams
from minbert.train.distributed import average_gradients, refuse_batch_statistics
from minbert.train.regularisers import pcgrad_backward


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 4, generator=g), torch.randn(8, 3, generator=g)


def _task_losses(model, x, y):
    """Three tasks on the same inputs, made to conflict (opposite targets on output 0)."""
    out = model(x)
    return [(out[:, 0] - y[:, 0]).pow(2).mean(), (out[:, 0] + y[:, 0]).pow(2).mean() + (out[:, 1] - y[:, 1]).pow(2).mean(),
            (out[:, 2] - y[:, 2]).pow(2).mean()]


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        # PCGrad on each rank's half of the batch
        model = _model()
        x, y = _data()
        half = slice(rank * 4, rank * 4 + 4)
        pcgrad_backward(_task_losses(model, x[half], y[half]), list(model.parameters()),
                        orders=[[1, 2], [2, 0], [0, 1]], world=world, with_stats=False, retain_graph=True)
        average_gradients(list(model.parameters()), world)   # what the loop does next: leaves them as they are
        torch.save([p.grad for p in model.parameters()], os.path.join(out_dir, f"grads{rank}.pt"))
        # a non-finite loss on rank 1 only
        p = torch.nn.Parameter(torch.ones(3))
        p.grad = torch.full((3,), float(rank))
        flag = torch.tensor([1.0 if rank == 1 else 0.0])
        average_gradients([p], world, flag)
        torch.save(flag, os.path.join(out_dir, f"flag{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """What two gloo processes computed (one launch for the tests below)."""
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    return out


def test_pcgrad_under_ddp_equals_one_process(ranks):
    tmp_path = ranks
    model = _model()
    x, y = _data()
    pcgrad_backward(_task_losses(model, x, y), list(model.parameters()), orders=[[1, 2], [2, 0], [0, 1]], retain_graph=True)
    one = [p.grad for p in model.parameters()]
    for rank in (0, 1):
        got = torch.load(tmp_path / f"grads{rank}.pt", weights_only=True)
        for a, b in zip(got, one):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    # and it differs from projecting each rank's own gradients (the old behaviour)
    local = _model()
    pcgrad_backward(_task_losses(local, x[:4], y[:4]), list(local.parameters()), orders=[[1, 2], [2, 0], [0, 1]], retain_graph=True)
    assert not all(torch.allclose(p.grad, b, atol=1e-6) for p, b in zip(local.parameters(), one))


def test_a_non_finite_loss_on_one_rank_is_seen_by_all(ranks):
    tmp_path = ranks
    assert [float(torch.load(tmp_path / f"flag{r}.pt", weights_only=True)) for r in (0, 1)] == [1.0, 1.0]


@pytest.mark.parametrize("loss,refused", [("mse", False), ("pearson", True), ("mse+pearson", True)])
def test_the_correlation_loss_is_refused_under_ddp(loss, refused):
    heads = FinetuneParams(heads={"losses": {"sts": loss}}).heads
    refuse_batch_statistics(heads, ["sst", "sts"], 1)            # one process: always fine
    refuse_batch_statistics(heads, ["sst", "para"], 2)           # no batch-statistic loss: fine
    if refused:
        with pytest.raises(MinBertError, match="statistic of the whole batch.*one process") as err:
            refuse_batch_statistics(heads, ["sst", "sts"], 2)
        assert "\n" not in str(err.value)
    else:
        refuse_batch_statistics(heads, ["sst", "sts"], 2)


def test_pretraining_under_torchrun_is_refused_in_one_line(monkeypatch, tmp_path):
    from stages import pretrain as stage

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(MinBertError, match="pretraining runs in one process.*python -m stages.pretrain") as err:
        stage.main(["--params", str(tmp_path / "params.yaml"), "--name", "p"])
    assert "\n" not in str(err.value)
