"""The training commands re-run themselves with jemalloc preloaded (allocator.py), and say which allocator runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO, write_config

from transduce.allocator import MALLOC_CONF, choose, find_jemalloc, preload_environment


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


def test_jemalloc_is_chosen_wherever_it_is_found_unless_turned_off(tmp_path):
    named = tmp_path / "libjemalloc.so.2"
    named.write_bytes(b"")
    assert choose({"TRANSDUCE_JEMALLOC": str(named)}) == (named, "")
    assert choose({"TRANSDUCE_JEMALLOC": "0"}) == (None, "TRANSDUCE_JEMALLOC=0")
    library, why = choose({})
    assert library == find_jemalloc({})  # the venv's or the system's, where there is one
    assert (why == "") == (library is not None)
    if library is None:
        assert "no libjemalloc.so.2 found" in why and "TRANSDUCE_JEMALLOC=/path" in why


def test_the_preloaded_jemalloc_keeps_freed_pages_unless_the_environment_sets_its_own_options(tmp_path):
    library = tmp_path / "libjemalloc.so.2"
    env = preload_environment(library, {"LD_PRELOAD": "/other.so", "PATH": "/bin"})
    assert env["LD_PRELOAD"] == f"{library}:/other.so" and env["PATH"] == "/bin"
    assert env["MALLOC_CONF"] == MALLOC_CONF == "dirty_decay_ms:1000,muzzy_decay_ms:-1,oversize_threshold:0"
    assert env["TRANSDUCE_JEMALLOC_TRIED"] == "1"
    own = preload_environment(library, {"MALLOC_CONF": "narenas:1"})
    assert own["MALLOC_CONF"] == "narenas:1" and own["LD_PRELOAD"] == str(library)


FAULTS = """
import resource, torch
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.ones(4 << 20).sum()  # 16 MB, over jemalloc's 8 MiB oversize threshold
before = faults()
for _ in range(20):
    torch.ones(4 << 20).sum()  # freed at once, allocated again
print(faults() - before)
"""


def test_the_preloaded_jemalloc_reuses_large_freed_blocks_without_faulting_their_pages_in_again():
    found = find_jemalloc({})
    if found is None:
        pytest.skip("no libjemalloc.so.2 here (`make setup` fetches one on Debian-like systems)")

    def faults(conf: str) -> int:
        env = {**os.environ, "LD_PRELOAD": str(found), "MALLOC_CONF": conf}
        done = subprocess.run([sys.executable, "-c", FAULTS], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.split()[-1])

    pages = 20 * (16 << 20) // 4096  # what 20 fresh 16 MB blocks fault in
    assert faults(MALLOC_CONF) < pages // 10
    assert faults("dirty_decay_ms:1000,muzzy_decay_ms:-1") > pages // 2  # jemalloc's own oversize arena: all of it


@pytest.mark.slow
def test_training_runs_under_jemalloc_when_found_and_without_it_when_told(data_dir, tmp_path):
    found = find_jemalloc({})
    if found is None:
        pytest.skip("no libjemalloc.so.2 here (`make setup` fetches one on Debian-like systems)")
    default = _train(write_config(tmp_path / "d.toml", data_dir, tmp_path / "d", max_steps=2))
    assert f"allocator=jemalloc (preloaded, MALLOC_CONF='{MALLOC_CONF}')" in default
    config = write_config(tmp_path / "a.toml", data_dir, tmp_path / "a", max_steps=2)
    out = _train(config, TRANSDUCE_JEMALLOC=str(found), MALLOC_CONF="narenas:2")  # named, with its own options
    assert "allocator=jemalloc (preloaded, MALLOC_CONF='narenas:2')" in out
    off = _train(write_config(tmp_path / "b.toml", data_dir, tmp_path / "b", max_steps=2), TRANSDUCE_JEMALLOC="0")
    assert "allocator=malloc (TRANSDUCE_JEMALLOC=0)" in off


@pytest.mark.slow
def test_a_library_that_cannot_be_preloaded_is_tried_once_and_training_goes_on(data_dir, tmp_path):
    fake = tmp_path / "libjemalloc.so.2"
    fake.write_text("not a shared library\n")
    out = _train(write_config(tmp_path / "c.toml", data_dir, tmp_path / "c", max_steps=2), TRANSDUCE_JEMALLOC=str(fake))
    assert f"allocator=malloc ({fake} could not be preloaded)" in out and "step 2/2" in out
