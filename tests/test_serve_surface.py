"""The rest of LibreTranslate's surface: /frontend/settings, /spec, /suggest kept in SQLite and exported
as a TSV that ``transduce prepare files --tsv`` reads, and LibreTranslate's limit flags by their names."""

import pytest
import torch

pytest.importorskip("fastapi", reason="server tests need fastapi (the serve extra)")
uvicorn = pytest.importorskip("uvicorn", reason="server tests need uvicorn (the serve extra)")

from fastapi.testclient import TestClient  # noqa: E402

from transduce.cli import main  # noqa: E402
from transduce.config import ConfigError  # noqa: E402
from transduce.serve.keys import Access, read_keys  # noqa: E402
from transduce.serve.server import create_app  # noqa: E402
from transduce.serve.service import Settings  # noqa: E402
from transduce.serve.suggestions import Store  # noqa: E402


def test_frontend_settings_and_spec(translator, tmp_path):
    with TestClient(create_app(translator, Settings(char_limit=500))) as c:
        settings = c.get("/frontend/settings").json()
        assert settings["charLimit"] == 500 and settings["apiKeys"] is False and settings["keyRequired"] is False
        assert settings["suggestions"] is False and settings["filesTranslation"] is True
        assert settings["language"] == {
            "source": {"code": "auto", "name": "Auto Detect"},
            "target": {"code": "fr", "name": "French"},
        }
        spec = c.get("/spec").json()
        assert {"/translate", "/detect", "/languages", "/suggest", "/frontend/settings"} <= set(spec["paths"])
    keys = tmp_path / "keys.txt"
    keys.write_text("a-key-of-mine\n")
    access = Access(read_keys(keys), require="always")
    with TestClient(create_app(translator, access=access)) as c:
        settings = c.get("/frontend/settings").json()
        assert settings["apiKeys"] is True and settings["keyRequired"] is True and settings["charLimit"] == -1


def test_suggestions_are_kept_and_exported_for_fine_tuning(translator, tiny_model_dir, tmp_path, capsys):
    body = {"q": "A dog runs.", "s": "Un chien\tcourt.\n", "source": "en", "target": "fr"}
    with TestClient(create_app(translator)) as c:
        r = c.post("/suggest", data=body)
        assert r.status_code == 403 and "Suggestions are disabled" in r.json()["error"]
    db = tmp_path / "suggestions.sqlite"
    with TestClient(create_app(translator, suggestions=Store(db))) as c:
        assert c.get("/frontend/settings").json()["suggestions"] is True
        assert c.post("/suggest", data=body).json() == {"success": True}
        assert c.post("/suggest", json={**body, "q": "Two men.", "s": "Deux hommes."}).json() == {"success": True}
        r = c.post("/suggest", json={"q": "x", "source": "en", "target": "fr"})
        assert r.status_code == 400 and "missing s parameter" in r.json()["error"]
        c.post("/suggest", json={"q": "Ein Hund.", "s": "A dog.", "source": "de", "target": "en"})
    tsv = tmp_path / "suggested.tsv"
    assert main(["serve", "--suggestions", str(db), "--export-suggestions", str(tsv), "--export-pair", "en:fr"]) == 0
    assert tsv.read_text(encoding="utf-8") == "A dog runs.\tUn chien court.\nTwo men.\tDeux hommes.\n"
    assert "wrote 2 suggestions" in capsys.readouterr().out
    out = tmp_path / "data"
    argv = ["prepare", "files", "--tsv", str(tsv), "--valid-tsv", str(tsv), "--src-lang", "en", "--tgt-lang", "fr"]
    assert main([*argv, "--vocab-from", str(tiny_model_dir), "--out", str(out)]) == 0, capsys.readouterr().err
    assert (out / "train.en").read_text() == "A dog runs.\nTwo men.\n"
    assert (out / "train.fr").read_text() == "Un chien court.\nDeux hommes.\n"


def test_libretranslate_limit_flags(tiny_model_dir, monkeypatch):
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app))
    argv = ["serve", "--model", str(tiny_model_dir), "--char-limit", "50", "--batch-limit", "3"]
    assert main([*argv, "--cors-origins", "https://a.example, https://b.example", "--threads", "1"]) == 0
    settings = seen["app"].state.settings
    assert settings.char_limit == 50 and settings.max_sentences == 3
    with TestClient(seen["app"]) as c:
        r = c.post("/translate", json={"q": ["a", "b", "c", "d"], "source": "en", "target": "fr"})
        assert r.status_code == 413 and "4 texts exceed the batch limit of 3" in r.json()["error"]
        r = c.post("/translate", json={"q": "A dog." * 10, "source": "en", "target": "fr"})
        assert r.status_code == 413 and "exceeds the text limit of 50" in r.json()["error"]
        r = c.get("/languages", headers={"Origin": "https://b.example"})
        assert r.headers["access-control-allow-origin"] == "https://b.example"
    assert main(["serve", "--model", str(tiny_model_dir), "--char-limit", "-1"]) == 2


def test_libretranslate_environment_variables(tiny_model_dir, monkeypatch, capsys):
    """A LibreTranslate docker setup's LT_* variables carry over as the defaults of the options of one name."""
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw, app=app))
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    variables = {"HOST": "0.0.0.0", "PORT": "5000", "CHAR_LIMIT": "300", "BATCH_LIMIT": "-1", "REQ_LIMIT": "7"}
    for name, value in {**variables, "THREADS": "1"}.items():
        monkeypatch.setenv(f"LT_{name}", value)
    assert main(["serve", "--model", str(tiny_model_dir)]) == 0
    assert seen["host"] == "0.0.0.0" and seen["port"] == 5000 and threads == [1]
    assert seen["app"].state.service.access.anonymous_limit == 7
    settings = seen["app"].state.settings
    assert settings.char_limit == 300 and settings.max_sentences == Settings().max_sentences  # -1: the default
    assert main(["serve", "--model", str(tiny_model_dir), "--char-limit", "20", "--threads", "1"]) == 0
    assert seen["app"].state.settings.char_limit == 20  # the option wins
    monkeypatch.setenv("LT_REQ_LIMIT", "many")
    with pytest.raises(SystemExit):
        main(["serve", "--model", str(tiny_model_dir)])
    assert "environment variable LT_REQ_LIMIT: expected a whole number, got 'many'" in capsys.readouterr().err


def test_a_libretranslate_keys_database_is_read_as_it_is(translator, tmp_path):
    """LibreTranslate's db/api_keys.db (table api_keys: api_key, req_limit, char_limit) in place of a keys file."""
    import sqlite3

    db = tmp_path / "api_keys.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE api_keys (api_key TEXT NOT NULL, req_limit INTEGER NOT NULL, char_limit INTEGER)")
        c.execute("INSERT INTO api_keys VALUES ('0f8c3b1e-aaaa-bbbb', 1, NULL), ('5e2d9a77-cccc-dddd', 0, 10)")
    keys = read_keys(db)
    assert [(k.per_minute, k.char_limit, k.line) for k in keys] == [(1, 0, 1), (0, 10, 2)]
    with TestClient(create_app(translator, access=Access(keys, require="always"))) as c:
        body = {"q": "A dog runs.", "source": "en", "target": "fr"}
        assert c.post("/translate", data={**body, "api_key": "0f8c3b1e-aaaa-bbbb"}).status_code == 200
        assert c.post("/translate", data={**body, "api_key": "0f8c3b1e-aaaa-bbbb"}).status_code == 429
        r = c.post("/translate", data={**body, "api_key": "5e2d9a77-cccc-dddd"})
        assert r.status_code == 413 and "exceeds the text limit of 10" in r.json()["error"]
    bad = tmp_path / "other.db"
    with sqlite3.connect(bad) as c:
        c.execute("CREATE TABLE t (x)")
    with pytest.raises(ConfigError, match="not a LibreTranslate keys database"):
        read_keys(bad)
