"""edgespec's own onnxruntime kernels, built from source on first use.

``q4gemm.cpp`` is the ``edgespec.MatMulQ4`` operator: MatMulNBits' INT4 layout and arithmetic
(int8 activations per block, int32 block dot products), computed so that a row's result does not
depend on how many rows the call has (docs/how-it-works.md, "Exactness"), and ``edgespec.DecodeAttention``. A bundle rewritten by
``edgespec exact-kernels`` uses them in place of onnxruntime's ops; its graphs open only
with this library registered (``library_path()``), which needs a C++ compiler (g++) once. On an x86-64 CPU with
AVX2, FMA and F16C it takes its AVX2 path, its AVX-512 VNNI path where the CPU has one, and AMX-INT8 tile
multiplies for calls of 4 rows or more (at block 128; 6 at 64, 8 below) where the CPU has those (the
same numbers, bitwise, on every path). Elsewhere (aarch64: a Jetson's or a Raspberry Pi's CPU; an x86-64 CPU
without AVX2) it takes its portable path (plain C++, since session 43): the AVX2 path's numbers, bit for bit.
"""
from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from ..errors import ProviderError

SOURCE = Path(__file__).with_name("q4gemm.cpp")
TOPP_SOURCE = Path(__file__).with_name("topp.cpp")
# no -m flags: each path carries its own target attribute and is picked at run time
FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off"]
_cached: str | None = None


def cache_dir() -> Path:
    if os.environ.get("EDGESPEC_NATIVE_DIR"):
        return Path(os.environ["EDGESPEC_NATIVE_DIR"])
    try:
        return Path.home() / ".cache" / "edgespec" / "native"
    except RuntimeError:  # (no $HOME and a user without a passwd entry: a container's numeric uid)
        raise ProviderError("edgespec's kernels are built into ~/.cache/edgespec/native, and this user has no home "
                            "directory: set EDGESPEC_NATIVE_DIR (or HOME)") from None


def _cpu_flags() -> set[str] | None:
    """The first CPU's instruction-set flags (x86's ``flags`` line, aarch64's ``Features``); None where
    /proc/cpuinfo cannot be read."""
    try:
        line = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.partition(":")[0].strip().lower() in ("flags", "features")), "")
    except OSError:
        return None
    return set(line.partition(":")[2].split())


# the CPUs the portable path is built and tested for (x86-64's SIMD paths need AVX2, FMA and F16C; without them it
# takes the portable one too)
PORTABLE_MACHINES = ("x86_64", "amd64", "aarch64", "arm64")


def cpu_supported() -> str | None:
    """None where this CPU (and system) runs the kernels, else why not."""
    if platform.machine().lower() not in PORTABLE_MACHINES:
        return (f"this CPU is {platform.machine() or 'of an unknown kind'} (the kernels are built for x86-64 and "
                "aarch64)")
    if not sys.platform.startswith("linux"):  # (macOS says arm64, Windows AMD64: the source needs Linux's headers)
        return f"this system is {sys.platform} (the kernels are built for Linux)"
    return None


Q4_ISA_VALUES = ("avx2", "avx512", "portable")  # what EDGESPEC_Q4_ISA may say (q4gemm.cpp's choose_paths)


def isa() -> str:
    """The kernel path this CPU takes, as the built library reports it (the same function picks the path
    at registration): 'avx2', 'avx512-vnni', 'avx512-vnni+amx' (AMX-INT8 tile multiplies for calls of
    4 rows or more), 'portable' (an x86-64 CPU without AVX2, FMA and F16C), or on aarch64 'portable-sdot' or
    'portable-neon' (its dot products: ARMv8.2's SDOT where the CPU has it, else ARMv8.0's widening multiplies). EDGESPEC_Q4_ISA=avx2 or
    =avx512 stops at that path, =portable takes the portable one. Builds the library if needed (ProviderError
    where it cannot be)."""
    import ctypes

    path = library_path()
    try:
        fn = ctypes.CDLL(path).edgespec_q4_path
    except (OSError, AttributeError) as e:  # (a library the cache holds that does not load)
        raise ProviderError(f"edgespec's INT4 kernel library {path} cannot be loaded ({str(e)[:200]}); delete it to "
                            "build it again") from None
    fn.restype = ctypes.c_char_p
    return fn().decode()


def cheap_rows(path: str) -> bool:
    """Whether the kernel path ``path`` (as ``isa()`` names it) makes a verify call's extra rows cheap: its AVX-512
    paths, VNNI with AMX or not (the decoder verifies alternates by default there), not its AVX2 path."""
    return path.startswith("avx512")


def library_path() -> str:
    """The built library (compiled once per source version into ``cache_dir()``)."""
    global _cached
    forced = os.environ.get("EDGESPEC_Q4_ISA")
    if forced and forced not in Q4_ISA_VALUES:  # (the kernel compares them as written: a typo took the default path)
        raise ProviderError(f"EDGESPEC_Q4_ISA must be avx2, avx512 or portable (or unset), got {forced[:40]!r}")
    if _cached and os.path.exists(_cached):
        return _cached
    why = cpu_supported()
    if why:
        raise ProviderError(f"edgespec's INT4 kernel (exact-kernels bundles) does not run here: {why}")
    _cached = _build(SOURCE, "libedgespec_q4", "edgespec's INT4 kernel (exact-kernels bundles)")
    return _cached


def source_tag(source: Path = SOURCE) -> str:
    """The version of a kernel's source and build flags, and the machine it is built for (what its built library is
    named by: a cache shared by an x86-64 and an aarch64 machine, a home directory on both, keeps one of each)."""
    return hashlib.sha256(source.read_bytes() + " ".join(FLAGS).encode()
                          + platform.machine().lower().encode() + _runtime().encode()).hexdigest()[:16]


def _runtime() -> str:
    """The C library the built library links against, by name and version ("glibc 2.39"): a cache shared by two
    systems (a home directory on both) keeps one for each, where a library built on the newer one would not load
    on the older (its libstdc++ symbols missing)."""
    name, version = platform.libc_ver()
    return f"{name} {version}".strip()


def _digest_path(out: Path) -> Path:
    return out.with_name(out.name + ".sha256")


def _intact(out: Path) -> bool:
    """Whether the cached library ``out`` is the one its build wrote: its bytes' sha256 as recorded beside it (a file
    cut short by a crash, or emptied, is built again: loaded, a short one was a bus error, the process gone). A
    library built before the digest was recorded (session 46) is taken where it is a whole ELF file, its digest
    recorded where the folder takes it (a read-only cache an older edgespec built stays usable)."""
    try:
        with open(out, "rb") as f:
            data = f.read()
    except OSError:
        return False
    digest = hashlib.sha256(data).hexdigest()
    try:
        return _digest_path(out).read_text().strip() == digest
    except UnicodeDecodeError:
        return False
    except OSError:  # no digest: an older build's
        if not _whole_elf(data):
            return False
        try:
            _digest_path(out).write_text(digest + "\n")
        except OSError:
            pass
        return True


def _whole_elf(data: bytes) -> bool:
    """Whether ``data`` is a 64-bit little-endian ELF file that holds all of its section headers (gcc writes them
    last: a file cut short lacks them)."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return False
    shoff = int.from_bytes(data[0x28:0x30], "little")
    size, count = int.from_bytes(data[0x3A:0x3C], "little"), int.from_bytes(data[0x3C:0x3E], "little")
    return 0 < shoff and shoff + size * count <= len(data)


def _build(source: Path, stem: str, what: str) -> str:
    """``source`` compiled once per source version into ``cache_dir()`` (again where the file there is not intact:
    ``_intact``); ProviderError if it cannot be."""
    tag = source_tag(source)
    out = cache_dir() / f"{stem}-{tag}.so"
    if not _intact(out):
        try:
            cxx = shlex.split(os.environ.get("CXX") or "")
        except ValueError as e:  # (an unbalanced quote)
            raise ProviderError(f"CXX {os.environ['CXX']!r} is no command line: {e}"[:300]) from None
        cxx = cxx or [c for c in (shutil.which("g++") or shutil.which("c++"),) if c]
        if not cxx:
            raise ProviderError(f"{what} is built from source on first use and needs a C++ compiler: "
                                f"install g++ (or set CXX)")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out.parent)
        except OSError as e:
            where = "$EDGESPEC_NATIVE_DIR" if os.environ.get("EDGESPEC_NATIVE_DIR") else "the kernel cache"
            why = "not a directory" if out.parent.exists() and not out.parent.is_dir() else (e.strerror or str(e))
            raise ProviderError(f"{what} is built on first use into {where} ({out.parent}), which cannot be "
                                f"written: {why}"[:300]) from None
        os.close(fd)
        try:
            try:
                r = subprocess.run([*cxx, *FLAGS, "-o", tmp, str(source)], capture_output=True, text=True,
                                   timeout=300)
            except (OSError, subprocess.TimeoutExpired) as e:  # (CXX="ccache g++": a command line, as make takes it)
                raise ProviderError(f"building {what} failed: cannot run {shlex.join(cxx)} ({e})"[:300]) from None
            if r.returncode != 0:
                said = [ln for ln in r.stderr.splitlines() if "error" in ln] or [
                    ln for ln in r.stderr.splitlines() + r.stdout.splitlines() if ln.strip()]
                why = said[0][:200] if said else (f"{shlex.join(cxx)} exited with status {r.returncode} and said "
                                                  "nothing")[:250]
                raise ProviderError(f"building {what} failed: {why}")
            with open(tmp, "rb+") as f:  # (on the disk before it is renamed: a crash leaves the old name or all of it)
                digest = hashlib.sha256(f.read()).hexdigest()
                os.fsync(f.fileno())
            os.replace(tmp, out)  # atomic: a concurrent build writes the same bytes
            _digest_path(out).write_text(digest + "\n")
        except OSError as e:
            raise ProviderError(f"{what} is built on first use into {out.parent}, which cannot be written: "
                                f"{e.strerror or e}"[:300]) from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return str(out)


_top_p: list = []  # [the loaded es_top_p, or None where it cannot be built], once per process
_top_p_lock = threading.Lock()


def top_p_kernel():
    """``topp.cpp``'s ``es_top_p`` through ctypes, built on first use; None where it cannot be
    (no compiler, a failed build, ``EDGESPEC_NATIVE_SAMPLING=0``): sampling then stays in numpy,
    with the same result."""
    if _top_p:
        return _top_p[0]
    with _top_p_lock:  # the server's threads may ask at once: one build, one load
        if not _top_p:
            _top_p.append(_load_top_p())
    return _top_p[0]


def _load_top_p():
    if os.environ.get("EDGESPEC_NATIVE_SAMPLING", "1") == "0":
        return None
    try:
        import ctypes

        lib = ctypes.CDLL(_build(TOPP_SOURCE, "libedgespec_topp", "edgespec's top-p kernel"))
        fn = lib.es_top_p
    except (ProviderError, OSError, AttributeError) as e:
        import logging

        logging.getLogger("edgespec").info("top-p sampling stays in numpy: %s", e)
        return None
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_double, ctypes.c_void_p,
                   ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return fn
