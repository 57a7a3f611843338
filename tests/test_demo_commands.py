"""The commands ``transduce demo`` prints at its end work as printed: translate, attention, serve."""

from __future__ import annotations

import argparse
import json
import shlex

import pytest

from transduce import cli
from transduce.config import ConfigError
from transduce.demo import CONFIG, EXAMPLES, next_commands, run


def commands(model, tmp_path):
    sample = tmp_path / "examples.txt"
    sample.write_text("".join(f"{line}\n" for line in EXAMPLES[:2]), encoding="utf-8")
    lines = next_commands(model, sample, tmp_path, "de")
    return {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in lines}


def argv(command: str) -> tuple[list[str], str | None]:
    """The transduce arguments of a printed command line, and the file its stdout goes to."""
    command, _, redirect = command.partition(" > ")
    words = shlex.split(command)
    start = 1 if words[0].endswith("transduce") else words.index("transduce") + 1  # the script, or `python -m`
    return words[start:], (shlex.split(redirect)[0] if redirect else None)


def test_the_printed_translate_and_attention_commands_run(tiny_model_dir, tmp_path, capsys):
    printed = commands(tiny_model_dir, tmp_path)
    args, output = argv(printed["translate a file"])
    assert args[0] == "translate" and output == str(tmp_path / "examples.de")
    assert cli.main(args) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2  # one line out per line in

    args, _ = argv(printed["exact fp32"])
    assert args[0] == "translate" and "--exact" in args and cli.main(args) == 0

    args, _ = argv(printed["attention page"])
    assert args[0] == "attention" and cli.main(args) == 0
    assert "<html" in (tmp_path / "king.html").read_text(encoding="utf-8")


def test_the_printed_serve_and_curl_lines_agree(tmp_path):
    printed = commands("runs/demo/model", tmp_path)
    serve, _ = argv(printed["serve it"])
    assert serve[:3] == ["serve", "--model", "runs/demo/model"]
    port = serve[serve.index("--port") + 1]
    curl = shlex.split(printed["and call it"])
    assert curl[0] == "curl" and f"localhost:{port}/translate" in curl
    assert json.loads(curl[-1]) == {"q": "The Lord is my shepherd.", "source": "en", "target": "de"}


def test_the_demo_refuses_an_ensemble_recipe_before_training(tmp_path):
    args = argparse.Namespace(config=CONFIG, minutes=1.0, out=tmp_path / "demo", set=["recipe.members=2"])
    with pytest.raises(ConfigError, match="recipe.members must be 1"):
        run(args)
    assert not (tmp_path / "demo").exists()
