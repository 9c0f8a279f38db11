"""Loading Hugging Face BERT checkpoints: both file formats, old names, missing pooler, MLM head
tensors, and every bad input (shapes, unexpected/missing tensors, configs, pickles, offline Hub)."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import save_file

from minbert.core.errors import MinBertError
from minbert.model.weights import hf_to_minbert, load_encoder, minbert_to_hf, model_folder

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=40, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def hf_pretraining():
    """A tiny random transformers.BertForPreTraining: 'bert.'-prefixed names and cls.* heads."""
    torch.manual_seed(0)
    return transformers.BertForPreTraining(transformers.BertConfig(**TINY)).eval()


def _inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, TINY["vocab_size"], (3, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    tt = torch.zeros_like(ids)
    tt[1, 5:] = 1
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=tt)


def _assert_matches(ours, hf_bert, pooler=True):
    x = _inputs()
    m = x["attention_mask"].bool()
    with torch.no_grad():
        h, p = ours.eval()(**x)
        ref = hf_bert.eval()(**x)
    torch.testing.assert_close(h[m], ref.last_hidden_state[m], atol=1e-5, rtol=0)
    if pooler:
        torch.testing.assert_close(p, ref.pooler_output, atol=1e-5, rtol=0)


def _folder(tmp_path, sd, fmt="safetensors", config=None):
    """A model folder with config.json and `sd` stored as model.safetensors or pytorch_model.bin."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": "bert", **TINY} if config is None else config
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    sd = {k: v.detach().clone().contiguous() for k, v in sd.items()}
    if fmt == "safetensors":
        save_file(sd, str(tmp_path / "model.safetensors"))
    else:
        torch.save(sd, tmp_path / "pytorch_model.bin")
    return tmp_path


def _bert_sd(hf_pretraining):
    """BertModel names (no prefix), as a plain `BertModel.save_pretrained` writes them."""
    return dict(hf_pretraining.bert.state_dict())


def test_packaged_minilm_resolves_and_loads(minilm_dir):
    assert model_folder("all-MiniLM-L6-v2") == minilm_dir
    assert model_folder("sentence-transformers/all-MiniLM-L6-v2") == minilm_dir
    model, mlm, folder = load_encoder("all-MiniLM-L6-v2")
    assert folder == minilm_dir and mlm == {}
    assert model.config.hidden_size == 384 and model.config.num_hidden_layers == 6


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_both_formats_match_transformers(tmp_path, hf_pretraining, fmt):
    folder = _folder(tmp_path, _bert_sd(hf_pretraining), fmt)
    model, mlm, got = load_encoder(folder)
    assert got == folder and mlm == {}
    _assert_matches(model, hf_pretraining.bert)


def test_save_pretrained_folder_loads(tmp_path, hf_pretraining):
    hf_pretraining.bert.save_pretrained(tmp_path)
    model, _, _ = load_encoder(tmp_path)
    _assert_matches(model, hf_pretraining.bert)


def test_bert_prefix_and_mlm_head_tensors(tmp_path, hf_pretraining):
    sd = dict(hf_pretraining.state_dict())
    assert any(k.startswith("bert.") for k in sd) and "cls.predictions.bias" in sd
    model, mlm, _ = load_encoder(_folder(tmp_path, sd, "bin"))
    _assert_matches(model, hf_pretraining.bert)
    for key in ("bias", "transform.dense.weight", "transform.dense.bias",
                "transform.LayerNorm.weight", "transform.LayerNorm.bias"):
        torch.testing.assert_close(mlm[key], sd["cls.predictions." + key])
    assert not any(k.startswith("seq_relationship") for k in mlm)  # the NSP head is dropped


def test_gamma_beta_names(tmp_path, hf_pretraining):
    sd = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
          for k, v in _bert_sd(hf_pretraining).items()}
    assert any(k.endswith(".gamma") for k in sd)
    model, _, _ = load_encoder(_folder(tmp_path, sd, "bin"))
    _assert_matches(model, hf_pretraining.bert)


def test_missing_pooler_loads_with_fresh_pooler(tmp_path, hf_pretraining):
    sd = {k: v for k, v in _bert_sd(hf_pretraining).items() if not k.startswith("pooler.")}
    model, _, _ = load_encoder(_folder(tmp_path, sd))
    _assert_matches(model, hf_pretraining.bert, pooler=False)
    assert not torch.equal(model.pooler.dense.weight, hf_pretraining.bert.pooler.dense.weight)
    assert model.pooler.dense.weight.std() > 0  # initialised, not left empty


def test_hf_name_mapping_round_trip(hf_pretraining):
    sd = _bert_sd(hf_pretraining)
    encoder, mlm, unexpected = hf_to_minbert(sd)
    assert unexpected == [] and mlm == {}
    back = minbert_to_hf(encoder)
    assert set(back) == {k for k in sd if k != "embeddings.position_ids"}
    for k, v in back.items():
        torch.testing.assert_close(v, sd[k])


def _error(folder) -> str:
    with pytest.raises(MinBertError) as e:
        load_encoder(folder)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_wrong_shape_is_an_error(tmp_path, hf_pretraining):
    sd = _bert_sd(hf_pretraining)
    sd["encoder.layer.1.intermediate.dense.weight"] = torch.zeros(50, 32)
    msg = _error(_folder(tmp_path, sd))
    assert "model.safetensors" in msg and "layers.1.ff_in.weight" in msg and "(50, 32)" in msg


def test_config_disagreeing_with_weights_is_an_error(tmp_path, hf_pretraining):
    folder = _folder(tmp_path, _bert_sd(hf_pretraining), config={"model_type": "bert", **TINY, "hidden_size": 64})
    assert "shape" in _error(folder)


def test_unexpected_tensor_is_an_error(tmp_path, hf_pretraining):
    sd = _bert_sd(hf_pretraining)
    sd["encoder.layer.0.attention.adapter.weight"] = torch.zeros(3)
    msg = _error(_folder(tmp_path, sd, "bin"))
    assert "pytorch_model.bin" in msg and "unexpected" in msg and "adapter" in msg


def test_extra_layer_is_an_error(tmp_path, hf_pretraining):
    # a checkpoint with more layers than config.json says
    folder = _folder(tmp_path, _bert_sd(hf_pretraining), config={"model_type": "bert", **TINY, "num_hidden_layers": 1})
    assert "no place in the model" in _error(folder)


def test_missing_tensor_is_an_error(tmp_path, hf_pretraining):
    sd = _bert_sd(hf_pretraining)
    del sd["encoder.layer.1.output.dense.weight"]
    msg = _error(_folder(tmp_path, sd))
    assert "missing" in msg and "layers.1.ff_out.weight" in msg and "config.json" in msg


def test_missing_attention_part_is_an_error(tmp_path, hf_pretraining):
    sd = _bert_sd(hf_pretraining)
    del sd["encoder.layer.0.attention.self.key.bias"]
    assert "layer 0 attention is missing key.bias" in _error(_folder(tmp_path, sd))


def test_no_config_is_an_error(tmp_path, hf_pretraining):
    folder = _folder(tmp_path, _bert_sd(hf_pretraining))
    (folder / "config.json").unlink()
    msg = _error(folder)
    assert str(folder / "config.json") in msg and "missing" in msg


def test_invalid_json_config_is_an_error(tmp_path, hf_pretraining):
    folder = _folder(tmp_path, _bert_sd(hf_pretraining))
    (folder / "config.json").write_text('{"model_type": "bert", "hidden_size": 32,')
    assert "config.json: not valid JSON" in _error(folder)


@pytest.mark.parametrize("change,needle", [
    ({"model_type": "roberta"}, "model_type 'roberta'"),
    ({"hidden_act": "swish"}, "hidden_act 'swish'"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
])
def test_unsupported_config_is_an_error(tmp_path, hf_pretraining, change, needle):
    folder = _folder(tmp_path, _bert_sd(hf_pretraining), config={"model_type": "bert", **TINY, **change})
    assert needle in _error(folder)


def test_config_missing_key_is_an_error(tmp_path, hf_pretraining):
    cfg = {"model_type": "bert", **TINY}
    del cfg["num_attention_heads"]
    assert "missing key 'num_attention_heads'" in _error(_folder(tmp_path, _bert_sd(hf_pretraining), config=cfg))


def test_no_weights_is_an_error(tmp_path):
    tmp_path.joinpath("config.json").write_text(json.dumps({"model_type": "bert", **TINY}))
    assert "no model.safetensors or pytorch_model.bin" in _error(tmp_path)


def test_corrupt_safetensors_is_an_error(tmp_path):
    tmp_path.joinpath("config.json").write_text(json.dumps({"model_type": "bert", **TINY}))
    tmp_path.joinpath("model.safetensors").write_bytes(b"not a safetensors file at all")
    assert "cannot be read as safetensors" in _error(tmp_path)


class _RunsCode:
    """Unpickling this would run a shell command: a checkpoint must never be able to do that."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_that_runs_code_is_refused(tmp_path, hf_pretraining):
    marker = tmp_path / "pwned"
    folder = tmp_path / "model"
    _folder(folder, _bert_sd(hf_pretraining), "bin")
    sd = torch.load(folder / "pytorch_model.bin", weights_only=True)
    sd["payload"] = _RunsCode(marker)
    torch.save(sd, folder / "pytorch_model.bin")
    msg = _error(folder)
    assert "weights_only=True" in msg and "pytorch_model.bin" in msg
    assert not marker.exists()


def test_bin_that_is_not_a_state_dict_is_an_error(tmp_path):
    tmp_path.joinpath("config.json").write_text(json.dumps({"model_type": "bert", **TINY}))
    torch.save([torch.zeros(2)], tmp_path / "pytorch_model.bin")
    assert "expected a state dict" in _error(tmp_path)


def test_unknown_hub_name_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(MinBertError) as e:
        model_folder("no-such-org/no-such-bert")
    msg = str(e.value)
    assert "\n" not in msg and "no-such-org/no-such-bert" in msg
    assert "local folder" in msg and "config.json" in msg


def test_missing_local_folder_is_an_error(tmp_path):
    with pytest.raises(MinBertError, match="folder not found"):
        model_folder(str(tmp_path / "nowhere"))
    with pytest.raises(MinBertError, match="folder not found"):
        model_folder("./no-such-folder")


def test_copy_of_packaged_folder_loads_as_local(tmp_path, minilm_dir):
    for name in ("config.json", "model.safetensors"):
        shutil.copy(minilm_dir / name, tmp_path / name)
    a, _, _ = load_encoder(tmp_path)
    b, _, _ = load_encoder("all-MiniLM-L6-v2")
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
