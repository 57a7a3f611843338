"""Every config shipped in configs/ loads through the loader its command uses: a recipe ([recipe] table) through
``load_recipe``, a training config through ``load_config`` with its model config built, so a renamed or
mistyped key in any of them fails here, not in a user's first run."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from transduce.model import ModelConfig
from transduce.recipe import load_recipe
from transduce.train.config import load_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))


def test_there_are_configs():
    assert len(CONFIGS) >= 5


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_loads(path):
    if "recipe" in tomllib.loads(path.read_text(encoding="utf-8")):
        load_recipe(path)
    else:
        _, model = load_config(path)
        preset = model.pop("preset", None)
        config = (
            ModelConfig.preset(preset, vocab_size=8000, **model) if preset else ModelConfig(vocab_size=8000, **model)
        )
        assert config.d_model % config.n_heads == 0
