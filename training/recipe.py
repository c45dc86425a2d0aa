"""Recipes: JSON files describing one training run (see training/recipes/*.json).

`load_recipe("lilicorr_qwen3_8b")` reads training/recipes/lilicorr_qwen3_8b.json; any other
string is a path. Overrides use dotted keys with JSON values, as given on the command line:
`--set train.max_steps=100 --set loss.margin_blend=0.5 --set target=\"/models/qwen3\"`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["RECIPE_DIR", "load_recipe", "apply_overrides", "add_recipe_arguments", "recipe_from_args"]

RECIPE_DIR = Path(__file__).parent / "recipes"


def load_recipe(name_or_path: str | Path) -> dict[str, Any]:
    path = Path(name_or_path)
    if not path.exists():
        candidate = RECIPE_DIR / f"{name_or_path}.json"
        if not candidate.exists():
            known = sorted(p.stem for p in RECIPE_DIR.glob("*.json"))
            raise ValueError(f"recipe {name_or_path!r} is neither a file nor a built-in recipe {known}")
        path = candidate
    try:
        recipe = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"recipe {path} cannot be read as JSON ({exc}); a recipe is a JSON object "
                         "like training/recipes/*.json") from None
    if not isinstance(recipe, dict):
        raise ValueError(f"recipe {path} holds a JSON {type(recipe).__name__}; a recipe is a JSON "
                         "object of sections like training/recipes/*.json")
    recipe.pop("_comment", None)
    return recipe


def apply_overrides(recipe: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of `recipe` with each "a.b.c=JSON" override applied (bare strings allowed)."""
    recipe = copy.deepcopy(recipe)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not all(key.split(".")):
            raise ValueError(f"override {item!r} must look like key.path=value (dotted names, "
                             "none empty)")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = recipe
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r}: {part!r} is not a section of the recipe")
        if isinstance(node.get(parts[-1]), dict) and not isinstance(value, dict):
            # The section's readers would fail far from here on a number or a string.
            raise ValueError(f"override {item!r} replaces the section {key!r} with {value!r}; set a "
                             f"field inside it ({key}.NAME=VALUE) or give a JSON object")
        node[parts[-1]] = value
    return recipe


def add_recipe_arguments(parser) -> None:
    parser.add_argument("--recipe", required=True,
                        help=f"recipe JSON path or built-in name ({', '.join(sorted(p.stem for p in RECIPE_DIR.glob('*.json')))})")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe field, e.g. --set train.max_steps=100 (repeatable)")
    parser.add_argument("--resume", nargs="?", const="latest", default=None,
                        help="resume from a checkpoint dir, or the latest in train.output_dir")
    parser.add_argument("--print-recipe", action="store_true", help="print the resolved recipe and exit")


def recipe_from_args(args) -> dict[str, Any]:
    return apply_overrides(load_recipe(args.recipe), args.overrides)
