"""The package's layout: no import cycle between modules, each room imports only rooms below it, and no
function is longer than a screen without saying why.

grimp reads every import statement of src/transduce, those inside functions included, without importing
anything. A new import that closes a cycle or points upwards fails here with the chain that does it.

A function in src/ may be at most ``MAX_LINES`` (80) lines long, from its ``def`` to its last line. A longer
one passes only if its docstring gives the reason after the marker ``Long on purpose:``, for example a
docstring that ends "Long on purpose: every option of the command, one call each, in --help's order." The marker
on a function that fits is an error too, so a reason does not outlive the length it explained.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

PACKAGE = "transduce"
SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 80
LONG_ON_PURPOSE = "Long on purpose:"  # the docstring's marker before the reason a function is longer

# top to bottom: a room may import the rooms below it, never one above; rooms on one line marked independent
# import none of each other
LAYERS = [
    # the commands (`transduce COMMAND`), which may use each other (recipe runs evaluate and check-backends)
    (
        "__main__",
        "cli",
        "demo",
        "recipe",
        "study",
        "check_backends",
        "import_model",
        "evaluate",
        "translate",
        "score",
        "info",
    ),
    ("serve",),
    ("langid",),  # language identification: the server's `source: auto` and `transduce detect`
    ("viz",),
    ("api", "train"),  # independent
    ("backends", "text"),  # independent: what runs a step; the text around translation
    ("decode",),  # the paper's search and the Translator
    ("interop",),
    ("modeldir", "data"),  # a model directory holds the vocabularies data/ builds
    ("model", "safefiles"),  # independent
    ("fastpaths", "allocator", "metrics"),  # independent
    ("cpp",),  # building the C++ kernels for a SIMD level (fastpaths names the level chosen)
    ("config",),
]
INDEPENDENT = {
    ("api", "train"),
    ("backends", "text"),
    ("model", "safefiles"),
    ("fastpaths", "allocator", "metrics"),
}


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph(PACKAGE, cache_dir=None)


def _cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return out


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(graph) == [["p.a", "p.b"]]


def test_no_import_cycles(graph):
    cycles = _cycles(graph)
    assert not cycles, "import cycles (imports inside functions count):\n" + "\n".join(
        f"  {len(c)} modules: {', '.join(c)}" for c in cycles
    )


def test_every_room_is_in_a_layer(graph):
    rooms = {m.split(".")[1] for m in graph.modules if m.count(".") >= 1}
    placed = {room for layer in LAYERS for room in layer}
    assert rooms == placed, f"not layered: {sorted(rooms - placed)}; gone: {sorted(placed - rooms)}"


def test_rooms_import_only_downwards(graph):
    layers = [grimp.Layer(*layer, independent=layer in INDEPENDENT) for layer in LAYERS]
    illegal = graph.find_illegal_dependencies_for_layers(layers=layers, containers={PACKAGE})
    lines = [
        f"  {d.importer} -> {d.imported}: "
        + "; ".join(
            f"{'|'.join(sorted(r.heads))} -> {' -> '.join((*r.middle, '|'.join(sorted(r.tails))))}" for r in d.routes
        )
        for d in sorted(illegal, key=lambda d: (d.importer, d.imported))
    ]
    assert not illegal, "imports against the layers (tests/test_layout.py: LAYERS):\n" + "\n".join(lines)


def long_functions(source: str) -> list[tuple[str, int, str | None]]:
    """(qualified name, lines, the reason its docstring gives or None) of each function in ``source`` longer than
    :data:`MAX_LINES` or whose docstring has the marker, nested ones included."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}."
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = child.end_lineno - child.lineno + 1
                doc = ast.get_docstring(child) or ""
                if lines > MAX_LINES or LONG_ON_PURPOSE in doc:
                    reason = doc.partition(LONG_ON_PURPOSE)[2].strip() if LONG_ON_PURPOSE in doc else ""
                    found.append((name[:-1], lines, reason or None))
            visit(child, name)

    visit(ast.parse(source), "")
    return found


def test_the_length_check_finds_long_functions_and_reads_their_reason():
    def function(name: str, lines: int, doc: str = "", indent: str = "") -> str:
        head = f"{indent}def {name}():\n" + (f'{indent}    """{doc}"""\n' if doc else "")
        return head + "".join(f"{indent}    x = {i}\n" for i in range(lines - 1 - bool(doc)))

    source = "\n".join(
        [
            function("short", MAX_LINES),
            function("long", MAX_LINES + 1),
            "class C:\n" + function("method", MAX_LINES + 1, f"{LONG_ON_PURPOSE} a table of cases.", "    "),
            function("no_reason", MAX_LINES + 1, f"A docstring. {LONG_ON_PURPOSE}"),
            function("short_on_purpose", 5, f"{LONG_ON_PURPOSE} it was, once."),
        ]
    )
    assert long_functions(source) == [
        ("long", MAX_LINES + 1, None),
        ("C.method", MAX_LINES + 1, "a table of cases."),
        ("no_reason", MAX_LINES + 1, None),
        ("short_on_purpose", 5, "it was, once."),
    ]


def test_no_function_is_longer_than_a_screen_without_a_reason():
    unexplained, stale = [], []
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        for name, lines, reason in long_functions(path.read_text(encoding="utf-8")):
            where = f"  {path.relative_to(SRC)}: {name}, {lines} lines"
            if reason is None:
                unexplained.append(where)
            elif lines <= MAX_LINES:
                stale.append(where)
    assert not unexplained, (
        f"functions over {MAX_LINES} lines whose docstring gives no reason after {LONG_ON_PURPOSE!r} "
        "(split them, or say why not):\n" + "\n".join(unexplained)
    )
    assert not stale, f"{LONG_ON_PURPOSE!r} on functions of {MAX_LINES} lines or fewer (drop it):\n" + "\n".join(stale)
