"""The C++ build helper's guard against a stale torch build lock (cpp.builder_lock)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from transduce.cpp import builder_lock


def test_a_lock_left_by_a_killed_build_is_removed_with_a_warning(tmp_path):
    (tmp_path / "lock").touch()  # what torch leaves when its build is killed part-way
    with pytest.warns(RuntimeWarning, match=r"removed .*lock, left by a build that was stopped"):
        with builder_lock(tmp_path):
            assert not (tmp_path / "lock").exists()


def test_a_live_build_is_waited_for_and_its_lock_kept(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, pathlib, sys, time\n"
            f"d = pathlib.Path({str(tmp_path)!r})\n"
            "f = open(d / 'transduce.lock', 'a'); fcntl.flock(f, fcntl.LOCK_EX)\n"
            "(d / 'lock').touch(); print('held', flush=True); time.sleep(1.5)\n"
            "(d / 'lock').unlink()\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    start = time.monotonic()
    with builder_lock(tmp_path):  # no warning: the holder finished its build and removed its lock itself
        waited = time.monotonic() - start
        assert not (tmp_path / "lock").exists()
    holder.wait(timeout=10)
    assert waited > 0.5


def _cpu(monkeypatch, flags: str) -> None:
    from transduce import cpp

    monkeypatch.setattr(cpp, "cpu_flags", lambda: frozenset(flags.split()))
    monkeypatch.setattr(cpp, "ISAS", cpp.ISAS if cpp.X86 else (cpp.Isa("scalar"), cpp._AVX2, cpp._AVX512, cpp._VNNI))


def test_the_level_is_the_cpus_best_or_the_one_asked_for(monkeypatch):
    from transduce import cpp

    monkeypatch.delenv(cpp.ISA_VARIABLE, raising=False)
    _cpu(monkeypatch, "sse2 avx avx2 fma")
    assert [i.name for i in cpp.runnable_isas()] == ["scalar", "avx2"]
    isa, why = cpp.chosen_isa()
    assert isa.name == "avx2" and "no avx512" in why and "-march=native" not in isa.flags
    _cpu(monkeypatch, "avx2 fma avx512f avx512bw avx512vl avx512dq avx512_vnni amx_tile")
    assert cpp.chosen_isa()[0].name == "avx512vnni"
    monkeypatch.setenv(cpp.ISA_VARIABLE, "avx2")  # forced below the CPU's best (CT2_FORCE_CPU_ISA's role)
    assert cpp.chosen_isa() == (cpp._AVX2, f"{cpp.ISA_VARIABLE}=avx2")
    _cpu(monkeypatch, "sse2")  # a build cache carried to an older CPU: its level cannot be asked for
    with pytest.raises(ValueError, match="this CPU runs only scalar"):
        cpp.chosen_isa()
    monkeypatch.setenv(cpp.ISA_VARIABLE, "avx9")
    with pytest.raises(ValueError, match="expected one of scalar, avx2"):
        cpp.chosen_isa()
    with pytest.raises(ValueError, match="'avx512' cannot run here"):
        cpp.isa_named("avx512")


def test_each_level_builds_under_its_own_name(monkeypatch, tmp_path):
    """The build cache keys a build by its level: a cache made on a newer CPU is never loaded on an older one."""
    from torch.utils import cpp_extension

    from transduce import cpp

    monkeypatch.delenv(cpp.ISA_VARIABLE, raising=False)
    _cpu(monkeypatch, "avx2 fma")
    seen = {}
    monkeypatch.setattr(cpp, "build_root", lambda: tmp_path)
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: seen.update(kw) or "module")
    source = tmp_path / "k.cpp"
    source.write_text("// one version\n")
    assert cpp.build("k", source, "k", "none", flags=("-O3",)) == "module"
    assert seen["name"].startswith("k_avx2_") and "-mavx2" in seen["extra_cflags"]
    assert not any(f.startswith("-march") for f in seen["extra_cflags"])
    first = seen["name"]
    assert cpp.build("k", source, "k", "none", flags=("-O3",), isa="scalar") == "module"
    assert seen["name"].startswith("k_scalar_") and not any(f.startswith("-m") for f in seen["extra_cflags"])
    # another version of the source (another checkout) gets a build of its own instead of replacing this one
    source.write_text("// another version\n")
    cpp.build("k", source, "k", "none", flags=("-O3",))
    assert seen["name"].startswith("k_avx2_") and seen["name"] != first
    source.write_text("// one version\n")
    cpp.build("k", source, "k", "none", flags=("-O3",))
    assert seen["name"] == first
    # the same code in another folder (a second checkout) too: torch's build file names the source's path, so a
    # shared build would be rebuilt whenever the other checkout ran
    (tmp_path / "other").mkdir()
    twin = tmp_path / "other" / "k.cpp"
    twin.write_text("// one version\n")
    cpp.build("k", twin, "k", "none", flags=("-O3",))
    assert seen["name"].startswith("k_avx2_") and seen["name"] != first
    cpp.build("k", source, "k", "none", flags=("-O3",))
    assert seen["name"] == first


def test_the_build_folder_is_torchs(monkeypatch, tmp_path):
    """cpp.build_root finds torch's build folder without importing torch.utils.cpp_extension: the same folder."""
    from pathlib import Path

    from torch.utils import cpp_extension

    from transduce import cpp

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    assert cpp.build_root() == Path(cpp_extension._get_build_directory("x", verbose=False)).parent
    assert cpp.build_root().is_relative_to(tmp_path)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    assert cpp.build_root() == Path(cpp_extension._get_build_directory("x", verbose=False)).parent


def test_a_stamped_build_loads_directly_and_only_then(tmp_path):
    """A build is imported without torch's loader only when its stamp names it and this torch, and it imports."""
    from transduce import cpp

    folder = tmp_path / "k_avx2_1234"
    folder.mkdir()
    assert cpp.load_built(folder, "k_avx2_1234") is None  # never built
    (folder / "k_avx2_1234.so").write_bytes(b"not a library")
    (folder / cpp.STAMP).write_text("k_avx2_1234 torch 0.0.1\n")
    assert cpp.load_built(folder, "k_avx2_1234") is None  # built against another torch
    (folder / cpp.STAMP).write_text(cpp.stamp_of("k_avx2_1234"))
    assert cpp.load_built(folder, "k_avx2_1234") is None  # stamped, but does not import: torch's loader decides


def test_a_built_step_loads_without_torchs_loader():
    """Once built (the tests before built it), the decoder step loads in a new process without importing
    torch.utils.cpp_extension (and setuptools with it) or running ninja."""
    from transduce.backends import native

    if native.extension() is None:
        pytest.skip("no C++ compiler here")
    code = (
        "import sys; from transduce.backends import native; "
        "assert native.extension() is not None; print('torch.utils.cpp_extension' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_every_cpp_source_ships_with_the_package():
    """The kernels compile on the user's machine, from the installed package: every .cpp and .h under
    src/transduce must be in pyproject.toml's package data, or a wheel install cannot build them."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    package = root / "src" / "transduce"
    shipped = set(
        tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["transduce"]
    )
    sources = {p.relative_to(package).as_posix() for p in package.rglob("*") if p.suffix in (".cpp", ".h")}
    assert sources and sources <= shipped, sorted(sources - shipped)
