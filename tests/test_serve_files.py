"""LibreTranslate's file translation: POST /translate_file and GET /download_file/<name> for .txt, .html
and .srt, with the layout kept, size limits, expiry, and no way out of the files folder."""

import time

import pytest
import torch

pytest.importorskip("fastapi", reason="server tests need fastapi (the serve extra)")

from fastapi.testclient import TestClient  # noqa: E402

from transduce.api import load  # noqa: E402
from transduce.serve.files import FORMATS, FileStore  # noqa: E402
from transduce.serve.server import create_app  # noqa: E402
from transduce.serve.service import Settings  # noqa: E402
from transduce.text.document import reassemble, sentences, split_text  # noqa: E402
from transduce.text.markup import translate_html_batch  # noqa: E402

TXT = "A man rides a red bike. Two men talk.\n\n  A dog runs.\r\n"
SRT = "1\n00:00:01,000 --> 00:00:02,500\nA man rides\na red bike.\n\n2\n00:00:03,000 --> 00:00:04,000\nA dog runs.\n"
HTML = "<!DOCTYPE html>\n<html><head><title>A dog</title></head><body><p>A dog <b>runs</b>.</p></body></html>\n"


@pytest.fixture(scope="module")
def translator(tiny_model_dir):
    return load(tiny_model_dir)


@pytest.fixture(autouse=True)
def one_thread():
    yield
    torch.set_num_threads(1)


def document(translator, text):
    pieces = split_text(text, "en")
    return reassemble(pieces, translator.translate(sentences(pieces), beam=4))


def upload(c, name, data, **fields):
    return c.post("/translate_file", files={"file": (name, data)}, data={"source": "en", "target": "fr", **fields})


def test_txt_srt_and_html_files_come_back_translated_with_their_layout(translator, tmp_path):
    assert FORMATS == (".txt", ".html", ".htm", ".srt", ".docx", ".pptx", ".odt", ".odp")
    with TestClient(create_app(translator, files=FileStore(tmp_path / "files"))) as c:
        assert c.get("/frontend/settings").json()["supportedFilesFormat"] == list(FORMATS)
        got = {}
        for name, data in (("notes.txt", TXT), ("film.srt", SRT), ("page.html", HTML)):
            r = upload(c, name, data.encode())
            assert r.status_code == 200, r.text
            url = r.json()["translatedFileUrl"]
            assert url.startswith("http://testserver/download_file/") and url.endswith("." + name)
            download = c.get(url)
            assert download.status_code == 200 and name in download.headers["content-disposition"]
            got[name] = download.content.decode()
    assert got["notes.txt"] == document(translator, TXT)
    first, second = translator.translate(["A man rides a red bike.", "A dog runs."], beam=4)
    assert got["film.srt"] == (
        f"1\n00:00:01,000 --> 00:00:02,500\n{first}\n\n2\n00:00:03,000 --> 00:00:04,000\n{second}\n"
    )
    assert got["page.html"] == translate_html_batch(translator, [HTML], "en", beam=4)[0]
    assert "<html><head><title>" in got["page.html"] and got["page.html"].endswith("</body></html>\n")


def test_file_errors_limits_expiry_and_no_path_escape(translator, tmp_path):
    store = FileStore(tmp_path / "files", expiry_s=0.5)
    secret = tmp_path / "secret.txt"
    secret.write_text("do not serve")
    with TestClient(create_app(translator, Settings(max_body=2000, char_limit=100), files=store)) as c:
        r = upload(c, "report.pdf", b"%PDF")
        assert r.status_code == 400 and "file type .pdf is not supported" in r.json()["error"]
        r = upload(c, "latin1.txt", "caf\xe9".encode("latin-1"))
        assert r.status_code == 400 and "latin1.txt is not UTF-8 text" in r.json()["error"]
        r = upload(c, "long.txt", b"A dog runs. " * 20)
        assert r.status_code == 413 and "exceeds the text limit of 100" in r.json()["error"]
        r = upload(c, "huge.txt", b"x" * 5000)
        assert r.status_code == 413 and "limit of 2000 bytes" in r.json()["error"]
        r = c.post("/translate_file", data={"source": "en", "target": "fr"})
        assert r.status_code == 400 and "missing file parameter" in r.json()["error"]
        for name in (
            "..%2Fsecret.txt",
            "secret.txt",
            "0" * 32 + ".secret.txt",
            "%2E%2E%2Fsecret.txt",
            "..%5Csecret.txt",
        ):
            r = c.get(f"/download_file/{name}")
            assert r.status_code == 404 and "do not serve" not in r.text, name
        url = upload(c, "../../etc/passwd.txt", b"A dog runs.", source="auto").json()["translatedFileUrl"]
        assert url.endswith(".passwd.txt") and list((tmp_path / "files").iterdir())[0].name.endswith(".passwd.txt")
        assert c.get(url).status_code == 200
        time.sleep(0.6)
        assert c.get(url).status_code == 404 and not list((tmp_path / "files").iterdir())  # expired, deleted
    with TestClient(create_app(translator, files=False)) as c:
        assert c.get("/frontend/settings").json()["filesTranslation"] is False
        assert upload(c, "a.txt", b"A dog.").status_code in (404, 405)


def test_file_options_on_the_command_line(tiny_model_dir, tmp_path, monkeypatch):
    import uvicorn

    from transduce.cli import main

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app))
    argv = ["serve", "--model", str(tiny_model_dir), "--threads", "1"]
    assert main([*argv, "--files-dir", str(tmp_path / "out"), "--file-expiry", "60"]) == 0
    assert {"/translate_file", "/download_file/{name}"} <= set(seen["app"].openapi()["paths"])
    assert (tmp_path / "out").is_dir()
    assert main([*argv, "--disable-files-translation"]) == 0
    assert "/translate_file" not in seen["app"].openapi()["paths"]
    assert main([*argv, "--file-expiry", "0"]) == 2


W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
A = "http://schemas.openxmlformats.org/drawingml/2006/main"
DOCX = (
    f'<w:document xmlns:w="{W}"><w:body>'
    '<w:p><w:pPr><w:jc w:val="center"/></w:pPr><w:r><w:t xml:space="preserve">A man rides a </w:t></w:r>'
    '<w:r><w:rPr><w:b/></w:rPr><w:t>red</w:t></w:r><w:r><w:t xml:space="preserve"> bike.</w:t></w:r></w:p>'
    "<w:p><w:r><w:t>A dog runs.</w:t></w:r><w:r><w:tab/></w:r><w:r><w:t>Two men talk.</w:t></w:r></w:p>"
    "<w:p/></w:body></w:document>"
)
PPTX = (
    f'<p:sld xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main" xmlns:a="{A}"><p:cSld><p:spTree>'
    '<p:sp><p:txBody><a:p><a:r><a:rPr lang="en-US" i="1"/><a:t>A dog runs.</a:t></a:r></a:p></p:txBody></p:sp>'
    "</p:spTree></p:cSld></p:sld>"
)


def archive(parts: dict) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in parts.items():
            z.writestr(name, text)
    return buf.getvalue()


def test_docx_and_pptx_paragraphs_translated_with_their_runs(translator, tmp_path):
    import io
    import re
    import zipfile

    from lxml import etree

    other = {"[Content_Types].xml": "<Types/>", "word/media/x.bin": "\x00\x01keep"}
    with TestClient(create_app(translator, files=FileStore(tmp_path / "files"))) as c:
        outputs = {}
        for name, part, xml in (("a.docx", "word/document.xml", DOCX), ("b.pptx", "ppt/slides/slide1.xml", PPTX)):
            r = upload(c, name, archive({**other, part: xml}))
            assert r.status_code == 200, r.text
            z = zipfile.ZipFile(io.BytesIO(c.get(r.json()["translatedFileUrl"]).content))
            assert all(z.read(n) == v.encode() for n, v in other.items())  # other parts byte for byte
            outputs[name] = etree.fromstring(z.read(part))
        r = upload(c, "broken.docx", b"PK not a zip")
        assert r.status_code == 400 and "broken.docx: not a readable .docx file" in r.json()["error"]
    with TestClient(create_app(translator, Settings(max_body=4000), files=FileStore(tmp_path / "files"))) as c:
        bomb = archive({"word/document.xml": DOCX, "word/media/zeros.bin": "0" * 300_000})  # a few hundred bytes
        r = upload(c, "bomb.docx", bomb)
        assert r.status_code == 400 and "unpacks to 300" in r.json()["error"] and "limit of 200000" in r.json()["error"]
    snippets = [
        '<span data-r="0">A man rides a </span><span data-r="1">red</span><span data-r="2"> bike.</span>',
        '<span data-r="0">A dog runs.</span><img data-r="1"><span data-r="2">Two men talk.</span>',
        '<span data-r="0">A dog runs.</span>',
    ]
    want = [re.sub(r"<[^>]*>", "", t) for t in translate_html_batch(translator, snippets, "en", beam=4)]
    ns = {"w": W, "a": A}
    paragraphs = outputs["a.docx"].findall(".//w:p", ns)
    got = ["".join(t.text or "" for t in p.iterfind(".//w:t", ns)) for p in paragraphs[:2]]
    assert got == want[:2]
    assert paragraphs[0].find("w:pPr/w:jc", ns) is not None and paragraphs[2].find("w:r", ns) is None
    assert len(paragraphs[0].findall("w:r/w:rPr/w:b", ns)) == 1  # the bold run is there once, with its words
    assert len(paragraphs[1].findall("w:r/w:tab", ns)) == 1  # the tab run is kept
    slide = outputs["b.pptx"].find(".//a:p", ns)
    assert "".join(t.text for t in slide.iterfind(".//a:t", ns)) == want[2]
    assert slide.find("a:r/a:rPr", ns).get("i") == "1"


T = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
ODF = (
    f'<office:document-content xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" xmlns:text="{T}" '
    'xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0"><office:body><office:text>'
    '<text:h>A dog runs.</text:h><text:p>A man rides a <text:span text:style-name="T1">red</text:span> bike.'
    "<text:tab/>Two<text:s/>men talk.</text:p><draw:frame><draw:text-box><text:p>A dog runs.</text:p>"
    "</draw:text-box></draw:frame><text:p/></office:text></office:body></office:document-content>"
)


def test_odt_and_odp_paragraphs_translated_with_their_spans(translator, tmp_path):
    import io
    import re
    import zipfile

    from lxml import etree

    snippets = [
        "A dog runs.",
        'A man rides a <span data-r="0">red</span> bike.<img data-r="1">Two men talk.',
        "A dog runs.",
    ]
    want = [re.sub(r"<[^>]*>", "", t) for t in translate_html_batch(translator, snippets, "en", beam=4)]
    ns = {"text": T}
    with TestClient(create_app(translator, files=FileStore(tmp_path / "files"))) as c:
        for name in ("a.odt", "b.odp"):
            r = upload(c, name, archive({"mimetype": "application/vnd.oasis", "content.xml": ODF}))
            assert r.status_code == 200, r.text
            z = zipfile.ZipFile(io.BytesIO(c.get(r.json()["translatedFileUrl"]).content))
            assert z.read("mimetype") == b"application/vnd.oasis"
            root = etree.fromstring(z.read("content.xml"))
            paragraphs = root.xpath("//text:h | //text:p", namespaces=ns)
            assert ["".join(p.xpath("text()|text:span/text()", namespaces=ns)) for p in paragraphs[:3]] == want
            assert len(paragraphs[1].findall("text:span", ns)) == 1 and len(paragraphs[1].findall("text:tab", ns)) == 1
            assert paragraphs[1].find("text:span", ns).get(f"{{{T}}}style-name") == "T1"
