"""The resumable state's cadence (`finetune.checkpoint_every`): written every N epochs and never
after the run's last epoch (it finishes right after), and a resume from it stays exact."""
from __future__ import annotations

import pandas as pd
import torch
from test_train import (
    assert_same_weights,
    finetune_experiment,
    history,
    last_state,
    make_exp,
    state_dict,
    write_prepared,
)


def test_a_state_every_second_epoch_resumes_exactly(tiny_model_dir, tmp_path):
    data = write_prepared(tmp_path / "data", n_train=24, n_dev=16)
    exp = make_exp(tiny_model_dir, epochs=3, max_steps_per_epoch=2, checkpoint_every=2)
    full = finetune_experiment(exp, data, tmp_path / "full")
    part = tmp_path / "part"
    finetune_experiment(exp, data, part, stop_after_epochs=1)
    assert not last_state(part).exists()                      # epoch 1: no state (every second epoch)
    finetune_experiment(exp, data, part, stop_after_epochs=2)  # starts afresh, stops after epoch 2
    saved = torch.load(last_state(part), map_location="cpu", weights_only=True)
    assert saved["state"]["epoch"] == 2
    resumed = finetune_experiment(exp, data, part)
    assert resumed.best_dev == full.best_dev and len(resumed.history) == 3
    pd.testing.assert_frame_equal(history(part), history(tmp_path / "full"))
    assert_same_weights(state_dict(part / "model.pt"), state_dict(tmp_path / "full" / "model.pt"))


def test_no_state_is_written_after_the_last_epoch(tiny_model_dir, tmp_path, monkeypatch):
    import minbert.train.loop as train

    data = write_prepared(tmp_path / "data", n_train=24, n_dev=16)
    saved = []
    real = train.save_state
    monkeypatch.setattr(train, "save_state", lambda run, state: saved.append(state.epoch) or real(run, state))
    finetune_experiment(make_exp(tiny_model_dir, epochs=3, max_steps_per_epoch=2), data, tmp_path / "run")
    assert saved == [1, 2]



def test_compile_compiles_the_encoder_in_place(tiny_model_dir, tmp_path, monkeypatch):
    """`finetune.compile` compiles the encoder in place (nn.Module.compile), so the checkpoint keeps
    the same parameter names; the compiled run itself is checked on a GPU (tests/test_cuda.py)."""
    from minbert.model.bert import BertModel

    compiled = []
    monkeypatch.setattr(BertModel, "compile", lambda self, **kw: compiled.append(kw))
    data = write_prepared(tmp_path / "data", n_train=16, n_dev=16)
    exp = make_exp(tiny_model_dir, epochs=1, max_steps_per_epoch=2, tasks=["sst"])
    finetune_experiment(exp, data, tmp_path / "plain")
    assert not compiled
    finetune_experiment(exp.model_copy(update={"finetune": exp.finetune.model_copy(update={"compile": True})}),
                        data, tmp_path / "compiled")
    assert compiled == [{"dynamic": True}]
    assert state_dict(tmp_path / "plain" / "model.pt").keys() == state_dict(tmp_path / "compiled" / "model.pt").keys()
