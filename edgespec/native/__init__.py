"""edgespec's own onnxruntime kernels, built from source on first use.

``q4gemm.cpp`` is the ``edgespec.MatMulQ4`` operator: MatMulNBits' INT4 layout and arithmetic
(int8 activations per block, int32 block dot products), computed so that a row's result does not
depend on how many rows the call has (README, "Exactness"). A bundle rewritten by
``edgespec exact-kernels`` uses it in place of ``com.microsoft.MatMulNBits``; its graphs open only
with this library registered (``library_path()``), which needs a C++ compiler (g++) once and a CPU
with AVX-512 VNNI.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import ProviderError

SOURCE = Path(__file__).with_name("q4gemm.cpp")
FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-mavx512f", "-mavx512bw",
         "-mavx512vl", "-mavx512vnni", "-mfma", "-ffp-contract=off"]
_cached: str | None = None


def cache_dir() -> Path:
    return Path(os.environ.get("EDGESPEC_NATIVE_DIR") or Path.home() / ".cache" / "edgespec" / "native")


def cpu_supported() -> str | None:
    """None where this CPU runs the kernel, else why not."""
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        return "cannot read /proc/cpuinfo to check for AVX-512 VNNI"
    missing = [f for f in ("avx512f", "avx512bw", "avx512_vnni") if f not in flags.split()]
    return f"this CPU lacks {', '.join(missing)}" if missing else None


def library_path() -> str:
    """The built library (compiled once per source version into ``cache_dir()``)."""
    global _cached
    if _cached and os.path.exists(_cached):
        return _cached
    why = cpu_supported()
    if why:
        raise ProviderError(f"edgespec's INT4 kernel (exact-kernels bundles) needs AVX-512 VNNI: {why}")
    src = SOURCE.read_bytes()
    tag = hashlib.sha256(src + " ".join(FLAGS).encode()).hexdigest()[:16]
    out = cache_dir() / f"libedgespec_q4-{tag}.so"
    if not out.exists():
        cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
        if not cxx:
            raise ProviderError("edgespec's INT4 kernel (exact-kernels bundles) is built from source on first use "
                                "and needs a C++ compiler: install g++ (or set CXX)")
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            try:
                r = subprocess.run([cxx, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True,
                                   timeout=300)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise ProviderError(f"building edgespec's INT4 kernel failed: cannot run {cxx} ({e})"[:300]) from None
            if r.returncode != 0:
                last = [ln for ln in r.stderr.splitlines() if "error" in ln] or r.stderr.splitlines() or ["?"]
                raise ProviderError(f"building edgespec's INT4 kernel failed: {last[0][:200]}")
            os.replace(tmp, out)  # atomic: a concurrent build writes the same bytes
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    _cached = str(out)
    return _cached
