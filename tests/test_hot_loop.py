"""The training step reads nothing back from the device: no host sync per batch. On CPU, where
there is no device to wait for, the equivalent is counted: every operation that would make the host
wait for a GPU (a tensor's value read as a Python number or bool, a data-dependent shape such as
nonzero's, a copy to the host) during `minbert.train.loop.train_step`."""
from __future__ import annotations

import collections

import pytest
import torch
from test_train import finetune_experiment, make_exp, write_prepared
from torch.utils._python_dispatch import TorchDispatchMode

import minbert.train.loop as train

# aten operations whose result the host needs before it can go on (on CUDA: a device sync)
SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "is_nonzero", "equal"}


class SyncCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in SYNC_OPS:
            self.seen[name] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return write_prepared(tmp_path_factory.mktemp("data"), n_train=24, n_dev=16)


@pytest.mark.parametrize("finetune", [
    {},                                                                    # round robin, one task per update
    {"schedule": "simultaneous", "pcgrad": True, "smart": {"enabled": True},
     "heads": {"losses": {"sts": "mse+pearson"}, "para": "concat", "sts": "cosine", "symmetric_pairs": True}},
], ids=["round_robin", "simultaneous_pcgrad_smart"])
def test_no_host_sync_in_the_training_step(tiny_model_dir, prepared, tmp_path, monkeypatch, finetune):
    counts, copies, steps = collections.Counter(), collections.Counter(), []
    real_step = train.train_step

    def counted(*args, **kwargs):
        counter = SyncCounter()
        with counter:
            out = real_step(*args, **kwargs)
        counts.update(counter.seen)
        steps.append(1)
        return out

    for name in ("cpu", "numpy", "tolist", "item"):   # host copies and reads at the Python level
        real = getattr(torch.Tensor, name)

        def wrapper(self, *a, _real=real, _name=name, **kw):
            if steps_running:
                copies[_name] += 1
            return _real(self, *a, **kw)
        monkeypatch.setattr(torch.Tensor, name, wrapper)
    steps_running = []

    def flagged(*args, **kwargs):
        steps_running.append(1)
        try:
            return counted(*args, **kwargs)
        finally:
            steps_running.pop()

    monkeypatch.setattr(train, "train_step", flagged)
    exp = make_exp(tiny_model_dir, epochs=1, max_steps_per_epoch=3, **finetune)
    finetune_experiment(exp, prepared, tmp_path / "run")
    assert len(steps) == 3
    assert not counts and not copies, (dict(counts), dict(copies))


def test_the_counter_sees_what_the_old_loop_did():
    """The counter is not blind: a scalar read, a data-dependent shape and a host copy are counted."""
    x = torch.ones(4)
    counter = SyncCounter()
    with counter:
        bool(torch.isfinite(x).all())
        float(x.sum())
        x.nonzero()
    assert counter.seen["_local_scalar_dense"] == 2 and counter.seen["nonzero"] == 1
