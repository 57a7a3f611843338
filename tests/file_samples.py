"""Sample files of every format that keeps its structure through translation (.txt, .srt, .html, .docx,
.pptx, .odt, .odp), built in memory, and the checks that their translations kept structure and formatting:
shared by the server's /translate_file tests and ``transduce translate --input``'s."""

from __future__ import annotations

import io
import re
import zipfile

from lxml import etree

from transduce.text.document import reassemble, sentences, split_text
from transduce.text.markup import translate_html_batch

TXT = "A man rides a red bike. Two men talk.\n\n  A dog runs.\r\n"
SRT = "1\n00:00:01,000 --> 00:00:02,500\nA man rides\na red bike.\n\n2\n00:00:03,000 --> 00:00:04,000\nA dog runs.\n"
HTML = "<!DOCTYPE html>\n<html><head><title>A dog</title></head><body><p>A dog <b>runs</b>.</p></body></html>\n"

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
A = "http://schemas.openxmlformats.org/drawingml/2006/main"
T = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
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
ODF = (
    f'<office:document-content xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" xmlns:text="{T}" '
    'xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0"><office:body><office:text>'
    '<text:h>A dog runs.</text:h><text:p>A man rides a <text:span text:style-name="T1">red</text:span> bike.'
    "<text:tab/>Two<text:s/>men talk.</text:p><draw:frame><draw:text-box><text:p>A dog runs.</text:p>"
    "</draw:text-box></draw:frame><text:p/></office:text></office:body></office:document-content>"
)
# the paragraphs as the office reader gives them to the model (HTML snippets, one span per run)
OOXML_SNIPPETS = [
    '<span data-r="0">A man rides a </span><span data-r="1">red</span><span data-r="2"> bike.</span>',
    '<span data-r="0">A dog runs.</span><img data-r="1"><span data-r="2">Two men talk.</span>',
    '<span data-r="0">A dog runs.</span>',  # the slide
]
ODF_SNIPPETS = [
    "A dog runs.",
    'A man rides a <span data-r="0">red</span> bike.<img data-r="1">Two men talk.',
    "A dog runs.",
]
OTHER = {"[Content_Types].xml": "<Types/>", "word/media/x.bin": "\x00\x01keep"}  # copied byte for byte
ODF_OTHER = {"mimetype": "application/vnd.oasis"}
PARTS = {
    ".docx": ("word/document.xml", DOCX, OTHER),
    ".pptx": ("ppt/slides/slide1.xml", PPTX, OTHER),
    ".odt": ("content.xml", ODF, ODF_OTHER),
    ".odp": ("content.xml", ODF, ODF_OTHER),
}
TEXTS = {".txt": TXT, ".srt": SRT, ".html": HTML}


def archive(parts: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in parts.items():
            z.writestr(name, text)
    return buf.getvalue()


def sample(suffix: str) -> bytes:
    """The sample file of ``suffix``'s format."""
    if suffix in TEXTS:
        return TEXTS[suffix].encode()
    part, xml, other = PARTS[suffix]
    return archive({**other, part: xml})


def document(translator, text: str) -> str:
    pieces = split_text(text, "en")
    return reassemble(pieces, translator.translate(sentences(pieces)))


def check_text(suffix: str, got: bytes, translator) -> None:
    """A translated .txt, .srt or .html sample: its layout, cue heads or markup kept, each text as offline."""
    text = got.decode()
    if suffix == ".txt":
        assert text == document(translator, TXT)
    elif suffix == ".srt":
        first, second = translator.translate(["A man rides a red bike.", "A dog runs."])
        assert text == f"1\n00:00:01,000 --> 00:00:02,500\n{first}\n\n2\n00:00:03,000 --> 00:00:04,000\n{second}\n"
    else:
        assert text == translate_html_batch(translator, [HTML], "en")[0]
        assert "<html><head><title>" in text and text.endswith("</body></html>\n")


def _plain(translator, snippets: list[str]) -> list[str]:
    return [re.sub(r"<[^>]*>", "", t) for t in translate_html_batch(translator, snippets, "en")]


def check_office(suffix: str, got: bytes, translator) -> None:
    """A translated office sample: other parts byte for byte, each paragraph's words as the model places them,
    paragraph properties, bold / italic / styled runs, tabs and empty paragraphs kept."""
    part, _, other = PARTS[suffix]
    z = zipfile.ZipFile(io.BytesIO(got))
    assert all(z.read(n) == v.encode() for n, v in other.items())
    root = etree.fromstring(z.read(part))
    if suffix == ".docx":
        ns = {"w": W}
        want = _plain(translator, OOXML_SNIPPETS)
        paragraphs = root.findall(".//w:p", ns)
        assert ["".join(t.text or "" for t in p.iterfind(".//w:t", ns)) for p in paragraphs[:2]] == want[:2]
        assert paragraphs[0].find("w:pPr/w:jc", ns) is not None and paragraphs[2].find("w:r", ns) is None
        assert len(paragraphs[0].findall("w:r/w:rPr/w:b", ns)) == 1  # the bold run is there once, with its words
        assert len(paragraphs[1].findall("w:r/w:tab", ns)) == 1  # the tab run is kept
    elif suffix == ".pptx":
        ns = {"a": A}
        want = _plain(translator, OOXML_SNIPPETS)
        slide = root.find(".//a:p", ns)
        assert "".join(t.text for t in slide.iterfind(".//a:t", ns)) == want[2]
        assert slide.find("a:r/a:rPr", ns).get("i") == "1"
    else:
        ns = {"text": T}
        want = _plain(translator, ODF_SNIPPETS)
        paragraphs = root.xpath("//text:h | //text:p", namespaces=ns)
        assert ["".join(p.xpath("text()|text:span/text()", namespaces=ns)) for p in paragraphs[:3]] == want
        assert len(paragraphs[1].findall("text:span", ns)) == 1 and len(paragraphs[1].findall("text:tab", ns)) == 1
        assert paragraphs[1].find("text:span", ns).get(f"{{{T}}}style-name") == "T1"


def check(suffix: str, got: bytes, translator) -> None:
    (check_office if suffix in PARTS else check_text)(suffix, got, translator)
