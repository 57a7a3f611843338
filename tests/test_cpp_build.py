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
