"""The registries of tasks, losses and heads as values (minbert.core.registry), each pluggable thing
declared apart from its code, and user code held to the built-ins' contract (docs/extending.md):
a name taken twice, a module that exits or fails on import, a loss or head whose output breaks the
contract, a checkpoint whose user code changed, and the guards that read declarations, however a
loss is named."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import child_env

from test_extending import SNLI, demo_params, error_of

from minbert.core.errors import MinBertError
from minbert.core.registry import Registry, builtin, declare, stated
from minbert.core.tasks import BUILTIN_TASKS, TASKS
from minbert.params import validate_params

REPO = Path(__file__).resolve().parents[1]
SCORE = {"range": [0, 4], "files": {"format": "tsv", "train": "data/demo/ids-sst-train.csv",
                                    "dev": "data/demo/ids-sst-dev.csv", "texts": ["sentence"], "label": "sentiment"}}


def module(folder: Path, name: str, text: str) -> str:
    (folder / name).write_text(text)
    return str(folder / name)


LOSS = '''
from minbert.core.register import Loss, register_loss


@register_loss{replace}
class {cls}(Loss):
    name, kinds, batch_statistic = "{name}", ("{kind}",), {batch}

    def __call__(self, output, target, pair=None):
        return {body}
'''


def loss_module(folder: Path, file: str, name: str, kind: str = "regression", batch: bool = False,
                body: str = "((output.float() - target.float()) ** 2).mean() * 0", replace: str = "",
                cls: str = "Mine") -> str:
    return module(folder, file, LOSS.format(name=name, kind=kind, batch=batch, body=body, replace=replace, cls=cls))


HEAD = '''
import torch
from torch import nn

from minbert.core.register import register_head


@register_head
class Wide(nn.Module):
    name, view = "wide", "{view}"

    def __init__(self, in_dim, outputs, hidden_layers, dropout):
        super().__init__()
        self.linear = nn.Linear(in_dim, {width})

    def forward(self, *parts):
        return self.linear(parts[0]){squeeze}
'''


# ---------------------------------------------------------------- registries as values

def test_two_params_files_in_one_process_each_see_their_own_tasks_losses_and_heads(tmp_path):
    a_loss = loss_module(tmp_path, "a_loss.py", "alpha")
    b_loss = loss_module(tmp_path, "b_loss.py", "beta")
    a = validate_params(demo_params(modules=[a_loss], tasks={"snli": SNLI}))
    b = validate_params(demo_params(modules=[b_loss], tasks={"score": SCORE}))
    assert "snli" in a.registry.tasks and "score" not in a.registry.tasks and "alpha" in a.registry.losses
    assert "score" in b.registry.tasks and "snli" not in b.registry.tasks and "beta" in b.registry.losses
    assert "beta" not in a.registry.losses and "alpha" not in b.registry.losses
    # nothing outside them learnt of either, and one does not accept the other's names
    assert set(TASKS) == set(BUILTIN_TASKS) and "alpha" not in builtin().losses
    assert "unknown task 'snli'" in error_of(demo_params(modules=[b_loss], tasks={"score": SCORE},
                                                         experiments={"a": {"finetune": {"tasks": ["snli"]}}}))
    msg = error_of(demo_params(modules=[b_loss], experiments={"a": {"finetune": {"heads": {"losses": {"sts": "alpha"}}}}}))
    assert "sts's loss 'alpha' is no loss" in msg
    # each registry is the one in use only where it is made so
    with a.registry.active():
        assert "snli" in TASKS and "score" not in TASKS
    assert "snli" not in TASKS


def test_a_job_works_from_the_registry_of_its_own_settings(tmp_path):
    from minbert.params.settings import FinetuneSettings
    from minbert.params.resolve import finetune_settings

    lp = validate_params(demo_params(tasks={"snli": SNLI}, experiments={"a": {"finetune": {"tasks": ["sst", "snli"]}}}))
    with lp.registry.active():
        settings = finetune_settings(lp.experiments["a"]).model_dump(mode="json")
    job = FinetuneSettings(**settings)          # read elsewhere, with no params file loaded
    assert "snli" in job.registry.tasks and job.registry.tasks["snli"].classes == tuple(SNLI["classes"])
    assert "snli" not in TASKS


def test_both_registrations_are_in_one_module_and_the_former_import_paths_still_register(tmp_path):
    """A module of yours imports `Loss`, `register_loss` and `register_head` from minbert.core.register;
    one written before (an exported model's code) imports them from minbert.core.losses and
    minbert.core.extensions, and registers the same."""
    from minbert.core import extensions, losses, register

    assert losses.register_loss is register.register_loss and extensions.register_head is register.register_head
    assert register.Loss is losses.Loss
    with pytest.raises(AttributeError):
        losses.register_head      # noqa: B018
    old = module(tmp_path, "old.py", LOSS.format(name="old_style", kind="regression", batch=False, body="0",
                                                 replace="", cls="Old").replace(
        "from minbert.core.register import Loss, register_loss", "from minbert.core.losses import Loss, register_loss"))
    head = module(tmp_path, "old_head.py", HEAD.format(view="single", width=1, squeeze=".squeeze(-1)").replace(
        "minbert.core.register", "minbert.core.extensions"))
    lp = validate_params(demo_params(modules=[old, head]))
    assert lp.registry.module_of("loss", "old_style") == old and lp.registry.module_of("head", "wide") == head


def test_a_declared_task_looked_up_outside_its_registry_is_one_line_naming_it_and_the_cause():
    """A task a params file declares, looked up where its registry is not in use, is an error that
    names the task and why (not a bare KeyError far from its cause); it is still a KeyError, so `get`
    and `in` answer as before; passed the registry, the same code needs no `with`."""
    from minbert.core.settings import FinetuneSettings, read_settings
    from minbert.core.tasks import TaskNotInRegistry
    from minbert.params.resolve import finetune_settings

    lp = validate_params(demo_params(tasks={"snli": SNLI}, experiments={"a": {"finetune": {"tasks": ["sst", "snli"]}}}))
    with pytest.raises(TaskNotInRegistry) as e:
        TASKS["snli"]
    said = str(e.value)
    assert "\n" not in said and said.startswith("task 'snli' is not in the built-in tasks (no task registry is in use")
    assert "with lp.registry.active()" in said and "sst, para, sts" in said
    assert isinstance(e.value, KeyError) and TASKS.get("snli") is None and "snli" not in TASKS
    other = validate_params(demo_params(tasks={"score": SCORE}))
    in_use = "task 'snli' is not in the task registry in use, whose tasks are sst, para, sts, cfimdb, score"
    with other.registry.active(), pytest.raises(TaskNotInRegistry, match=in_use):
        TASKS["snli"]
    with lp.registry.active():
        assert TASKS["snli"].classes == tuple(SNLI["classes"])
    with lp.registry.active():
        job = read_settings(FinetuneSettings, finetune_settings(lp.experiments["a"]).model_dump(mode="json"), "a.json")
    heads = job.finetune.heads
    with pytest.raises(TaskNotInRegistry, match="task 'snli'"):
        heads.head_of("snli")
    tasks = job.registry.tasks
    assert heads.head_of("snli", tasks) == "cross" and heads.loss_of("snli", tasks) == "cross_entropy"
    # a library entry point (train, predict, teach, export, the report) runs in its settings' registry itself
    from minbert.core.settings import in_own_registry

    @in_own_registry
    def entry(s, task):
        return TASKS[task].classes

    assert entry(job, "snli") == tuple(SNLI["classes"]) and entry(lp, "snli") == tuple(SNLI["classes"])
    assert "snli" not in TASKS


def test_the_builtin_declarations_are_their_classes_own_and_read_without_torch():
    """Each built-in loss and head is one class in one file, registered as a user's is; its
    declaration is read from the file's source, which states the same as the class."""
    for kind, table in (("loss", builtin().losses), ("head", builtin().heads)):
        for name, decl in table.items():
            cls = builtin().implementation(kind, name)
            assert declare(kind, stated(kind, cls), module=decl.module, qualname=decl.qualname) == decl, name
            assert Path(sys.modules[cls.__module__].__file__).stem == decl.module.rsplit(".", 1)[1]
    assert set(builtin().losses) == {"cross_entropy", "bce", "mse", "pearson", "mse+pearson", "ranking"}
    assert set(builtin().heads) == {"classifier", "prototypes", "cross", "concat_uv", "concat", "concat_mult",
                                    "concat_cos", "cosine", "cosine_linear"}
    code = ("import sys; from minbert.params import validate_params; from minbert.core.registry import builtin; "
            "builtin(); print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('minbert.model')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(REPO), capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_builtin_head_is_one_file(tmp_path):
    """A head added to minbert/model/heads/ is known by its file alone, as a user's by its module."""
    from minbert.core.registry import builtin_declarations

    folder = tmp_path / "heads"
    folder.mkdir()
    for path in (REPO / "minbert/model/heads").glob("*.py"):
        (folder / path.name).write_text(path.read_text())
    (folder / "bilinear.py").write_text((REPO / "examples/extending/heads.py").read_text())
    heads = builtin_declarations("head", folder)
    assert heads["bilinear"].view == "bi" and heads["bilinear"].module == "minbert.model.heads.bilinear"


# ---------------------------------------------------------------- every guard reads the declaration

BATCH_LOSSES = {      # each way a loss that is a statistic of the whole batch can be chosen
    "losses.sts pearson": ({}, {"tasks": ["sts"], "heads": {"losses": {"sts": "pearson"}}}),
    "losses.sts mse+pearson": ({}, {"tasks": ["sts"], "heads": {"losses": {"sts": "mse+pearson"}}}),
    "losses.para ranking": ({}, {"tasks": ["para"], "heads": {"para": "cosine", "losses": {"para": "ranking"}}}),
    "a task's declared loss": ({"tasks": {"score": {**SCORE, "loss": "pearson"}}}, {"tasks": ["score"]}),
}


def batch_loss(spelling: str, folder: Path) -> tuple[dict, dict]:
    """(top-level params, an experiment's finetune section) choosing a batch-statistic loss so."""
    if spelling in BATCH_LOSSES:
        return BATCH_LOSSES[spelling]
    return ({"modules": [loss_module(folder, "centred.py", "centred", batch=True)]},
            {"tasks": ["sts"], "heads": {"losses": {"sts": "centred"}}})


@pytest.mark.parametrize("spelling", [*BATCH_LOSSES, "a loss of the user's"])
def test_gradient_accumulation_is_refused_for_every_batch_statistic_loss(tmp_path, spelling):
    """Accumulation would compute the statistic over micro-batches: a silently different loss."""
    top, ft = batch_loss(spelling, tmp_path)
    raw = demo_params(**top, experiments={"a": {"finetune": {**ft, "gradient_accumulation_steps": 2}}})
    msg = error_of(raw)
    assert msg.startswith("params.yaml: key 'experiments.a.finetune': Value error, gradient_accumulation_steps 2: ") \
        or "gradient_accumulation_steps 2: " in msg, msg
    assert "is a statistic of the whole batch" in msg and "set gradient_accumulation_steps: 1" in msg
    # the same settings with a loss row by row accumulate
    raw["experiments"]["a"]["finetune"]["batch_size"] = 8
    validate_params(demo_params(**top, experiments={"a": {"finetune": {"tasks": ft["tasks"],
                                                                      "gradient_accumulation_steps": 2}}})
                    if spelling != "a task's declared loss" else
                    demo_params(tasks={"score": SCORE}, experiments={"a": {"finetune": {
                        "tasks": ["score"], "gradient_accumulation_steps": 2}}}))


@pytest.mark.parametrize("spelling", [*BATCH_LOSSES, "a loss of the user's"])
def test_the_other_guards_refuse_every_batch_statistic_loss(tmp_path, spelling):
    """Batches of one row, torchrun's slices and a task left with one row, for each spelling."""
    from minbert.train.distributed import refuse_batch_statistics
    from minbert.train.experiment import refuse_one_row_batches

    top, ft = batch_loss(spelling, tmp_path)
    assert "is a statistic of the whole batch, and a batch of 1" in error_of(
        demo_params(**top, experiments={"a": {"finetune": {**ft, "batch_size": 1}}}))
    lp = validate_params(demo_params(**top, experiments={"a": {"finetune": ft}}))
    cfg, task = lp.experiments["a"].finetune, ft["tasks"][0]
    with lp.registry.active():
        with pytest.raises(MinBertError, match="processes would each compute on their slice"):
            refuse_batch_statistics(cfg.heads, cfg.tasks, 2)
        with pytest.raises(MinBertError, match=f"the {task} training data has 1 row"):
            refuse_one_row_batches(cfg, {task: [0]}, "a")


def test_the_old_per_task_loss_and_head_keys_are_refused_with_their_replacement():
    msg = error_of(demo_params(base={"finetune": {"heads": {"sts_loss": "pearson"}}}))
    assert msg == ("params.yaml: key 'base.finetune.heads.sts_loss': is no longer read; a task's loss is "
                   "`heads.losses.<task>`: write `losses: {sts: pearson}`")
    msg = error_of(demo_params(base={"finetune": {"heads": {"task_heads": {"cfimdb": "classifier"}}}}))
    assert msg == ("params.yaml: key 'base.finetune.heads.task_heads': is no longer read; a task's head is "
                   "`heads.<task>`, for every task: write `cfimdb: classifier`")
    # a task's head is `heads.<task>` for every task, the user's too; a key no task or setting has is unknown
    lp = validate_params(demo_params(tasks={"snli": SNLI}, experiments={"a": {"finetune": {
        "tasks": ["sst", "snli"], "heads": {"snli": "concat", "sst": "classifier"}}}}))
    heads = lp.experiments["a"].finetune.heads
    with lp.registry.active():
        assert heads.head_of("snli") == "concat" and heads.head_of("sts") == "cross"
    assert heads.model_dump()["snli"] == "concat" and "sst" not in heads.model_dump()   # the declared one is left out
    assert "'base.finetune.heads.stss': unknown key (did you mean 'sts'?): neither a heads setting nor a task" in error_of(
        demo_params(base={"finetune": {"heads": {"stss": "cosine"}}}))


# ---------------------------------------------------------------- a name taken twice

def test_a_name_registered_twice_is_refused_naming_both_modules(tmp_path):
    one = loss_module(tmp_path, "one.py", "huber", cls="HuberOne")
    two = loss_module(tmp_path, "two.py", "huber", cls="HuberTwo")
    msg = error_of(demo_params(modules=[one, two]))
    assert msg == (f"params.yaml: key 'modules': the loss name 'huber' is registered twice: by {one} (class HuberOne) "
                   f"and by {two} (class HuberTwo); rename one of them")
    mse = loss_module(tmp_path, "mine_mse.py", "mse", cls="MyMse")
    msg = error_of(demo_params(modules=[mse]))
    assert msg == (f"params.yaml: key 'modules': {mse} (class MyMse) registers the loss name 'mse', which is built in "
                   f"(minbert/model/losses/mse.py (class MeanSquaredError)); name yours otherwise, or register it with "
                   f"`@register_loss(replace=True)` to use it in place of the built-in one")
    head = module(tmp_path, "cosine_head.py", HEAD.format(view="bi", width=1, squeeze=".squeeze(-1)")
                  .replace('"wide"', '"cosine"'))
    assert "registers the head name 'cosine', which is built in" in error_of(demo_params(modules=[head]))


def test_a_user_who_replaces_a_builtin_says_so_and_every_job_using_it_names_the_module(tmp_path):
    from minbert.params.resolve import finetune_settings, predict_settings

    mse = loss_module(tmp_path, "mine_mse.py", "mse", cls="MyMse", replace="(replace=True)")
    lp = validate_params(demo_params(modules=[mse], experiments={"a": {}, "b": {"finetune": {"tasks": ["sst"]}}}))
    decl = lp.registry.losses["mse"]
    assert not decl.builtin and decl.module == mse
    with lp.registry.active():
        assert finetune_settings(lp.experiments["a"]).modules == [mse]        # sts trains with it
        assert predict_settings(lp.experiments["a"]).modules == [mse]
        assert finetune_settings(lp.experiments["b"]).modules == []           # sst alone does not
    typo = loss_module(tmp_path, "typo.py", "mze", cls="Mze", replace="(replace=True)")
    assert "says replace=True, and no built-in loss is named 'mze' (did you mean 'mse'?)" in error_of(
        demo_params(modules=[typo]))


@pytest.mark.parametrize("text,reason", [
    ("import sys\nsys.exit(3)\n", "it calls sys.exit(3) while it is imported"),
    ("raise SystemExit('bye')\n", "it calls sys.exit('bye') while it is imported"),
    ("import os\nraise KeyError('x')\n", "KeyError: 'x'"),
])
def test_a_module_that_exits_or_fails_on_import_is_one_line_naming_it(tmp_path, text, reason):
    path = module(tmp_path, "bad.py", text)
    msg = error_of(demo_params(modules=[path]))
    assert msg == f"params.yaml: key 'modules': module '{path}' cannot be imported ({reason}); fix it or remove it " \
                  f"from modules", msg


def test_a_module_that_exits_on_import_is_one_line_from_every_command(tmp_path):
    """`sys.exit(3)` in a module made every command exit 3 with no line."""
    import yaml

    bad = module(tmp_path, "bad.py", "import sys\nsys.exit(3)\n")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(demo_params(modules=[bad])))
    out = subprocess.run([sys.executable, "-m", "workflow.dag", "--params", str(tmp_path / "params.yaml")],
                         cwd=tmp_path, env=child_env(REPO), capture_output=True, text=True)
    assert out.returncode == 2, out
    assert out.stderr == f"error: {tmp_path / 'params.yaml'}: key 'modules': module '{bad}' cannot be imported (it " \
                         f"calls sys.exit(3) while it is imported); fix it or remove it from modules\n"


@pytest.mark.parametrize("attrs,problem", [
    ('name, kinds = "x", ("score",)', "`kinds` ('score',) must name some of classification, binary, regression"),
    ('name, kinds, reads = "x", ("regression",), "texts"', "`reads` must be one of outputs, pairs (got 'texts')"),
    ('kinds = ("regression",)', "a loss class states its `name` as a class attribute"),
    ('name, kinds, batch_statistic = "x y", ("regression",), True', "`name` 'x y' must be letters"),
])
def test_a_loss_class_that_breaks_the_contract_is_one_line_naming_its_class(tmp_path, attrs, problem):
    path = module(tmp_path, "odd.py", "from minbert.core.register import Loss, register_loss\n\n\n@register_loss\n"
                                      f"class Odd(Loss):\n    {attrs}\n")
    msg = error_of(demo_params(modules=[path]))
    assert msg.startswith(f"params.yaml: key 'modules': {path} (class Odd): ") and problem in msg, msg


# ---------------------------------------------------------------- outputs checked where first used

@pytest.mark.parametrize("body,said", [
    ("0.0", "returned float"),
    ("(output.float() - target.float()) ** 2", "returned a tensor of shape (3,), float32"),
    ("((output.float() - target.float()) ** 2).mean().detach()", "carries no gradient to the model"),
    ("((output - target) ** 2).mean().long()", "returned a tensor of shape (), int64"),
    # a gradient required, but none reaching the head's output: trains nothing
    ("output.new_tensor(0.5).requires_grad_()", "carries no gradient to the model"),
    ("((output.float() - target.float()) ** 2).mean().detach().requires_grad_()", "carries no gradient to the model"),
    ("(output.detach() * output.new_ones(1).requires_grad_()).mean()", "carries no gradient to the model"),
])
def test_a_user_loss_whose_output_breaks_the_contract_is_one_line_naming_it(tmp_path, body, said):
    from minbert.train.losses import task_loss

    path = loss_module(tmp_path, "bad_loss.py", "bad", body=body)
    lp = validate_params(demo_params(modules=[path], experiments={"a": {"finetune": {"heads": {
        "losses": {"sts": "bad"}}}}}))
    heads = lp.experiments["a"].finetune.heads
    out = torch.tensor([0.1, 0.5, 0.9], requires_grad=True)
    with lp.registry.active(), pytest.raises(MinBertError) as e:
        task_loss("sts", heads, out, torch.tensor([1.0, 2.0, 3.0]))
    assert str(e.value).startswith(f"{path} (class Mine): loss 'bad' returned") or said in str(e.value)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_a_loss_checked_once_costs_nothing_after(tmp_path):
    from minbert.train.losses import loss_object

    lp = validate_params(demo_params(modules=[loss_module(tmp_path, "ok.py", "ok")]))
    loss = loss_object("ok", lp.registry)
    out = torch.tensor([0.1, 0.5], requires_grad=True)
    loss(out, torch.tensor([0.0, 1.0]))
    assert loss.checked and loss.checked_grad and loss_object("ok", lp.registry) is loss


@pytest.mark.parametrize("view,width,squeeze,task,said", [
    ("bi", 3, "", "sts", "returned shape (2, 3), float32 for 2 rows of sts, which has 1 output; forward must return "
                         "a float tensor of shape (B,)"),
    ("single", 2, "", "sst", "returned shape (2, 2), float32 for 2 rows of sst, which has 5 outputs; forward must "
                             "return a float tensor of shape (B, 5)"),
    ("bi", 1, "", "sts", "returned shape (2, 1), float32"),
    ("bi", 1, ".squeeze(-1).long()", "sts", "returned shape (2,), int64"),
    # the right shape and type, and nothing it could train: detached, or a fresh leaf
    ("bi", 1, ".squeeze(-1).detach()", "sts", "returned an output for sts that does not reach the model's parameters"),
    ("single", 5, ".detach().requires_grad_()", "sst", "returned an output for sst that does not reach the model's "
                                                       "parameters"),
])
def test_a_user_head_whose_output_breaks_the_contract_is_one_line_naming_it(tmp_path, tiny_model_dir, view, width,
                                                                            squeeze, task, said):
    from minbert.model.multitask import MultitaskModel
    from minbert.model.weights import load_encoder

    path = module(tmp_path, "wide.py", HEAD.format(view=view, width=width, squeeze=squeeze))
    lp = validate_params(demo_params(modules=[path], experiments={"a": {"finetune": {"heads": {task: "wide"}}}}))
    model = MultitaskModel(load_encoder(tiny_model_dir)[0], lp.experiments["a"].finetune.heads, [task], lp.registry)
    with pytest.raises(MinBertError) as e:
        model.head_forward(task, torch.randn(2 * len(model.views[task].parts), model.encoder.config.hidden_size))
    assert str(e.value).startswith(f"{path} (class Wide): head 'wide' ") and said in str(e.value), str(e.value)


# ---------------------------------------------------------------- declared tasks: what is known at load

@pytest.mark.parametrize("name,taken", [
    ("nli", "the NLI pretraining's prepared data (nli-train.tsv, nli-dev.tsv)"),    # prepare died on KeyError
    ("pooling", "a key of the heads settings (heads.pooling)"),
    ("losses", "a key of the heads settings (heads.losses)"),
])
def test_a_task_may_not_take_a_name_the_pipeline_uses(name, taken):
    msg = error_of(demo_params(tasks={name: SNLI}))
    assert msg == f"params.yaml: key 'tasks': '{name}' is taken: it is {taken}; declare yours under another name", msg
    # compared without case (the same files on a case-insensitive disk): NLI was accepted while nli was refused
    upper = name.upper()
    msg = error_of(demo_params(tasks={upper: SNLI}))
    assert msg == (f"params.yaml: key 'tasks': '{upper}' is taken: it is {taken} (as '{name}': names are compared "
                   f"without case, as the files they name); declare yours under another name"), msg


def test_a_declared_task_differs_from_the_builtins_and_the_others_in_more_than_case():
    assert error_of(demo_params(tasks={"STS": SNLI})) == (
        "params.yaml: key 'tasks': 'STS' is a built-in task (as 'sts': names are compared without case, as the files "
        "they name); declare yours under another name")
    assert error_of(demo_params(tasks={"snli": SNLI, "SNLI": SNLI})) == (
        "params.yaml: key 'tasks': 'SNLI' and 'snli' differ only in case: their files would be one file on a "
        "case-insensitive disk; name them otherwise")


def test_the_reserved_names_are_derived_from_what_uses_them():
    from minbert.core.nli_data import NLI_DATA
    from minbert.params.heads import HeadsParams
    from minbert.params.tasks import reserved_task_names

    reserved = reserved_task_names()
    assert set(reserved) == set(BUILTIN_TASKS) | {NLI_DATA.name} | set(HeadsParams.model_fields)


def test_a_task_file_that_cannot_be_resolved_is_refused_at_load(tmp_path):
    (tmp_path / "loop_a.jsonl").symlink_to(tmp_path / "loop_b.jsonl")
    (tmp_path / "loop_b.jsonl").symlink_to(tmp_path / "loop_a.jsonl")
    task = {**SNLI, "files": {**SNLI["files"], "train": str(tmp_path / "loop_a.jsonl")}}
    msg = error_of(demo_params(tasks={"snli": task}))            # was a RuntimeError traceback
    assert msg == (f"params.yaml: key 'tasks.snli.files.train': {tmp_path / 'loop_a.jsonl'} cannot be resolved (a "
                   f"symlink loop); point it at the file itself")
    task = {**SNLI, "files": {**SNLI["files"], "train": str(tmp_path)}}
    assert f"key 'tasks.snli.files.train': {tmp_path} is a folder; name the file" in error_of(
        demo_params(tasks={"snli": task}))


def test_a_header_that_names_a_column_twice_is_refused_by_every_reader(tmp_path):
    """A declared task's CSV and a CS224N file were read from the first of the two columns with no
    word; `minbert predict` refused the same header: one check now, shared."""
    from minbert.data.declared import read_declared
    from minbert.data.raw import read_cs224n
    from minbert.params.tasks import TaskParams
    from minbert.scoring.inputs import Origin, tasks_for

    path = tmp_path / "mine.csv"
    path.write_text("id,text,score,text\n1,a text,3,another\n2,more,1,again\n")
    spec = TaskParams.model_validate({**SCORE, "files": {"train": str(path), "dev_fraction": 0.5, "texts": ["text"],
                                                         "label": "score", "id": "id"}})
    with Registry.of(tasks={"mine": spec.declaration()}).active():
        with pytest.raises(MinBertError, match=rf"^{path} line 1: column 'text' appears twice in the header; keep one$"):
            read_declared(spec.task("mine"), "train")
    raw = tmp_path / "ids-sst-train.csv"
    raw.write_text("\tid\tsentence\tsentiment\tid\n0\ta\tgood\t3\tb\n")
    with pytest.raises(MinBertError, match=rf"^{raw} line 1: column 'id' appears twice in the header; keep one$"):
        read_cs224n(raw, "sst")
    with pytest.raises(MinBertError, match=r"^in.tsv:1: column 'sentence' appears twice in the header; keep one$"):
        tasks_for(Origin("in.tsv", [2]), ["sentence", "sentence"], None, {"sst": BUILTIN_TASKS["sst"]})


def test_a_json_line_that_gives_a_key_twice_is_a_bad_row(tmp_path):
    from minbert.data.raw import read_nli

    path = tmp_path / "nli.jsonl"
    good = '{"sentence1": "a", "sentence2": "b", "gold_label": "entailment", "captionID": "1", "pairID": "1"}'
    twice = '{"sentence1": "a", "sentence2": "b", "gold_label": "entailment", "gold_label": "neutral", ' \
            '"captionID": "2", "pairID": "2"}'
    path.write_text(good + "\n" + twice + "\n")
    with pytest.raises(MinBertError, match=r"line 2: key 'gold_label' is given twice in one object"):
        read_nli(path)
    frame, report = read_nli(path, on_bad_rows="drop")
    assert len(frame) == 1 and report.dropped == {"invalid_json": 1}


def test_a_tasks_title_is_in_no_training_description():
    """Changing a task's title (or short name) re-trained every experiment that trained it: what
    only people read is in the settings of the export and the report alone."""
    from minbert.pipeline import plan

    def settings(title: str) -> dict:
        raw = demo_params(tasks={"snli": {**SNLI, "title": title}}, experiments={"a": {"finetune": {
            "tasks": ["sst", "snli"]}}}, export={"experiments": ["a"]})
        raw["tasks"]["snli"]["files"]["train"] = str(REPO / "data/demo/nli-sample.jsonl")
        return {j.id: j.settings for j in plan.pipeline(validate_params(raw))}

    before, after = settings("inference (SNLI)"), settings("natural language inference")
    assert {j for j in before if before[j] != after[j]} == {"export@a", "report"}
    for job in ("prepare", "finetune@a", "predict@a", "evaluate@a"):
        assert before[job]["tasks"]["snli"]["title"] == "", job           # the default: the task's name
    assert before["export@a"]["tasks"]["snli"]["title"] == "inference (SNLI)"


# ---------------------------------------------------------------- a checkpoint made with user code

def test_a_checkpoint_made_with_user_code_refuses_that_code_changed(tmp_path, tiny_model_dir):
    """A model trained with a head of the user's answered with whatever the module's code is now."""
    from minbert.model.checkpoint import load_checkpoint, save_checkpoint
    from minbert.model.multitask import MultitaskModel
    from minbert.model.tokenizer import Tokenizer
    from minbert.model.weights import load_encoder

    head = module(tmp_path, "wide.py", HEAD.format(view="bi", width=1, squeeze=".squeeze(-1)"))
    lp = validate_params(demo_params(modules=[head], experiments={"a": {"finetune": {"heads": {"sts": "wide"}}}}))
    model = MultitaskModel(load_encoder(tiny_model_dir)[0], lp.experiments["a"].finetune.heads, ["sst", "sts"],
                           lp.registry)
    path = tmp_path / "model.pt"
    save_checkpoint(path, model, Tokenizer(tiny_model_dir, 32))
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["declared"]["modules"] == [head] and list(ckpt["declared"]["code"][head]) == [str(Path(head).resolve())]
    loaded, _, _ = load_checkpoint(path, trust_remote_code=True)
    assert type(loaded.heads["sts"]).__name__ == "Wide" and "sts" in loaded.registry.tasks
    original = Path(head).read_text()
    Path(head).write_text(original + "\n# a comment changes nothing it does\n")
    load_checkpoint(path, trust_remote_code=True)
    Path(head).write_text(original.replace("self.linear(parts[0])", "self.linear(parts[1])"))
    for trusted in (True, False):             # checked before anything is imported, trusted or not
        with pytest.raises(MinBertError) as e:
            load_checkpoint(path, trust_remote_code=trusted)
        assert str(e.value) == (f"{path}: the model was trained with the code of module '{head}', and its file "
                                f"{Path(head).resolve()} has changed since; put back the code that trained it, or "
                                f"train the model again")
    Path(head).unlink()
    with pytest.raises(MinBertError, match=r"is gone; put back the code that trained it"):
        load_checkpoint(path, trust_remote_code=True)
    Path(head).write_text(original)
    load_checkpoint(path, trust_remote_code=True)


@pytest.mark.parametrize("text,said", [
    ("from minbert.core.register import Loss, register_loss\n\n\n@register_loss\nclass Odd(Loss):\n"
     "    name, kinds = 'odd', ('regression',)\n\n    def __call__(self, output):\n        return output.mean()\n",
     "`__call__` cannot be called as __call__(output, target, pair=None), as every loss is"),
    ("from torch import nn\nfrom minbert.core.register import register_head\n\n\n@register_head\n"
     "class Odd(nn.Module):\n    name, view = 'odd', 'bi'\n\n    def __init__(self, in_dim, outputs):\n"
     "        super().__init__()\n\n    def forward(self, u, v):\n        return u\n",
     "`__init__` cannot be called as __init__(in_dim, outputs, hidden_layers, dropout), as every head is"),
    ("from torch import nn\nfrom minbert.core.register import register_head\n\n\n@register_head\n"
     "class Odd(nn.Module):\n    name, view = 'odd', 'bi'\n\n    def __init__(self, in_dim, outputs, layers, p):\n"
     "        super().__init__()\n\n    def forward(self, emb):\n        return emb\n",
     "`forward` cannot be called as forward(u, v), as every head is"),
])
def test_a_class_that_cannot_be_called_as_the_contract_says_is_refused_at_load(tmp_path, text, said):
    path = module(tmp_path, "odd.py", text)
    msg = error_of(demo_params(modules=[path]))
    assert msg == f"params.yaml: key 'modules': {path} (class Odd): {said} (docs/extending.md)", msg


def test_one_module_named_twice_registers_its_names_once(tmp_path):
    path = loss_module(tmp_path, "ok.py", "ok")
    lp = validate_params(demo_params(modules=[path, str(Path(path).parent / "." / "ok.py")]))
    assert lp.registry.losses["ok"].module == path


SHARED = '''from torch import nn

from minbert.core.register import register_head


@register_head
class Shared(nn.Module):
    name, view = "shared", "single"

    def __init__(self, in_dim, outputs, hidden_layers, dropout):
        super().__init__()
        self.linear = nn.Linear(in_dim, outputs)

    def forward(self, emb):
        return self.linear(emb)
'''


def test_a_helper_that_registers_a_class_imported_by_two_modules_registers_it_once(tmp_path, monkeypatch):
    """Each module named by its path imports its helpers anew (none kept for another), so the helper's
    class was two objects: "registered twice", naming two modules that hold no such class."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ext").mkdir()
    (tmp_path / "ext" / "common.py").write_text(SHARED)
    for name in ("a", "b"):
        (tmp_path / "ext" / f"{name}.py").write_text("from ext.common import Shared  # noqa: F401\n")
    lp = validate_params(demo_params(modules=["ext/a.py", "ext/b.py"], experiments={
        "a": {"finetune": {"heads": {"sst": "shared"}}}}))
    head = lp.registry.heads["shared"]
    assert head.module == "ext/a.py" and head.where == "ext/a.py (class Shared of ext/common.py)"
    # two classes that are not one (two helpers' own) are refused, each named where it is defined
    (tmp_path / "ext" / "other.py").write_text(SHARED.replace("self.linear(emb)", "-self.linear(emb)"))
    (tmp_path / "ext" / "b.py").write_text("from ext.other import Shared  # noqa: F401\n")
    assert error_of(demo_params(modules=["ext/a.py", "ext/b.py"])) == (
        "params.yaml: key 'modules': the head name 'shared' is registered twice: by ext/a.py (class Shared of "
        "ext/common.py) and by ext/b.py (class Shared of ext/other.py); rename one of them")
