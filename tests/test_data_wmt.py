"""`transduce prepare wmt14` through its real download-and-extract path, on tiny archives of the
statmt.org layout served from a file:// URL (never the network)."""

import io
import tarfile

import pytest
from test_data_streaming import pair

from transduce.cli import main
from transduce.data import PreparedData
from transduce.data.wmt import ARCHIVES, TRAIN


def tgz(path, members: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def lines(pairs, side):
    return "".join(p[side] + "\n" for p in pairs)


@pytest.fixture
def mirror(tmp_path):
    """The five archives, each with a few pairs, named and laid out as on statmt.org."""
    root = tmp_path / "mirror"
    root.mkdir()
    start = 0
    for name, (archive, stem) in TRAIN.items():
        pairs = [pair(i) for i in range(start, start + 60)]
        start += 50  # 10 pairs of each corpus repeat the previous one's
        tgz(root / archive, {f"{stem}.en": lines(pairs, 0), f"{stem}.de": lines(pairs, 1), "README": "x"})
    dev = [pair(i) for i in range(1000, 1020)]
    tgz(root / "dev.tgz", {"dev/newstest2013.en": lines(dev, 0), "dev/newstest2013.de": lines(dev, 1)})
    test = [pair(i) for i in range(2000, 2007)]
    sgm = {
        lang: '<srcset setid="newstest2014" srclang="any">\n<doc docid="1">\n'
        + "".join(f'<seg id="{i + 1}">{p[side]} &amp; co</seg>\n' for i, p in enumerate(test))
        + "</doc>\n</srcset>\n"
        for side, lang in ((0, "en"), (1, "de"))
    }
    tgz(
        root / "test-full.tgz",
        {f"test-full/newstest2014-deen-{k}.{lang}.sgm": sgm[lang] for k in ("src", "ref") for lang in ("en", "de")},
    )
    assert sorted(p.name for p in root.iterdir()) == sorted(ARCHIVES)
    return root


def test_wmt14_download_extract_and_build(mirror, tmp_path, capsys):
    out, cache = tmp_path / "data", tmp_path / "cache"
    args = [
        "prepare",
        "wmt14",
        "--url-base",
        mirror.as_uri(),
        "--cache-dir",
        str(cache),
        "--out",
        str(out),
        "--vocab-size",
        "200",
        "--weight",
        "news-commentary=2",
    ]
    assert main(args) == 0
    assert "downloading file://" in capsys.readouterr().err
    data = PreparedData.open(out)
    m = data.manifest
    train = m["splits"]["train"]
    assert [c["name"] for c in train["corpora"]] == list(TRAIN)
    assert train["read"] == 180 and train["filtered"]["duplicate"] == 20  # de-duplicated across corpora by default
    assert [c["written"] for c in train["corpora"]] == [60, 50, 100]
    assert m["settings"]["filters"] == {"max_tokens_per_sentence": 250, "max_ratio": 1.5, "dedup": True}
    assert m["weights"] == {"europarl": 1.0, "commoncrawl": 1.0, "news-commentary": 2.0}
    assert len(data.split("newstest2013")) == 20
    test = data.split("newstest2014")
    assert len(test) == 7 and test.tgt_text(3) == pair(2003)[1] + " &amp; co"  # the SGML's text as sacreBLEU has it
    assert not any(p.name.endswith(".partial") for p in cache.rglob("*"))
    assert main(args) == 0 and "reused" in capsys.readouterr().err  # cached archives, same key
    assert main(["prepare", "wmt14", "--src", "en", "--tgt", "en", "--out", str(tmp_path / "x")]) == 2
    assert main([*args[:-2], "--weight", "europal=2"]) == 2
    assert "no WMT14 corpus europal" in capsys.readouterr().err
    (mirror / "dev.tgz").unlink()
    fresh = [
        "prepare",
        "wmt14",
        "--url-base",
        mirror.as_uri(),
        "--cache-dir",
        str(tmp_path / "c2"),
        "--out",
        str(tmp_path / "d2"),
    ]
    assert main(fresh) == 2
    assert "dev.tgz: download failed" in capsys.readouterr().err


def test_wmt14_recipes_carry_the_papers_settings():
    from pathlib import Path

    from transduce.model import ModelConfig
    from transduce.train.config import load_config

    configs = Path(__file__).resolve().parents[1] / "configs"
    for name, preset, steps, dropout, d_model in (
        ("base", "paper-base", 100_000, 0.1, 512),
        ("big", "paper-big", 300_000, 0.3, 1024),
    ):
        cfg, model = load_config(configs / f"wmt14-en-de-{name}.toml")
        assert (cfg.schedule, cfg.warmup, cfg.adam_betas, cfg.adam_eps, cfg.lr_scale) == (
            "rsqrt",
            4000,
            [0.9, 0.98],
            1e-9,
            1.0,
        )
        assert cfg.max_tokens * 8 == 25_000 and cfg.max_steps == steps and cfg.save_every_minutes == 10.0
        assert cfg.keep_last >= {"base": 5, "big": 20}[name] and cfg.bleu_beam == 4
        m = ModelConfig.preset(model["preset"], vocab_size=37000)
        assert model["preset"] == preset and (m.dropout, m.d_model, m.label_smoothing) == (dropout, d_model, 0.1)
