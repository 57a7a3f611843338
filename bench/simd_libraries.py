"""``make bench-simd``: the int8 step's exp and GELU (vecmath.h) against Google Highway and SLEEF.

    python bench/simd_libraries.py --repeats 3

Builds bench/simd_libraries.cpp for AVX2 + FMA (the level every x86-64 user of the fast path has; the
flags of the step's own build, -O3 -ffp-contract=off), against Debian's libhwy-dev and libsleef-dev
(``apt-get install libhwy-dev libsleef-dev``), runs it ``--repeats`` times and prints, per function and
input range, each implementation's median nanoseconds per element, its time as a ratio to vecmath.h's
(higher: slower) and its largest relative error against the float64 function. Then it builds
bench/highway_exp_bits.cpp for Highway's AVX2 target and for its scalar target and counts the inputs on
which Highway's exp differs between the two (vecmath.h returns the same bits on every level).
"""

from __future__ import annotations

import argparse
import array
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import machine

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "simd_libraries.cpp"
VECMATH = HERE.parent / "src" / "transduce" / "backends"
HEADERS = {"libhwy-dev": "/usr/include/hwy/highway.h", "libsleef-dev": "sleef.h"}


# Highway's AVX2 target also needs the extensions every AVX2 CPU has (BMI2, F16C, AES, PCLMUL, SSE4.2):
# without them it builds its SSSE3 target, 4 lanes wide.
AVX2 = ["-mavx2", "-mfma", "-mbmi", "-mbmi2", "-mf16c", "-mlzcnt", "-maes", "-mpclmul", "-msse4.2", "-mpopcnt"]


def build(source: Path, binary: Path, flags: list[str]) -> Path:
    compiler = shutil.which("g++")
    if compiler is None:
        sys.exit("g++ not found: install build-essential")
    command = [compiler, "-O3", "-ffp-contract=off", "-std=c++17", f"-I{VECMATH}", *flags, str(source)]
    done = subprocess.run([*command, "-lsleef", "-o", str(binary)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(
            f"building {source.name} failed (needs {', '.join(HEADERS)}: "
            f"apt-get install {' '.join(HEADERS)}):\n{done.stderr[-2000:]}"
        )
    return binary


def highway_levels_differ(tmp: Path) -> tuple[int, int]:
    """(inputs where Highway's exp differs between its AVX2 and scalar targets, inputs)."""
    source = HERE / "highway_exp_bits.cpp"
    outputs = []
    for name, flags in (("avx2", AVX2), ("scalar", ["-DHWY_COMPILE_ONLY_SCALAR"])):
        binary = build(source, tmp / f"exp_bits_{name}", flags)
        subprocess.run([str(binary), str(tmp / f"exp_{name}.f32")], capture_output=True, check=True)
        outputs.append(array.array("f", (tmp / f"exp_{name}.f32").read_bytes()))
    return sum(a != b for a, b in zip(*outputs)), len(outputs[0])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="runs of the whole benchmark; medians are reported")
    args = p.parse_args()
    if platform.machine() not in ("x86_64", "AMD64"):
        sys.exit(f"this benchmark is for x86-64 (AVX2 + FMA), not {platform.machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        binary = build(SOURCE, Path(tmp) / "simd_libraries", AVX2)
        differ, points = highway_levels_differ(Path(tmp))
        runs = []
        for _ in range(args.repeats):
            text = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
            runs.append([json.loads(line) for line in text.splitlines()])
    print(f"`python bench/simd_libraries.py --repeats {args.repeats}` on {machine()}, 1 thread, fp32, AVX2 + FMA\n")
    print("| function | inputs | implementation | ns / element | time ÷ vecmath | max relative error |")
    print("|---|---|---|---|---|---|")
    for i, case in enumerate(runs[0]):
        ns = statistics.median(run[i]["ns_per_element"] for run in runs)
        ours = next(
            statistics.median(run[j]["ns_per_element"] for run in runs)
            for j, other in enumerate(runs[0])
            if other["function"] == case["function"]
            and other["range"] == case["range"]
            and other["implementation"] == "vecmath"
        )
        lo, hi = case["range"]
        print(
            f"| {case['function']} | [{lo:g}, {hi:g}] | {case['implementation']} | {ns:.2f} | "
            f"{ns / ours:.2f} | {case['max_rel_error']:.1e} |"
        )
    print(
        f"\nHighway's exp, its AVX2 target against its scalar target: {differ:,} of {points:,} inputs in "
        f"[-87, 0] give different bits ({100 * differ / points:.2f}%)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
