"""The e2e-only dummy-weight hook (e2e/hook): it reaches the installed dummy
loader, it widens SGLang's dummy init the way its docstring says, it is
loaded through its own entry point, and it is no part of the plugin."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
loader = pytest.importorskip("sglang.srt.model_loader.loader")
weight_utils = pytest.importorskip("sglang.srt.model_loader.weight_utils")

ROOT = Path(__file__).resolve().parents[2]
HOOK_DIR = ROOT / "e2e" / "hook"
sys.path.insert(0, str(HOOK_DIR))
import sglang_dspark_dp_e2e_init as hook  # noqa: E402


class Tiny(torch.nn.Module):
    """Two same-shape linears (stock dummy init makes them equal), an RMSNorm
    weight and an int buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(64, 64, bias=False)
        self.b = torch.nn.Linear(64, 64, bias=False)
        self.input_layernorm = torch.nn.Module()
        self.input_layernorm.weight = torch.nn.Parameter(torch.zeros(64))
        self.register_buffer("ids", torch.arange(4))


@pytest.fixture
def restored(monkeypatch):
    for module in (loader, weight_utils):
        monkeypatch.setattr(
            module, "initialize_dummy_weights", module.initialize_dummy_weights
        )
    monkeypatch.delenv(hook.RANGE_ENV, raising=False)
    return monkeypatch


def test_the_dummy_loader_calls_the_name_the_hook_replaces(restored):
    load_model = loader.DummyModelLoader.load_model
    assert "initialize_dummy_weights" in load_model.__code__.co_names
    assert load_model.__globals__ is vars(loader)
    assert "sglang.srt.model_loader.loader" in hook.install()
    assert loader.initialize_dummy_weights is hook.init_like_a_real_model


def test_stock_dummy_init_is_what_the_hook_is_for():
    model = Tiny()
    weight_utils.initialize_dummy_weights(model)
    assert torch.equal(model.a.weight, model.b.weight)  # same shape, same values
    assert model.a.weight.abs().max() <= 1e-3


def test_the_hook_draws_per_name_at_a_real_scale_with_unit_norms(restored):
    model = Tiny()
    hook.init_like_a_real_model(model)
    r = hook.DEFAULT_RANGE
    assert not torch.equal(model.a.weight, model.b.weight)
    assert 0.9 * r < model.a.weight.abs().max() <= r
    assert torch.all(model.input_layernorm.weight == 1)
    assert model.ids.tolist() == [0, 1, 2, 3]
    again = Tiny()
    hook.init_like_a_real_model(again)
    assert torch.equal(again.a.weight, model.a.weight)  # every server alike
    restored.setenv(hook.RANGE_ENV, "0.2")
    hook.init_like_a_real_model(again)
    assert 0.18 < again.a.weight.abs().max() <= 0.2


@pytest.mark.parametrize("value", ["x", "0", "1.5"])
def test_a_bad_range_is_refused_by_name(restored, value):
    restored.setenv(hook.RANGE_ENV, value)
    with pytest.raises(ValueError, match=hook.RANGE_ENV):
        hook.init_range()


def test_its_own_entry_point_and_whitelisting_it_alone_skips_the_plugin(
    restored,
):
    """SGLANG_PLUGINS=e2e_init (the plugin-off server) loads the hook and
    not the plugin, through the installed loader; where the plugin is
    installed here too, it is skipped by name."""
    from sglang.srt import plugins

    dists = list(metadata.distributions(path=[str(HOOK_DIR)]))
    assert len(dists) == 1
    (ep,) = dists[0].entry_points
    assert (ep.group, ep.name) == ("sglang.srt.plugins", "e2e_init")
    assert ep.value == "sglang_dspark_dp_e2e_init:register"
    restored.syspath_prepend(str(HOOK_DIR))
    restored.setenv("SGLANG_PLUGINS", "e2e_init")
    loaded = plugins.load_plugins_by_group("sglang.srt.plugins")
    assert set(loaded) == {"e2e_init"}


def test_the_hook_is_no_part_of_the_plugin():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "e2e_init" not in pyproject
    assert not list((ROOT / "python").rglob("*e2e_init*"))


# ---------------------------------------------------------------- the bench


def test_the_bench_imports_with_the_shim_and_takes_the_e2e_arguments(tmp_path):
    """``python -m sglang.benchmark.serving`` with e2e/bench_shim first on its
    path (where ``datasets`` is missing, as on the device) imports, and its
    own parser takes ``e2e_checks.bench_args``: the run is replaced by a
    stand-in that records the parsed arguments."""
    import subprocess

    code = (
        "import importlib.util, json, sys\n"
        "sys.modules['datasets'] = None  # not installed, as on the device\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "del sys.modules['datasets']\n"
        "import datasets\n"
        "assert datasets.__file__.startswith(sys.argv[1]), datasets.__file__\n"
        "import sglang.benchmark.serving as s\n"
        "spec = importlib.util.spec_from_file_location('ec', sys.argv[2])\n"
        "ec = importlib.util.module_from_spec(spec); spec.loader.exec_module(ec)\n"
        "got = {}\n"
        "s.run_benchmark = lambda a: got.update(vars(a))\n"
        "sys.argv = ['serving', *ec.bench_args(1, sys.argv[3], sys.argv[4])]\n"
        "s.cli_main()\n"
        "print(json.dumps({k: got[k] for k in ('dataset_name', 'seed', "
        "'num_prompts', 'tokenizer', 'output_file', 'backend')}))\n"
        "try:\n"
        "    datasets.load_dataset('x')\n"
        "except RuntimeError as e:\n"
        "    print('refused:', e)\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(ROOT / "e2e" / "bench_shim"),
            str(ROOT / "e2e" / "e2e_checks.py"),
            str(ROOT / "e2e/models/tiny-dsv4-target"),
            str(tmp_path / "b.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    lines = out.stdout.strip().splitlines()
    parsed = json.loads(next(ln for ln in lines if ln.startswith("{")))
    assert parsed["dataset_name"] == "random-ids" and parsed["backend"] == "sglang"
    assert parsed["seed"] == 24 and parsed["num_prompts"] == 64
    assert parsed["output_file"] == str(tmp_path / "b.jsonl")
    assert any(ln.startswith("refused: datasets is not installed") for ln in lines)
