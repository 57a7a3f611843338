"""Every SIMD level of the C++ decoder step that this CPU can run, each built on its own (cpp.py).

``scalar`` runs everywhere; ``avx2``, ``avx512`` and ``avx512vnni`` run where the CPU has them, each forced
below the CPU's best as well. Each level is checked against exact references (float64), and every level
against ``scalar`` bit for bit: vecmath.h's functions, the int8 and fp32 GEMMs, and whole beam searches of
the loop step with int8 and with fp32 maps. On a
CPU without AVX-512, ``avx512vnni-simde`` runs the AVX-512 and VNNI code anyway, each intrinsic replaced by
SIMDe's portable implementation (tests/cpp/simde/levels.h), against the same checks. The summary of
``make test`` names the levels that ran (conftest.py).
"""

from __future__ import annotations

import functools
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from transduce import cpp
from transduce.backends import native
from transduce.decode.search import beam_search
from transduce.model import ModelConfig, Transformer

LEVELS = [isa.name for isa in cpp.runnable_isas()]
SIMDE = Path(__file__).with_name("cpp") / "simde" / "levels.h"
# The AVX-512 + VNNI code on a CPU without it: vecmath.h's AVX-512 functions and the VNNI GEMM (the avx512
# level's other half, the AVX2 GEMM, runs natively as avx2).
EMULATED = ["avx512vnni-simde"] if cpp.X86 and "avx512vnni" not in LEVELS else []
SIMD = [name for name in LEVELS if name != "scalar"] + EMULATED
LENGTHS = (1, 7, 15, 16, 17, 31, 32, 33, 300, 8000)  # every tail of 8- and 16-lane loops


def ext(level: str):
    built = _simde_extension() if level.endswith("-simde") else native.extension(level)
    assert built is not None, f"the {level} build failed (see the warning)"
    return built


@functools.cache
def _simde_extension():
    """The decoder step built as for avx512vnni, its intrinsics SIMDe's (Debian's libsimde-dev), at -O1 (after
    the step's -O3): without -ffast-math and with -ffp-contract=off the optimisation level does not change one
    result, and the emulated build compiles in ~40 s instead of ~75 s (its tests run as fast)."""
    if not Path("/usr/include/simde/x86/avx512.h").exists():
        pytest.skip("needs SIMDe (Debian's libsimde-dev; .ci/run installs it)")
    flags = ("-include", str(SIMDE), "-DSIMDE_NO_NATIVE", "-DTRANSDUCE_EMULATE_VNNI", "-O1")
    return native.extension(cpp.Isa("avx512vnni_simde", flags=flags, includes=(SIMDE,)))


def _rows(n: int, seed: int, scale: float = 6.0) -> torch.Tensor:
    x = torch.randn(3, n, generator=torch.Generator().manual_seed(seed)) * scale
    x[1, : n // 2] = float("-inf")  # masked entries
    return x


@pytest.mark.slow
@pytest.mark.parametrize("level", LEVELS + EMULATED)
def test_each_level_reports_itself(level):
    e, level = ext(level), level.removesuffix("-simde")
    assert e.vec_level() == ("avx512" if level.startswith("avx512") else level)
    assert e.has_vnni() == (level == "avx512vnni")
    assert e.has_avx2_kernel() == (level in ("avx2", "avx512"))


@pytest.mark.parametrize("level", LEVELS)
def test_functions_match_float64_references(level):
    """GELU within 5e-7 relative everywhere (its negative tail too, where 1 + erf cancels), Swish within
    5e-7, exp within 2e-7 (0 below -87), log Σ exp and sums to fp32 rounding."""
    e = ext(level)
    x = torch.cat([torch.linspace(-14, 14, 28001), torch.tensor([0.0, -0.0, 1e-30, -1e-30, -4.9, 30.0, -30.0])])
    x64 = x.double()
    gelu = x64 * 0.5 * torch.erfc(-x64 / math.sqrt(2))
    assert torch.allclose(e.vec_map(x, "gelu").double(), gelu, rtol=5e-7, atol=1e-37)
    assert torch.allclose(e.vec_map(x, "swish").double(), x64 * torch.sigmoid(x64), rtol=5e-7, atol=1e-37)
    v = torch.linspace(-87, 88, 50001)
    assert torch.allclose(e.vec_map(v, "exp").double(), v.double().exp(), rtol=2e-7, atol=0)
    assert torch.equal(e.vec_map(torch.tensor([-87.5, -1e4, float("-inf")]), "exp"), torch.zeros(3))
    for n in LENGTHS:
        x = _rows(n, n)
        want = torch.logsumexp(x.double(), -1)
        assert torch.allclose(e.vec_reduce(x, "logsumexp").double(), want, atol=1e-5, rtol=1e-6), n
        finite = torch.randn(3, n, generator=torch.Generator().manual_seed(n))
        for name, ref in (("sum", finite.double().sum(-1)), ("dot", (finite.double() ** 2).sum(-1))):
            assert torch.allclose(e.vec_reduce(finite, name).double(), ref, atol=1e-4, rtol=1e-5), (name, n)
    assert e.vec_reduce(torch.full((1, 9), float("-inf")), "logsumexp").item() == float("-inf")


@pytest.mark.parametrize("level", SIMD or [pytest.param("none", marks=pytest.mark.skip(reason="no SIMD level"))])
def test_simd_levels_equal_scalar_bit_for_bit(level):
    """One numerics: each vector level returns the scalar path's bits for every function and length."""
    fast, scalar = ext(level), ext("scalar")
    x = torch.cat([torch.linspace(-14, 14, 28001), torch.randn(4099, generator=torch.Generator().manual_seed(1)) * 3])
    for name in ("exp", "gelu", "swish"):
        assert torch.equal(fast.vec_map(x, name), scalar.vec_map(x, name)), name
    for n in LENGTHS:
        x = _rows(n, n)
        finite = torch.randn(3, n, generator=torch.Generator().manual_seed(n))
        assert torch.equal(fast.vec_reduce(x, "logsumexp"), scalar.vec_reduce(x, "logsumexp")), n
        for name in ("sum", "sum_squares", "dot"):
            assert torch.equal(fast.vec_reduce(finite, name), scalar.vec_reduce(finite, name)), (name, n)
    g = torch.Generator().manual_seed(2)
    for M, K, N in ((1, 5, 3), (4, 128, 384), (37, 64, 100)):
        x, w, b = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g) * 0.1, torch.randn(N, generator=g)
        assert torch.equal(fast.int8_linear(x, w, b, False), scalar.int8_linear(x, w, b, False)), (M, K, N)
        assert torch.equal(fast.Linear.fp32(w, b)(x), scalar.Linear.fp32(w, b)(x)), (M, K, N)


def _random_model(**overrides) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("tiny", vocab_size=300, dropout=0.0, **overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():  # far from initialisation: sharp, varied distributions
            p.normal_(0.0, 0.3)
    return model


@pytest.mark.parametrize("level", SIMD or [pytest.param("none", marks=pytest.mark.skip(reason="no SIMD level"))])
@pytest.mark.parametrize("maps, activation", [("int8", "relu"), ("int8", "gelu"), ("int8", "swish"), ("fp32", "gelu")])
def test_loop_beam_search_is_the_same_on_every_level(level, maps, activation):
    """Whole beam searches of the loop step, int8 and fp32 (tokens, log-probabilities, scores), are identical
    on every level."""
    model = _random_model(activation=activation, norm="pre" if activation == "swish" else "post")
    src = torch.randint(4, 300, (5, 11), generator=torch.Generator().manual_seed(3))
    src[:, -1] = 3
    src[1, 6], src[1, 7:] = 3, 0  # a short sentence, right-padded
    runs = {}
    for name in ("scalar", level):
        step = native.NativeStep(model, ext(name), maps)
        runs[name] = [[(h.tokens, h.logprob, h.score) for h in hs] for hs in beam_search(step, src, beam=4, nbest=4)]
    assert runs[level] == runs["scalar"]


def _compile_flags() -> list[str]:
    import sysconfig

    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    return ["-std=c++20", "-fopenmp", "-ffp-contract=off", *includes, "-DTORCH_EXTENSION_NAME=transduce_check"]


@pytest.mark.slow
@pytest.mark.skipif(not cpp.X86 or shutil.which("c++") is None, reason="x86-64 levels, with a C++ compiler")
def test_levels_this_cpu_lacks_still_compile():
    """The AVX-512 and VNNI code cannot run on a CPU without them, but it must still compile: each level the
    CPU lacks goes through the compiler's checks (types, intrinsics, templates) without code generation."""
    lacking = [isa for isa in cpp.ISAS if isa.name not in LEVELS]
    if not lacking:
        pytest.skip("this CPU runs every level: each is built and run by the tests above")
    for isa in lacking:
        cmd = ["c++", "-fsyntax-only", *_compile_flags(), *isa.flags, str(native.SOURCE)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, (isa.name, done.stderr[-3000:])


CROSS = "aarch64-linux-gnu-g++"


@pytest.mark.slow
def test_the_cpp_step_compiles_for_aarch64(tmp_path):
    """The decoder step's C++ compiles for ARM (Graviton, Apple silicon under Linux) with Debian's cross
    compiler: the scalar level, the one ARM runs."""
    if shutil.which(CROSS) is None:
        pytest.skip(f"no {CROSS} (Debian's g++-aarch64-linux-gnu; .ci/run installs it)")
    obj = tmp_path / "native_step.o"
    cmd = [CROSS, "-O0", "-fPIC", *_compile_flags(), "-c", str(native.SOURCE), "-o", str(obj)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    arch = subprocess.run(["file", str(obj)], capture_output=True, text=True).stdout if shutil.which("file") else ""
    assert not arch or "aarch64" in arch or "ARM" in arch, arch
    assert Path(obj).stat().st_size > 0


QEMU = "qemu-aarch64"
PROBE = Path(__file__).with_name("cpp") / "vecmath_probe.cpp"


def _probe(compiler: str, out: Path, *flags: str) -> Path:
    """tests/cpp/vecmath_probe.cpp built by ``compiler`` with the decoder step's numerics flags."""
    cmd = [compiler, *native.NUMERICS_FLAGS, "-std=c++20", f"-I{native.SOURCE.parent}", *flags, str(PROBE), "-o"]
    done = subprocess.run([*cmd, str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_aarch64_computes_the_same_bits_under_emulation(tmp_path):
    """vecmath.h built for ARM and run under qemu-user returns this CPU's bits for every function and length,
    and so does each SIMD level this CPU runs: one numerics on x86 and ARM. The probe's host build is tied
    to the decoder step: its exp, GELU and Swish equal the scalar extension's."""
    if shutil.which(CROSS) is None or shutil.which(QEMU) is None:
        pytest.skip(f"needs {CROSS} and {QEMU} (Debian's g++-aarch64-linux-gnu and qemu-user; .ci/run installs both)")
    g = torch.Generator().manual_seed(1)
    extremes = torch.tensor([0.0, -0.0, 1e-30, -1e-30, -87.5, 88.0, 30.0, -30.0, -4.9])
    x = torch.cat([torch.linspace(-14, 14, 28001), torch.randn(4099, generator=g) * 3, extremes])
    (tmp_path / "in.bin").write_bytes(x.numpy().tobytes())

    def run(program: list[str], name: str) -> bytes:
        done = subprocess.run([*program, str(tmp_path / "in.bin"), str(tmp_path / name)], capture_output=True)
        assert done.returncode == 0, done.stderr[-3000:]
        return (tmp_path / name).read_bytes()

    host = run([str(_probe("c++", tmp_path / "host"))], "host.out")
    arm = run([QEMU, str(_probe(CROSS, tmp_path / "arm", "-static"))], "arm.out")
    assert len(arm) == len(host) > 12 * x.numel()
    diff = torch.frombuffer(bytearray(arm), dtype=torch.int32) != torch.frombuffer(bytearray(host), dtype=torch.int32)
    assert not diff.any(), f"{int(diff.sum())} of {diff.numel()} results differ on aarch64"
    for isa in cpp.runnable_isas()[1:] if cpp.X86 else ():
        assert run([str(_probe("c++", tmp_path / isa.name, *isa.flags))], f"{isa.name}.out") == host, isa.name
    n = x.numel()
    maps = torch.frombuffer(bytearray(host[: 3 * 4 * n]), dtype=torch.float32).view(3, n)
    for row, name in zip(maps, ("exp", "gelu", "swish")):
        assert torch.equal(ext("scalar").vec_map(x, name), row), name
