"""Every training command answers --help; every built-in recipe is well-formed."""

import importlib
import json
import subprocess
import sys

from types import SimpleNamespace

import pytest

from training.drafter import DrafterConfig
from training.losses import LossWeights
from training.recipe import RECIPE_DIR, apply_overrides, load_recipe
from training.trainer import TrainConfig
from vllm_liliprop.heads.lattice import LatticeConfig

COMMANDS = ["data", "regenerate", "features", "train_dflash", "train_lilicorr", "train_dels", "export"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help(command, capsys):
    module = importlib.import_module(f"training.{command}")
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    assert "usage: python -m training." + command in capsys.readouterr().out


def test_help_as_a_module_entry_point():
    result = subprocess.run([sys.executable, "-m", "training.regenerate", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage: python -m training.regenerate" in result.stdout


# The shape of the Qwen3 targets the built-in recipes name (the 4B's depth, the shallower).
QWEN3_SHAPE = SimpleNamespace(num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                              hidden_size=2560, intermediate_size=9728, vocab_size=151_936,
                              rms_norm_eps=1e-6, max_position_embeddings=40_960, rope_theta=1e6)


@pytest.mark.parametrize("path", sorted(RECIPE_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_builtin_recipes_are_well_formed(path):
    """Every section builds what the training command builds from it (a field the code does
    not know, or a value it refuses, fails here rather than hours into a run)."""
    recipe = load_recipe(path.stem)
    assert recipe["method"] in ("dflash", "lilicorr", "dels", "dels_fusion")
    TrainConfig(**recipe["train"])
    if recipe["method"] in ("dflash", "lilicorr"):
        LossWeights(**recipe.get("loss", {}))
        drafter = DrafterConfig.from_target(QWEN3_SHAPE, **recipe["drafter"])
    if recipe["method"] == "lilicorr":
        LatticeConfig.from_dflash_config({f"lilicorr_{k}": v for k, v in recipe["lattice"].items()},
                                         drafter.hidden_size, drafter.block_size, drafter.rms_norm_eps)


def test_overrides_and_print_recipe():
    recipe = apply_overrides(load_recipe("lilicorr_qwen3_8b"),
                             ["train.max_steps=7", "loss.margin_blend=0.5", "target=/models/q"])
    assert recipe["train"]["max_steps"] == 7 and recipe["loss"]["margin_blend"] == 0.5
    assert recipe["target"] == "/models/q"
    with pytest.raises(ValueError, match="key.path=value"):
        apply_overrides(recipe, ["novalue"])
    result = subprocess.run([sys.executable, "-m", "training.train_lilicorr", "--recipe", "lilicorr_qwen3_8b",
                             "--set", "train.max_steps=3", "--print-recipe"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["train"]["max_steps"] == 3
