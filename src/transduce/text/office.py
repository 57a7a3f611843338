"""Office files (.docx, .pptx, .odt, .odp): each paragraph translated, its runs' formatting following
their words.

A paragraph (``w:p`` / ``a:p``) whose text sits in runs (``w:r`` / ``a:r``: formatting ``*:rPr`` and text
``*:t``) becomes an HTML snippet with one ``<span>`` per run; :func:`transduce.text.markup` translates
it and places each span on the target words aligned to the run's source words, as it places HTML tags.
Each span of the answer becomes a copy of its run (same formatting) holding the translated words; words
outside any span join the run before them. A run holding something other than text (a tab, a break, a
picture) is kept whole and placed by alignment like an empty tag. Runs inside other elements of a
paragraph (hyperlinks, fields) are kept as they are, untranslated.

OpenDocument paragraphs (``text:p``, ``text:h`` in ``content.xml``) hold text directly, with
``text:span`` elements around formatted stretches: the text becomes the snippet's text, each span that
holds only text a ``<span>``, ``text:s`` its spaces, and any other element (a tab, a link, a frame) is
kept whole and placed like an empty tag.

The XML parts are read by lxml with entities and network access off; the archive's parts other than
the translated ones are copied byte for byte.
"""

from __future__ import annotations

import copy
import html
import io
import re
import zipfile

from lxml import etree

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
A = "http://schemas.openxmlformats.org/drawingml/2006/main"
XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
PARTS = {
    ".docx": (re.compile(r"^word/(document|header\d*|footer\d*|footnotes|endnotes)\.xml$"), W),
    ".pptx": (re.compile(r"^ppt/(slides/slide|notesSlides/notesSlide)\d+\.xml$"), A),
    ".odt": (re.compile(r"^content\.xml$"), TEXT),
    ".odp": (re.compile(r"^content\.xml$"), TEXT),
}
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)
_SPAN = re.compile(r'<span data-r="(\d+)">(.*?)</span>|<img data-r="(\d+)">', re.DOTALL)


def _runs(paragraph, ns: str) -> list:
    return [child for child in paragraph if child.tag == f"{{{ns}}}r"]


def _is_text_run(run, ns: str) -> bool:
    body = [c for c in run if c.tag != f"{{{ns}}}rPr"]
    return bool(body) and all(c.tag == f"{{{ns}}}t" for c in body)


def to_html(paragraph, ns: str) -> str | None:
    """The paragraph's runs as a snippet (module docstring), or None when it has no text to translate."""
    runs = _runs(paragraph, ns)
    parts = []
    for i, run in enumerate(runs):
        if _is_text_run(run, ns):
            text = "".join(t.text or "" for t in run if t.tag == f"{{{ns}}}t")
            parts.append(f'<span data-r="{i}">{html.escape(text, quote=False)}</span>')
        else:
            parts.append(f'<img data-r="{i}">')
    snippet = "".join(parts)
    return snippet if any(_is_text_run(r, ns) and "".join(r.itertext()).strip() for r in runs) else None


def from_html(paragraph, ns: str, translated: str) -> None:
    """Replace the paragraph's runs by the translated snippet's spans (copies of their runs)."""
    runs = _runs(paragraph, ns)
    new, pos, last = [], 0, 0
    for m in _SPAN.finditer(translated):
        between = html.unescape(re.sub(r"<[^>]*>", "", translated[pos : m.start()]))
        if between and new:
            _append_text(new[-1], ns, between)
        elif between:
            new.append(_text_run(runs[last], ns, between))
        if m.group(3) is not None:
            new.append(copy.deepcopy(runs[int(m.group(3))]))
        else:
            last = int(m.group(1))
            new.append(_text_run(runs[last], ns, html.unescape(re.sub(r"<[^>]*>", "", m.group(2)))))
        pos = m.end()
    tail = html.unescape(re.sub(r"<[^>]*>", "", translated[pos:]))
    if tail:
        if new:
            _append_text(new[-1], ns, tail)
        else:
            new.append(_text_run(runs[last], ns, tail))
    where = list(paragraph).index(runs[0])
    for run in runs:
        paragraph.remove(run)
    for k, run in enumerate(new):
        paragraph.insert(where + k, run)


def _text_run(template, ns: str, text: str):
    run = copy.deepcopy(template)
    for child in list(run):
        if child.tag != f"{{{ns}}}rPr":
            run.remove(child)
    t = etree.SubElement(run, f"{{{ns}}}t")
    t.text = text
    if ns == W:
        t.set(XML_SPACE, "preserve")
    return run


def _append_text(run, ns: str, text: str) -> None:
    ts = [c for c in run if c.tag == f"{{{ns}}}t"]
    if ts:
        ts[-1].text = (ts[-1].text or "") + text
    else:
        run.append(_text_run(run, ns, text)[-1])


def read_parts(data: bytes, suffix: str, max_bytes: int | None = None) -> tuple[zipfile.ZipFile, dict]:
    """The archive and its translatable XML parts ``{name: tree}``; a damaged archive, or one unpacking to
    more than ``max_bytes`` (None: no limit), raises ValueError naming the problem."""
    pattern, _ = PARTS[suffix]
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        total = sum(info.file_size for info in archive.infolist())
        if max_bytes is not None and total > max_bytes:
            raise ValueError(f"unpacks to {total} bytes, over the limit of {max_bytes}")
        trees = {n: etree.fromstring(archive.read(n), _PARSER) for n in archive.namelist() if pattern.match(n)}
    except (zipfile.BadZipFile, etree.XMLSyntaxError, KeyError) as e:
        raise ValueError(f"not a readable {suffix} file: {e}") from None
    if not trees:
        raise ValueError(f"not a {suffix} file: no {pattern.pattern} part")
    return archive, trees


def paragraphs(trees: dict, suffix: str) -> list[tuple[object, str]]:
    """``(paragraph element, snippet)`` for every paragraph with text, in document order."""
    ns = PARTS[suffix][1]
    tags = (f"{{{ns}}}p", f"{{{ns}}}h") if ns == TEXT else (f"{{{ns}}}p",)
    out = []
    for tree in trees.values():
        for p in tree.iter(*tags):
            snippet = odf_to_html(p) if ns == TEXT else to_html(p, ns)
            if snippet is not None:
                out.append((p, snippet))
    return out


def put_back(paragraph, suffix: str, translated: str) -> None:
    """The translated snippet in place of the paragraph's content (:func:`from_html`, :func:`odf_from_html`)."""
    ns = PARTS[suffix][1]
    odf_from_html(paragraph, translated) if ns == TEXT else from_html(paragraph, ns, translated)


def _odf_simple_span(child) -> bool:
    return child.tag == f"{{{TEXT}}}span" and len(child) == 0


def odf_to_html(paragraph) -> str | None:
    """An OpenDocument paragraph as a snippet (module docstring), or None when it has no text."""
    esc = lambda t: html.escape(t or "", quote=False)  # noqa: E731
    parts, text = [esc(paragraph.text)], [paragraph.text or ""]
    for i, child in enumerate(paragraph):
        if _odf_simple_span(child):
            parts.append(f'<span data-r="{i}">{esc(child.text)}</span>')
            text.append(child.text or "")
        elif child.tag == f"{{{TEXT}}}s":
            parts.append(" " * int(child.get(f"{{{TEXT}}}c", "1")))
        else:
            parts.append(f'<img data-r="{i}">')
        parts.append(esc(child.tail))
        text.append(child.tail or "")
    return "".join(parts) if "".join(text).strip() else None


def odf_from_html(paragraph, translated: str) -> None:
    children = list(paragraph)
    for child in children:
        paragraph.remove(child)
    paragraph.text = None

    def add_text(t: str) -> None:
        if not t:
            return
        if len(paragraph):
            paragraph[-1].tail = (paragraph[-1].tail or "") + t
        else:
            paragraph.text = (paragraph.text or "") + t

    pos = 0
    for m in _SPAN.finditer(translated):
        add_text(html.unescape(re.sub(r"<[^>]*>", "", translated[pos : m.start()])))
        element = copy.deepcopy(children[int(m.group(3) if m.group(3) is not None else m.group(1))])
        element.tail = None
        if m.group(3) is None:
            element.text = html.unescape(re.sub(r"<[^>]*>", "", m.group(2)))
        paragraph.append(element)
        pos = m.end()
    add_text(html.unescape(re.sub(r"<[^>]*>", "", translated[pos:])))


def write(archive: zipfile.ZipFile, trees: dict) -> bytes:
    """The archive with the translated parts in place of the originals, everything else copied."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info in archive.infolist():
            if info.filename in trees:
                z.writestr(
                    info, etree.tostring(trees[info.filename], xml_declaration=True, encoding="UTF-8", standalone=True)
                )
            else:
                z.writestr(info, archive.read(info.filename))
    return out.getvalue()
