"""The text around translation: what is split, streamed, marked up or constrained before the search runs.

document.py    — sentences and paragraphs of plain text, split and put back with their whitespace
streaming.py   — the translate command's input as units (lines or paragraphs) translated in chunks, in order
markup.py      — inline HTML kept through translation, tags placed by word alignment
files.py       — files kept in their format (.txt .html .srt .docx .pptx .odt .odp): units out, translations in
office.py      — .docx/.pptx/.odt/.odp paragraphs as HTML snippets, their runs placed back by alignment
terminology.py — glossaries, per-sentence term constraints and forced prefixes (constrained beam search)
"""
