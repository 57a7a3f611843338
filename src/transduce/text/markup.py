"""HTML in, HTML out: text translated without its tags, tags put back by word alignment.

:func:`translate_html` parses a snippet with the standard library's :class:`html.parser.HTMLParser`
into a tree. Block elements (``<p>``, ``<li>``, ``<td>``, ``<br>``, ...) separate *runs* of inline
content; each run's text (entities decoded) is split into sentences (:mod:`~transduce.text.document`)
and every sentence of the snippet is translated in one batched call with word alignments
(:mod:`~transduce.decode.align`). Each inline element (``<b>``, ``<a href>``, ``<span>``, ...) then wraps
the hull of the target words aligned to the source words it wrapped, clipped so that elements stay
properly nested; an element whose words align to nothing, an empty one, a void or self-closing tag
(``<img>``, ``<br/>``) and a comment are placed after the target word aligned to the source word just
before them. ``<script>``, ``<style>``, ``<code>``, ``<pre>`` and any element with ``translate="no"``
are kept verbatim and placed the same way.

Guarantees: the output parses; every start tag appears exactly once with its original text (so
attributes are unchanged), every end tag once; text is re-escaped (``&amp;``, ``&lt;``, ``&gt;``;
other entities come out as the characters they stand for). Malformed input (a stray or mismatched
end tag, an unclosed element) is an error naming the tag and its line:column.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

from .document import Piece, one_per_sentence, source_language, split_paragraph

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"}
BLOCK = {
    "address",
    "article",
    "aside",
    "blockquote",
    "body",
    "br",
    "caption",
    "dd",
    "details",
    "dialog",
    "div",
    "dl",
    "dt",
    "fieldset",
    "figcaption",
    "figure",
    "footer",
    "form",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "head",
    "header",
    "hr",
    "html",
    "li",
    "main",
    "nav",
    "ol",
    "p",
    "section",
    "summary",
    "table",
    "tbody",
    "td",
    "tfoot",
    "th",
    "thead",
    "title",
    "tr",
    "ul",
}
OPAQUE = {"script", "style", "code", "pre", "kbd", "samp", "textarea"}  # kept verbatim, not translated
RAW_TEXT = {"script", "style"}  # their text is not escaped
_WORD = re.compile(r"\S+")


@dataclass
class Node:
    """An element (``tag`` set; ``start``/``end`` its original tag texts), or a leaf: text (``text``), or a
    void/self-closing tag or comment (``start`` only)."""

    tag: str | None = None
    start: str = ""
    end: str = ""
    text: str | None = None
    children: list[Node] = field(default_factory=list)
    opaque: bool = False

    @property
    def is_element(self) -> bool:
        return self.tag is not None and self.text is None and self.end != "" or self.tag == "#root"

    def block(self) -> bool:
        return self.tag in BLOCK or any(c.block() for c in self.children)


class _Parser(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node(tag="#root")
        self.stack: list[tuple[Node, tuple[int, int]]] = [(self.root, (1, 0))]

    def _leaf(self, node: Node) -> None:
        self.stack[-1][0].children.append(node)

    def handle_starttag(self, tag, attrs):
        raw = self.get_starttag_text()
        if tag in VOID:
            return self._leaf(Node(tag=tag, start=raw))
        opaque = tag in OPAQUE or any(k == "translate" and (v or "").lower() == "no" for k, v in attrs)
        opaque = opaque or self.stack[-1][0].opaque
        node = Node(tag=tag, start=raw, opaque=opaque)
        self._leaf(node)
        self.stack.append((node, self.getpos()))

    def handle_startendtag(self, tag, attrs):
        self._leaf(Node(tag=tag, start=self.get_starttag_text()))

    def handle_endtag(self, tag):
        line, col = self.getpos()
        if tag in VOID:
            raise ValueError(f"line {line}:{col + 1}: end tag </{tag}> of a void element")
        node, (oline, ocol) = self.stack[-1]
        if node is self.root:
            raise ValueError(f"line {line}:{col + 1}: end tag </{tag}> without a start tag")
        if node.tag != tag:
            raise ValueError(
                f"line {line}:{col + 1}: end tag </{tag}> does not close <{node.tag}> "
                f"(opened at line {oline}:{ocol + 1})"
            )
        node.end = f"</{tag}>"
        self.stack.pop()

    def handle_data(self, data):
        self._leaf(Node(text=data))

    def handle_comment(self, data):
        self._leaf(Node(start=f"<!--{data}-->"))

    def handle_decl(self, decl):
        self._leaf(Node(start=f"<!{decl}>"))

    def handle_pi(self, data):
        self._leaf(Node(start=f"<?{data}>"))

    def unknown_decl(self, data):
        self._leaf(Node(start=f"<![{data}]>"))


def parse(text: str) -> Node:
    """The snippet's tree under a ``#root`` node; ``ValueError`` naming line:column for malformed markup."""
    parser = _Parser()
    parser.feed(text)
    parser.close()
    if len(parser.stack) > 1:
        node, (line, col) = parser.stack[-1]
        raise ValueError(f"line {line}:{col + 1}: <{node.tag}> is never closed")
    return parser.root


# ------------------------------------------------------------------ source side
@dataclass
class _Run:
    """Inline content between block boundaries: its text and where each inline node sits in it."""

    nodes: list[Node]
    text: str = ""
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # id(node) -> char span in text
    pieces: list = field(default_factory=list)  # document.Piece list of ``text``
    translations: list = field(default_factory=list)  # Translation per sentence piece

    def collect(self) -> None:
        parts: list[str] = []

        def walk(node: Node, pos: int) -> int:
            start = pos
            if node.text is not None:
                parts.append(node.text)
                pos += len(node.text)
            elif node.is_element and not node.opaque:
                for child in node.children:
                    pos = walk(child, pos)
            self.spans[id(node)] = (start, pos)
            return pos

        pos = 0
        for node in self.nodes:
            pos = walk(node, pos)
        self.text = "".join(parts)


def _runs(node: Node, out: list[_Run]) -> list:
    """Split ``node``'s children into block children and runs of inline ones; returns the layout."""
    layout: list = []
    for child in node.children:
        if child.tag in BLOCK or (child.is_element and not child.opaque and child.block()):
            layout.append((child, _runs(child, out) if child.is_element and not child.opaque else []))
        elif layout and isinstance(layout[-1], _Run):
            layout[-1].nodes.append(child)
        else:
            run = _Run([child])
            layout.append(run)
            out.append(run)
    return layout


# ------------------------------------------------------------------ target side
def _render_run(run: _Run) -> str:
    """The run's translation with its inline nodes placed by alignment."""
    target = "".join(t.text if hasattr(t, "text") else t for t in _target_parts(run))
    src_words, tgt_words, links = _words_and_links(run)
    if not tgt_words:  # nothing translated (whitespace only): tags in their original order
        return html.escape(target, quote=False) + "".join(_tags_only(n) for n in run.nodes)
    aligned: dict[int, set[int]] = {}
    for i, j in links:
        aligned.setdefault(i, set()).add(j)

    def hull(node: Node) -> tuple[int, int] | None:
        a, b = run.spans[id(node)]
        covered = [i for i, (s, e) in enumerate(src_words) if s < b and e > a]
        targets = [j for i in covered for j in aligned.get(i, ())]
        return (min(targets), max(targets) + 1) if targets and not node.opaque and node.is_element else None

    def anchor(node: Node) -> int:
        a = run.spans[id(node)][0]
        before = [i for i, (s, e) in enumerate(src_words) if s < a and i in aligned]
        return max(aligned[before[-1]]) + 1 if before else 0

    def place(node: Node, lo: int, hi: int) -> tuple[int, int]:
        span = hull(node)
        if span is None:
            p = min(max(anchor(node), lo), hi)
            return p, p
        s, e = max(span[0], lo), min(span[1], hi)
        return (s, e) if s < e else (min(max(span[0], lo), hi),) * 2

    def _trim(node: Node, a: int, b: int) -> tuple[int, int]:
        """Target characters a..b of the node's words, less the part of its first and last source word
        that lay outside it when the target word has that same part: ``(<b>dog</b>)``, ``<b>fast</b>.``."""
        x, y = run.spans[id(node)]
        words = [(s, e) for s, e in src_words if s < y and e > x]
        before = run.text[words[0][0] : x] if words[0][0] < x else ""
        after = run.text[y : words[-1][1]] if y < words[-1][1] else ""
        if before and target.startswith(before, a) and a + len(before) < b:
            a += len(before)
        if after and target.endswith(after, a, b) and b - len(after) > a:
            b -= len(after)
        return a, b

    def render(nodes: list[Node], lo: int, hi: int, c0: int, c1: int) -> str:
        """Target characters c0..c1 (words lo..hi) with ``nodes`` placed inside them."""
        placed = []
        cur = lo
        for node in sorted((n for n in nodes if n.text is None), key=lambda n: place(n, lo, hi)):
            s, e = place(node, lo, hi)
            s = max(s, cur)
            e = max(e, s)
            placed.append((node, s, e))
            cur = e
        out, pos = [], c0
        for node, s, e in placed:
            if s < e:
                a, b = _trim(node, tgt_words[s][0], tgt_words[e - 1][1])
            else:
                a = tgt_words[s - 1][1] if s > lo else c0
                src_at = run.spans[id(node)][0]
                if s > lo and src_at and run.text[src_at - 1].isspace() and target[a : a + 1].isspace():
                    a += 1  # "word <img>": after the space, as in the source
                b = a
            a = min(max(a, pos), c1)  # inside the parent's characters, after the previous sibling
            b = min(max(b, a), c1)
            out.append(html.escape(target[pos:a], quote=False))
            if s < e and node.is_element and not node.opaque:
                out.append(node.start + render(node.children, s, e, a, b) + node.end)
            else:
                out.append(_verbatim(node) if node.opaque or not node.is_element else _tags_only(node))
                out.append(html.escape(target[a:b], quote=False))
            pos = b
        out.append(html.escape(target[pos:c1], quote=False))
        return "".join(out)

    return render(run.nodes, 0, len(tgt_words), 0, len(target))


def _target_parts(run: _Run) -> list:
    it = iter(run.translations)
    return [next(it) if p.sentence else p.text for p in run.pieces]


def _words_and_links(run: _Run) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[tuple[int, int]]]:
    """Source and target word character spans over the whole run, and alignment links between them."""
    src_words, tgt_words, links = [], [], []
    src_pos = tgt_pos = 0
    for part, piece in zip(_target_parts(run), run.pieces):
        text = part.text if piece.sentence else part
        if piece.sentence:
            s0, t0 = len(src_words), len(tgt_words)
            src_words += [(src_pos + m.start(), src_pos + m.end()) for m in _WORD.finditer(piece.text)]
            tgt_words += [(tgt_pos + m.start(), tgt_pos + m.end()) for m in _WORD.finditer(text)]
            links += [
                (s0 + i, t0 + j) for i, j in part.alignment or [] if s0 + i < len(src_words) and t0 + j < len(tgt_words)
            ]
        src_pos += len(piece.text)
        tgt_pos += len(text)
    return src_words, tgt_words, links


def _tags_only(node: Node) -> str:
    """A node's tags with no text (an element whose words went elsewhere); opaque ones verbatim."""
    if node.text is not None:
        return ""
    if node.opaque or not node.is_element:
        return _verbatim(node)
    return node.start + "".join(_tags_only(c) for c in node.children) + node.end


def _verbatim(node: Node, raw: bool = False) -> str:
    """A node as it was in the input (text re-escaped, except inside <script>/<style>)."""
    if node.text is not None:
        return node.text if raw else html.escape(node.text, quote=False)
    if not node.is_element:
        return node.start
    raw = raw or node.tag in RAW_TEXT
    return node.start + "".join(_verbatim(c, raw) for c in node.children) + node.end


def _render_layout(layout: list) -> str:
    out = []
    for item in layout:
        if isinstance(item, _Run):
            out.append(_render_run(item))
        else:
            node, inner = item
            translated = node.is_element and not node.opaque
            out.append(node.start + _render_layout(inner) + node.end if translated else _verbatim(node))
    return "".join(out)


def translate_html(
    translator, text: str, lang: str | None = None, alignment_layer: int | None = None, **options
) -> str:
    """Translate an HTML snippet, keeping its markup (module docstring). ``lang``: the sentence
    splitter's language (default: the model's source language); ``options``: those of
    :meth:`Translator.translate` (``search=SearchOptions(...)``, batch_tokens, ...). Needs a single model's attention (alignments),
    so not an ensemble; a C++ step aligns with the PyTorch model it stands for.

    >>> translate_html(transduce.load("model"), 'A <b>dog</b> <a href="/run">runs</a>.')  # doctest: +SKIP
    'Ein <b>Hund</b> <a href="/run">rennt</a>.'
    """
    return translate_html_batch(translator, [text], lang, alignment_layer, **options)[0]


def translate_html_batch(
    translator, texts: list[str], lang: str | None = None, alignment_layer: int | None = None, **options
) -> list[str]:
    """:func:`translate_html` for several snippets, all their sentences translated in one batched call."""
    one_per_sentence(options, "HTML")
    trees = []
    runs: list[_Run] = []
    for n, text in enumerate(texts):
        try:
            trees.append(_runs(parse(text), runs))
        except ValueError as e:
            raise ValueError(f"HTML input {n + 1}: {e}") from None
    lang = lang or source_language(translator)
    for run in runs:
        run.collect()
        run.pieces = split_paragraph(run.text, lang) if run.text.strip() else [Piece(run.text)]
    batch = [p.source for run in runs for p in run.pieces if p.sentence]
    options = {k: v for k, v in options.items() if k not in ("return_scores", "alignments")}
    results = []
    if batch:
        results = translator.translate(batch, alignments="cover", alignment_layer=alignment_layer, **options)
    it = iter(results)
    for run in runs:
        run.translations = [next(it) for p in run.pieces if p.sentence]
    return [_render_layout(layout) for layout in trees]
