"""The training commands re-run themselves with jemalloc preloaded (allocator.py), and say which allocator runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO, write_config

from transduce.allocator import MALLOC_CONF, choose, find_jemalloc, native_bf16_cpu, preload_environment

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"
AMX = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
ZEN4 = "flags\t\t: fpu avx2 avx512f avx512_bf16\n"


def _train(config, **env):
    full = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRANSDUCE_JEMALLOC") and k != "MALLOC_CONF"},
        "PYTHONPATH": str(REPO / "src"),
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-m", "transduce", "train", str(config)], env=full, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_find_jemalloc_honours_the_variable_and_names_a_missing_file(tmp_path):
    assert find_jemalloc({"TRANSDUCE_JEMALLOC": "0"}) is None
    with pytest.raises(FileNotFoundError, match="TRANSDUCE_JEMALLOC=.*nothing.so"):
        find_jemalloc({"TRANSDUCE_JEMALLOC": str(tmp_path / "nothing.so")})
    named = tmp_path / "libjemalloc.so.2"
    named.write_bytes(b"")
    assert find_jemalloc({"TRANSDUCE_JEMALLOC": str(named)}) == named


def test_jemalloc_is_chosen_only_on_cpus_with_native_bf16_unless_named(tmp_path):
    assert not native_bf16_cpu(AVX2) and native_bf16_cpu(AMX) and native_bf16_cpu(ZEN4)
    assert not native_bf16_cpu("")
    named = tmp_path / "libjemalloc.so.2"
    named.write_bytes(b"")
    library, why = choose({}, AVX2)
    assert library is None and "no native bf16" in why and "TRANSDUCE_JEMALLOC=" in why
    assert choose({"TRANSDUCE_JEMALLOC": str(named)}, AVX2)[0] == named  # a named library: on any CPU
    assert choose({"TRANSDUCE_JEMALLOC": "0"}, AMX) == (None, "TRANSDUCE_JEMALLOC=0")
    assert choose({}, AMX)[0] == find_jemalloc({})  # bf16 CPU: the venv's or the system's, where there is one


def test_the_preloaded_jemalloc_keeps_freed_pages_unless_the_environment_sets_its_own_options(tmp_path):
    library = tmp_path / "libjemalloc.so.2"
    env = preload_environment(library, {"LD_PRELOAD": "/other.so", "PATH": "/bin"})
    assert env["LD_PRELOAD"] == f"{library}:/other.so" and env["PATH"] == "/bin"
    assert env["MALLOC_CONF"] == MALLOC_CONF == "dirty_decay_ms:1000,muzzy_decay_ms:-1"
    assert env["TRANSDUCE_JEMALLOC_TRIED"] == "1"
    own = preload_environment(library, {"MALLOC_CONF": "narenas:1"})
    assert own["MALLOC_CONF"] == "narenas:1" and own["LD_PRELOAD"] == str(library)


@pytest.mark.slow
def test_training_runs_under_jemalloc_where_it_is_chosen_and_without_it_when_told(data_dir, tmp_path):
    found = find_jemalloc({})
    if found is None:
        pytest.skip("no libjemalloc.so.2 here (`make setup` fetches one on Debian-like systems)")
    default = _train(write_config(tmp_path / "d.toml", data_dir, tmp_path / "d", max_steps=2))
    if native_bf16_cpu():
        assert "allocator=jemalloc" in default
    else:
        assert "allocator=malloc (the CPU has no native bf16" in default
    config = write_config(tmp_path / "a.toml", data_dir, tmp_path / "a", max_steps=2)
    out = _train(config, TRANSDUCE_JEMALLOC=str(found))  # named: preloaded on any CPU
    assert f"allocator=jemalloc (preloaded, MALLOC_CONF='{MALLOC_CONF}')" in out
    if native_bf16_cpu():  # where the default preloads it, TRANSDUCE_JEMALLOC=0 turns it off (elsewhere the
        # default run above is already malloc; test_jemalloc_is_chosen_only_on_cpus_with_native_bf16_unless_named
        # checks the variable's decision)
        off = _train(write_config(tmp_path / "b.toml", data_dir, tmp_path / "b", max_steps=2), TRANSDUCE_JEMALLOC="0")
        assert "allocator=malloc (TRANSDUCE_JEMALLOC=0)" in off


@pytest.mark.slow
def test_a_library_that_cannot_be_preloaded_is_tried_once_and_training_goes_on(data_dir, tmp_path):
    fake = tmp_path / "libjemalloc.so.2"
    fake.write_text("not a shared library\n")
    out = _train(write_config(tmp_path / "c.toml", data_dir, tmp_path / "c", max_steps=2), TRANSDUCE_JEMALLOC=str(fake))
    assert f"allocator=malloc ({fake} could not be preloaded)" in out and "step 2/2" in out
