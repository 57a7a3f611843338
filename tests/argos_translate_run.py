"""Install an .argosmodel with the real argostranslate and translate sentences with it, offline.

    python argos_translate_run.py PACKAGE FROM TO SENTENCES.json  ->  prints {"installed": [...], "translations": [...]}

Run by tests/test_interop_argos.py in a fresh process, because argostranslate reads its settings (ARGOS_*, XDG_*
folders) once, when first imported: the test sets them to a temporary home. Every socket connection raises,
so a step that reaches for the network fails the test instead of downloading. argostranslate's default
sentence splitter (MiniSBD) would fetch a model for the source language on first use; the installed
translation's splitter is replaced by one that keeps each input line whole, so what is tested is the
package: its metadata, tokenizer and CTranslate2 model, through argostranslate's own translate().

argostranslate 1.11 imports the ``minisbd`` package at start-up; it is AGPL-licensed, so transduce does not
install it, and this script puts a stand-in module in its place (the splitter is replaced anyway).
"""

import json
import socket
import sys
import types


def _no_network(*args, **kwargs):
    raise OSError("network access attempted during an offline argostranslate test")


socket.socket.connect = _no_network
socket.create_connection = _no_network


def _no_minisbd(*args, **kwargs):
    raise RuntimeError("MiniSBD is not installed with transduce; this test replaces the sentence splitter")


stand_in = types.ModuleType("minisbd")
stand_in.SBDetect = _no_minisbd
stand_in.models = types.SimpleNamespace(cache_dir=None, list_models=lambda: [])
sys.modules["minisbd"] = stand_in

from argostranslate import package, sbd, translate  # noqa: E402  (after the network is cut)


class WholeLine(sbd.ISentenceBoundaryDetectionModel):
    def split_sentences(self, text: str) -> list[str]:
        return [text]


def main() -> None:
    path, from_code, to_code, sentences_file = sys.argv[1:5]
    package.install_from_path(path)
    installed = [(p.from_code, p.to_code, p.package_version) for p in package.get_installed_packages()]
    translation = translate.get_translation_from_codes(from_code, to_code)
    getattr(translation, "underlying", translation).sentencizer = WholeLine()
    with open(sentences_file, encoding="utf-8") as f:
        sentences = json.load(f)
    out = [translate.translate(s, from_code, to_code) for s in sentences]
    print(json.dumps({"installed": installed, "translations": out}, ensure_ascii=False))


if __name__ == "__main__":
    main()
