"""Document mode and streaming: sentence splitting round trip, reassembly, streaming order and laziness."""

from __future__ import annotations

import io
import random
import re

import pytest

from transduce.text.document import Piece, paragraphs, reassemble, sentences, split_paragraph, split_text
from transduce.text.streaming import Unit, chunks, document_units, line_units, translate_stream

WORDS = ["Dr.", "Smith", "went", "home", "e.g.", "3.5", "billion", "U.S.", "Hello", "world", "it", "rains"]
ENDS = [".", "!", "?", "...", ""]
SPACES = [" ", "  ", "\t", "\n", "\r\n", " \n "]


def random_document(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(0, 6)):
        if rng.random() < 0.3:
            parts.append(rng.choice(["\n", "\n\n", " \n", "\r\n\r\n", "\n\t\n"]))
            continue
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) + rng.choice(ENDS)
        parts.append(rng.choice(["", " ", "  "]) + sentence + rng.choice(SPACES))
    return "".join(parts)


@pytest.mark.parametrize("seed", range(300))
def test_split_reassemble_round_trip(seed):
    """Pieces concatenate back to the input, and translating each sentence to itself changes nothing."""
    text = random_document(random.Random(seed))
    pieces = split_text(text, "en")
    assert "".join(p.text for p in pieces) == text
    assert reassemble(pieces, [p.text for p in pieces if p.sentence]) == text
    for p in pieces:
        assert (p.text.strip() == p.text and p.text) if p.sentence else not _sentence_text_outside(p)


def _sentence_text_outside(p: Piece) -> bool:
    return bool(p.text.strip())  # verbatim pieces only ever hold whitespace


QUOTED = [("“", "”"), ('"', '"'), ("‘", "’"), ("'", "'"), ("„", "“"), ("«", "»"), ("(", ")"), ("[", "]"), ('("', '")')]
GAPS = [" ", "  ", "\n", "\r\n", "\n\n", " \n  ", "\t"]


def quoted_document(rng: random.Random) -> str:
    """Sentences of plain words, some of them quoted or bracketed (the closing marks after the full stop), with
    all kinds of whitespace between the sentences and single spaces inside them."""
    out = []
    for _ in range(rng.randint(2, 7)):
        words = ["Then"] + [rng.choice(["he", "asked", "who", "it", "was", "and", "she", "left"]) for _ in range(3)]
        sentence = " ".join(words) + rng.choice([".", "?", "!", "?!", "..."])
        if rng.random() < 0.7:
            opening, closing = rng.choice(QUOTED)
            inner = rng.choice(["", "'", "’", "”"]) if rng.random() < 0.3 else ""
            sentence = rng.choice(["", "She said: "]) + opening + sentence + inner + closing
        out.append(sentence + rng.choice(GAPS))
    return "".join(out).rstrip() + rng.choice(["", "\n"])


def words_only(sentence: str) -> str:
    """A "translation" that keeps the words and drops every quote, bracket and full stop, as a model may."""
    return " ".join(re.findall(r"[^\W_]+", sentence))


@pytest.mark.parametrize("seed", range(200))
def test_whitespace_between_sentences_is_kept_around_quotes_and_brackets(seed):
    """Closing quotes and brackets after a sentence's end stay with that sentence, so the space or line break
    after them is outside every sentence: a translation that drops the marks still has each of them."""
    text = quoted_document(random.Random(seed))
    pieces = split_text(text, "en")
    assert "".join(p.text for p in pieces) == text
    got = reassemble(pieces, [words_only(s) for s in sentences(pieces)])
    assert re.findall(r"\s+", got) == re.findall(r"\s+", text), (text, [p.text for p in pieces if p.sentence])
    assert got.split() == words_only(text).split()


def test_document_structure_is_kept():
    text = "  First one. Second one!\nStill the paragraph.\n\n\nNew paragraph here.  \n"
    pieces = split_text(text, "en")
    assert sentences(pieces) == ["First one.", "Second one!", "Still the paragraph.", "New paragraph here."]
    upper = reassemble(pieces, [s.upper() for s in sentences(pieces)])
    assert upper == "  FIRST ONE. SECOND ONE!\nSTILL THE PARAGRAPH.\n\n\nNEW PARAGRAPH HERE.  \n"


def test_whitespace_inside_a_sentence_reaches_the_model_as_one_space():
    (piece,) = [p for p in split_paragraph("a wrapped\nline  with   gaps", "en") if p.sentence]
    assert piece.source == "a wrapped line with gaps"


def test_abbreviations_do_not_end_sentences():
    assert sentences(split_text("Dr. Smith met Mr. Jones at 3 p.m. today. Then he left.", "en")) == [
        "Dr. Smith met Mr. Jones at 3 p.m. today.",
        "Then he left.",
    ]


SPEECH = [
    "The patriarchs, moved with jealousy against Joseph, sold him into Egypt.",
    "God was with him, and delivered him out of all his afflictions.",
    "He made him governor over Egypt and all his house.",
    "Our fathers found no food in the land of Canaan that year.",
]


@pytest.mark.parametrize("marks", ['""', "“”", "„“", "«»", "‘’", "``", "()", "[]"])
def test_a_long_quotation_is_split_at_its_sentence_ends(marks):
    """The segmenter keeps a quotation whole: one of four sentences (over 200 characters) is cut into its
    sentences, each mark kept on the sentence it opens or closes, and the text comes back exactly."""
    opening, closing = marks
    text = f"He said, {opening}{' '.join(SPEECH)}{closing} Then he left."
    pieces = split_text(text, "en")
    assert "".join(p.text for p in pieces) == text
    assert sentences(pieces) == [
        f"He said, {opening}{SPEECH[0]}",
        *SPEECH[1:-1],
        f"{SPEECH[-1]}{closing}",
        "Then he left.",
    ]


def test_a_short_quotation_stays_one_sentence():
    text = '"Stop. Now. Go home," he said. Then he left.'
    assert sentences(split_text(text, "en")) == ['"Stop. Now. Go home," he said.', "Then he left."]


def test_reassemble_checks_the_count():
    pieces = split_text("One. Two.", "en")
    with pytest.raises(ValueError):
        reassemble(pieces, ["a", "b", "c"])
    with pytest.raises(ValueError):
        reassemble(pieces, ["a"])


def test_overlong_paragraph_is_cut_at_a_line_end():
    lines = [f"Sentence {i}.\n" for i in range(100)]
    blocks = list(paragraphs(lines, max_chars=50))
    assert "".join(b for b, _ in blocks) == "".join(lines)
    assert max(len(b) for b, _ in blocks) < 50 + len(lines[0])


# ------------------------------------------------------------------ streaming
class LoggedInput:
    """Binary lines that log how many were read, to see whether output comes before the input ends."""

    def __init__(self, lines: list[bytes]):
        self.lines, self.read = lines, 0

    def __iter__(self):
        for line in self.lines:
            self.read += 1
            yield line


class LoggedOutput(io.StringIO):
    def __init__(self, source: LoggedInput):
        super().__init__()
        self.source, self.read_at_write = source, []

    def write(self, s):
        self.read_at_write.append(self.source.read)
        return super().write(s)


def reverse(batch):
    return [s[::-1] for s in batch]


def render_line(unit, results, first):
    return "".join(r + "\n" for r in results)


def render_document(unit, results, first):
    return reassemble(unit.pieces, results)


def test_line_stream_writes_in_order_before_reading_everything():
    lines = [f"line {i}\n".encode() for i in range(1000)]
    src = LoggedInput(lines)
    out = LoggedOutput(src)
    stats = translate_stream(reverse, line_units(src, "test"), out, render_line, chunk=10)
    assert out.getvalue().splitlines() == [f"line {i}"[::-1] for i in range(1000)]
    assert stats.sentences == 1000
    assert out.read_at_write[0] <= 11  # the first chunk is written after ~10 lines, not 1000
    assert all(a <= b for a, b in zip(out.read_at_write, out.read_at_write[1:]))


def test_document_stream_matches_whole_document():
    rng = random.Random(7)
    text = "".join(random_document(rng) + "\n\n" for _ in range(200))
    src = LoggedInput(text.encode().splitlines(keepends=True))
    out = LoggedOutput(src)
    translate_stream(reverse, document_units(src, "test", "en"), out, render_document, chunk=5)
    pieces = split_text(text, "en")
    assert out.getvalue() == reassemble(pieces, reverse(sentences(pieces)))
    assert out.read_at_write[0] < len(src.lines) // 4


def test_chunk_size_does_not_change_the_output():
    text = b"".join(f"Line {i}. Second {i}.\n".encode() + (b"\n" if i % 3 == 0 else b"") for i in range(50))
    outs = []
    for size in (1, 7, 10_000):
        out = io.StringIO()
        translate_stream(reverse, document_units(io.BytesIO(text), "t", "en"), out, render_document, chunk=size)
        outs.append(out.getvalue())
    assert outs[0] == outs[1] == outs[2] != text.decode()


def test_interrupt_leaves_finished_chunks_written():
    calls = []

    def failing(batch):
        calls.append(batch)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return reverse(batch)

    out = io.StringIO()
    lines = [f"l{i}\n".encode() for i in range(100)]
    with pytest.raises(KeyboardInterrupt):
        translate_stream(failing, line_units(lines, "t"), out, render_line, chunk=10)
    assert out.getvalue().splitlines() == [f"l{i}"[::-1] for i in range(20)]


def test_invalid_utf8_names_file_and_line():
    with pytest.raises(ValueError, match=r"in\.txt:2: invalid UTF-8"):
        list(line_units([b"ok\n", b"\xff\n"], "in.txt"))


def test_chunks_never_split_a_unit():
    units = [Unit([Piece("a", True), Piece(" "), Piece("b", True)], i, i) for i in range(5)]
    assert [len(c) for c in chunks(units, 3)] == [2, 2, 1]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal(monkeypatch):
    from transduce.text import streaming as stream

    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert stream.progress_bar(100) is None  # piped: nothing extra
    term = Terminal()
    monkeypatch.setattr("sys.stderr", term)
    bar = stream.progress_bar(len(b"".join(f"l{i}\n".encode() for i in range(30))))
    lines = [f"l{i}\n".encode() for i in range(30)]
    translate_stream(reverse, line_units(lines, "t"), io.StringIO(), render_line, chunk=10, progress=bar)
    bar.close()
    shown = term.getvalue()
    assert "30 sent" in shown and "tok/s" in shown and "100%" in shown
