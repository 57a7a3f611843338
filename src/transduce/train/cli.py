"""``transduce train CONFIG.toml [--set key=value ...] [--resume]``.

Checks everything that can be checked before the first update, each error naming the file or key:
the data directory, the vocabulary against the [model] table, the output directory, every config key.
Several processes: ``torchrun --nproc_per_node=N -m transduce train CONFIG.toml``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from ..config import ConfigError
from .checkpoint import list_checkpoints
from .config import load_config, model_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="TOML file with [train] and [model] tables (see configs/)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a [train] key, or a [model] key as model.KEY (repeatable)",
    )
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in the run directory")


def preflight(config_path: Path, overrides: list[str], resume: bool):
    """Validate config, data, vocabulary and output directory; return (cfg, model_cfg, data)."""
    from ..data import PreparedData

    cfg, model_table = load_config(config_path, overrides)
    if cfg.dtype == "auto":  # resolved here, so the run's config.toml records what was used
        from .step import resolve_dtype
        from .trainer import pick_device

        device = pick_device(cfg.device, int(os.environ.get("LOCAL_RANK", "0")))
        cfg.dtype, why = resolve_dtype(cfg.dtype, device.type)
        if int(os.environ.get("RANK", "0")) == 0:
            print(why, flush=True)
    data_dir = Path(cfg.data)
    if not data_dir.is_dir():
        raise FileNotFoundError(
            f"{config_path}: key 'data': data directory {data_dir} does not exist (build it with `transduce prepare`)"
        )
    data = PreparedData.open(data_dir)
    if cfg.init_from is not None:  # fine-tuning: shape and vocabulary come from the model directory
        from . import init

        model_cfg = init.model_config(cfg.init_from, model_table, where=f"{config_path} [model]")
        init.check_vocabulary(cfg.init_from, data)
    else:
        model_cfg = model_config(model_table, data.vocabs, where=f"{config_path} [model] (vocabulary of {data_dir})")
    from ..modeldir import check_vocab_matches

    check_vocab_matches(model_cfg, data.vocabs, f"{data_dir}/vocab")
    if not model_cfg.source_eos:  # batches end every source with </s> (data/batching.py)
        where = cfg.init_from if cfg.init_from is not None else f"{config_path} [model]"
        raise ConfigError(
            f"{where}: key 'source_eos' is false (a model imported from OpenNMT-py / Argos Translate); "
            "training feeds sources ending in </s>, so such a model translates but does not train here"
        )
    data.split(cfg.train_split)  # names the split if missing
    check_writable(Path(cfg.out))
    if not resume and list_checkpoints(Path(cfg.out) / "checkpoints"):
        raise ConfigError(
            f"key 'out': {cfg.out} already holds checkpoints; pass --resume to continue "
            "that run, or choose another output directory"
        )
    return cfg, model_cfg, data


def check_writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test."):
            pass
    except OSError as e:
        raise ConfigError(f"key 'out': cannot write to output directory {out}: {e.strerror or e}") from None


def run(args: argparse.Namespace) -> int:
    from .trainer import Trainer, write_run_header

    cfg, model_cfg, data = preflight(args.config, args.overrides, args.resume)
    if int(os.environ.get("RANK", "0")) == 0:
        write_run_header(cfg, model_cfg, data.vocabs)
    Trainer(cfg, model_cfg, data, resume=args.resume).train()
    return 0
