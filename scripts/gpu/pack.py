#!/usr/bin/env python3
"""Carry files to a GPU machine that has no network, in transfers of limited size.

The machine this plans for (docs/gpu.md) takes files only as copies of the working tree plus
named ignored folders, at most 64 MiB per transfer. Everything it lacks (the onnxruntime-gpu and
onnxruntime-genai wheels, gguf, SmolLM2's weights, the Qwen tokenizer) goes as one byte stream:
the files one after the other, smallest first, cut into batches of at most ``--batch-mib``, one batch per
transfer. Each batch carries the whole manifest (every file's offset, size and sha256, every
part's sha256), so the far side knows at any point what it has and what is complete.

Here (a connected machine):

    python scripts/gpu/pack.py pack --tokenizer bundles/qwen-coder-b128/tokenizer --out .gpu
        # -> .gpu/b1 ... .gpu/bN, each one transfer: by default 64 MiB less the working tree (which every
        # call carries too: 5.7 MiB in session 54) less 2 MiB for it to grow; --batch-mib sets it, refused
        # where it and the tree come to more than 64 MiB

    python scripts/gpu/pack.py pack --tokenizer bundles/qwen-coder-b128/tokenizer --xz --keep-arch 90 --out .gpu
        # (session 54) 3 transfers instead of 7: the wheels' trees xz-compressed (builder.tar.xz: genai, gguf,
        # starlette and uvicorn (edgespec serve) and the tokenizer; ortgpu.tar.xz: onnxruntime-gpu, which serves
        # genai's builder too, so the CPU onnxruntime wheel stays here; SmolLM2's GGUF as its .tar.xz), and with
        # --keep-arch 90 the GPU code of every other architecture in onnxruntime's CUDA library zeroed (an H100/H200
        # runs sm_90's: 244 -> 66.5 MiB); a pack made with --xz alone (194 MiB of onnxruntime-gpu) is the fallback
        # where the stripped library fails scripts/gpu/smoke_cuda.py

There, one batch per call (the batch folder arrives in the working tree):

    python3 scripts/gpu/pack.py stash .gpu/b3 --stage /tmp/edgespec-gpu/parts
    python3 scripts/gpu/pack.py join --stage /tmp/edgespec-gpu/parts --out /tmp/edgespec-gpu/files \
        [--only '*.whl']
    python3 scripts/gpu/pack.py unpack /tmp/edgespec-gpu/files/ortgpu.tar.xz --site SITE --files FILES

``stash`` exits 7 where a batch before this one is not in the stage (the machine was given back
between two calls, and this is a fresh one: start again from b1). ``join`` writes each file whose
bytes have all arrived and whose sha256 matches, and says what is still missing; it exits 3 when a
file asked for (``--only``) is incomplete and 4 when a part or a file does not match its sha256
(nothing corrupt is left behind). ``unpack`` writes a ``.tar.xz``'s wheel trees into SITE (as ``pip
install --target`` lays them out) and its ``files/`` into FILES. Only the standard library is
used: it runs on any Python 3.9+.
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

MiB = 1 << 20
MANIFEST = "MANIFEST.json"
# What the GPU run needs that its machine does not have (KINDS.md in the device library: it has
# torch, transformers, onnx and onnxruntime 1.30 CPU, no onnxruntime-gpu, genai or gguf).
# onnxruntime (CPU) 1.31.1 too: genai 0.18 needs onnxruntime >= 1.31, and with it in the first batch
# the export (install.sh's builder site) starts while onnxruntime-gpu is still travelling; starlette and uvicorn
# (session 75): edgespec serve, for bench.py's serve section (their own needs, anyio, click and h11, are there)
WHEELS = ("onnxruntime-gpu==1.31.1", "onnxruntime-genai==0.18.0", "gguf==0.19.0", "onnxruntime==1.31.1",
          "starlette==1.10.0", "uvicorn==0.55.0")
PLATFORM_ARGS = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                 "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
                 "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
# What one call to the GPU machine carries: the working tree (tracked files and untracked ones git does not
# ignore) and the carried folders together (the device library's README); the default batch leaves the tree
# and TREE_MARGIN_MIB for it to grow. (60 MiB batches were the default until session 54, when the tree had grown
# to 5.7 MiB: every full batch was over the limit.)
CALL_MIB = 64
TREE_MARGIN_MIB = 2
FATBIN_MAGIC = 0xBA55ED50  # a CUDA fat binary's container in a library's .nv_fatbin section


class PackError(Exception):
    exit_code = 2


class Incomplete(PackError):
    exit_code = 3


class Corrupt(PackError):
    exit_code = 4


class FreshMachine(PackError):
    exit_code = 7


def sha256(path: Path, start: int = 0, size: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = os.path.getsize(path) - start if size is None else size
        while left > 0:
            b = f.read(min(left, 8 * MiB))
            if not b:
                break
            h.update(b)
            left -= len(b)
    return h.hexdigest()


# -- here: build the batches -----------------------------------------------------------------------
def download_wheels(dest: Path, specs=WHEELS) -> list[Path]:
    """pip download (no dependencies: the GPU machine has them) for CPython 3.12 on x86-64 Linux."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM_ARGS, "-d", str(dest), *specs]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise PackError(f"pip download failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    out = []
    for spec in specs:
        name = spec.split("==")[0].replace("-", "_")
        found = sorted(dest.glob(f"{name}-{spec.split('==')[1]}-*.whl")) if "==" in spec else []
        if not found:
            raise PackError(f"pip download left no wheel for {spec} in {dest}")
        out.append(found[-1])
    return out


def pack(files: list[tuple[str, Path]], out: Path, batch_bytes: int) -> list[Path]:
    """Cut the files, in order, into batches of at most ``batch_bytes``: ``out/b1``.. each holding
    its part and the manifest. Returns the batch folders."""
    if batch_bytes < 1:
        raise PackError("the batch size must be positive")
    names = [n for n, _ in files]
    if len(set(names)) != len(names):
        raise PackError(f"two files share a name: {sorted(n for n in names if names.count(n) > 1)}")
    entries, offset = [], 0
    for name, path in files:
        if not path.is_file():
            raise PackError(f"{path} is not a file")
        size = path.stat().st_size
        entries.append({"name": name, "offset": offset, "size": size, "sha256": sha256(path)})
        offset += size
    total = offset
    nparts = max(1, -(-total // batch_bytes))
    if out.exists():
        for old in out.glob("b*"):
            if old.is_dir() and old.name[1:].isdigit():
                shutil.rmtree(old)
    out.mkdir(parents=True, exist_ok=True)
    parts, batches = [], []
    for i in range(nparts):
        start, end = i * batch_bytes, min(total, (i + 1) * batch_bytes)
        d = out / f"b{i + 1}"
        d.mkdir()
        part = d / f"part{i + 1:03d}.bin"
        with open(part, "wb") as w:
            for e, (_, path) in zip(entries, files):
                lo, hi = max(start, e["offset"]), min(end, e["offset"] + e["size"])
                if lo >= hi:
                    continue
                with open(path, "rb") as f:
                    f.seek(lo - e["offset"])
                    left = hi - lo
                    while left:
                        b = f.read(min(left, 8 * MiB))
                        if not b:
                            raise PackError(f"{path} changed while it was packed (shorter than hashed)")
                        w.write(b)
                        left -= len(b)
        parts.append({"name": part.name, "offset": start, "size": end - start, "sha256": sha256(part)})
        batches.append(d)
    manifest = {"total": total, "files": entries, "parts": parts}
    for d in batches:
        (d / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return batches


def tree_bytes(root: Path) -> int:
    """Bytes of the working tree a call to the GPU machine carries: the files git tracks and the untracked ones
    it does not ignore (a link travels as a link)."""
    try:
        r = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True)
    except OSError as e:
        raise PackError(f"cannot measure the working tree ({e}): pass --batch-mib") from None
    if r.returncode != 0:
        raise PackError(f"cannot measure the working tree of {root} (git ls-files failed): pass --batch-mib")
    total = 0
    for name in r.stdout.split(b"\0"):
        p = root / os.fsdecode(name)
        if name and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def batch_bytes_for(root: Path, batch_mib: float | None) -> int:
    """The batch size: ``batch_mib``, refused where it and the working tree come to more than CALL_MIB; by
    default CALL_MIB less the tree less TREE_MARGIN_MIB, in whole MiB."""
    tree = tree_bytes(root)
    if batch_mib is None:
        mib = int((CALL_MIB * MiB - tree) // MiB) - TREE_MARGIN_MIB
        if mib < 8:
            raise PackError(f"the working tree has {tree / MiB:.1f} MiB: too little of a call's {CALL_MIB} MiB is left "
                            f"for a batch")
        return mib * MiB
    if not batch_mib > 0:
        raise PackError("the batch size must be positive")
    if batch_mib * MiB + tree > CALL_MIB * MiB:
        raise PackError(f"a batch of {batch_mib:g} MiB and the working tree's {tree / MiB:.1f} MiB come to more than "
                        f"the {CALL_MIB} MiB a call carries")
    return int(batch_mib * MiB)


# -- here: compact packs (--xz, --keep-arch) ----------------------------------------------------------
def _fatbin_section(data) -> tuple[int, int]:
    """(offset, size) of the .nv_fatbin section of an ELF64 little-endian shared library."""
    if bytes(data[:4]) != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise PackError("not an ELF64 little-endian library")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    strtab, = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)
    for i in range(shnum):
        h = shoff + i * shentsize
        name, = struct.unpack_from("<I", data, h)
        end = data.index(b"\0", strtab + name)
        if bytes(data[strtab + name:end]) == b".nv_fatbin":
            return struct.unpack_from("<QQ", data, h + 0x18)
    raise PackError("the library has no .nv_fatbin section")


def keep_arch(data: bytearray, arch: int) -> dict:
    """Zero, in place, the code of every entry of the library's fat binaries built for another GPU architecture
    than ``arch`` (sm_XY: XY); the containers' and entries' headers stay, so the file's layout and every offset are
    the same, and a GPU of ``arch`` loads the entries it always loaded. Returns counts: containers, those with no
    entry for ``arch`` (code no such GPU could run: no PTX to compile), bytes zeroed and kept."""
    off, size = _fatbin_section(data)
    if off + size > len(data):
        raise PackError("the library's .nv_fatbin section runs past its end: not a layout this knows")
    pos, st = off, {"containers": 0, "without_arch": 0, "zeroed": 0, "kept": 0}
    while pos + 16 <= off + size:
        magic, _version, hsize, fsize = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8 - pos % 8  # (containers start 8-byte aligned: padding after the one before)
            continue
        if hsize < 16 or pos + hsize + fsize > off + size:  # (nothing outside the section is written; no loop)
            raise PackError(f"a fat binary container at {pos:#x} has a header of {hsize} bytes or runs past the "
                            f"section: not a layout this knows")
        st["containers"] += 1
        p, end, archs = pos + hsize, pos + hsize + fsize, set()
        while p + 32 <= end:
            _kind, _flags, ehsize, psize = struct.unpack_from("<HHIQ", data, p)
            a, = struct.unpack_from("<I", data, p + 28)
            if ehsize < 32 or p + ehsize + psize > end:
                raise PackError(f"a fat binary entry at {p:#x} runs past its container: not a layout this knows")
            archs.add(a)
            if a != arch:
                data[p + ehsize:p + ehsize + psize] = bytes(psize)
                st["zeroed"] += psize
            else:
                st["kept"] += psize
            p += ehsize + psize
        st["without_arch"] += arch not in archs
        pos = max(end, pos + 16)
    if not st["kept"]:
        raise PackError(f"the library holds no code for sm_{arch}")
    return st


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode = len(data), mode
    tar.addfile(ti, io.BytesIO(data))


CUDA_LIBRARY = "libonnxruntime_providers_cuda.so"


def xz_pack(out: Path, wheels: list[Path], files: list[tuple[str, Path]], arch: int | None = None,
            preset: int = 6) -> Path:
    """``out`` (a .tar.xz): each wheel's files as ``pip install --target`` lays them out (``arch``: the CUDA
    library's other architectures zeroed, ``keep_arch``), then ``files`` under ``files/NAME``."""
    import lzma

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    with lzma.open(tmp, "wb", preset=preset) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        for whl in wheels:
            with zipfile.ZipFile(whl) as z:
                for info in z.infolist():
                    if info.is_dir():
                        continue
                    if ".data/" in info.filename:  # (scripts, headers: pip's to place; none in these wheels)
                        raise PackError(f"{whl.name} has {info.filename}: install that wheel with pip, not --xz")
                    data = z.read(info)
                    if arch is not None and info.filename.endswith(CUDA_LIBRARY):
                        buf = bytearray(data)
                        st = keep_arch(buf, arch)
                        print(f"  {info.filename}: sm_{arch} kept, {st['zeroed'] / MiB:.1f} MiB of other GPUs' code "
                              f"zeroed ({st['containers']} containers, {st['without_arch']} without sm_{arch})")
                        data = bytes(buf)
                    _add(tar, info.filename, data, (info.external_attr >> 16) & 0o777 or 0o644)
        for name, path in files:
            _add(tar, f"files/{name}", path.read_bytes())
    tmp.replace(out)
    return out


def unpack(archive: Path, site: Path, files: Path) -> int:
    """There: a ``xz_pack`` archive's wheel trees into ``site``, its ``files/`` into ``files``. Returns the count."""
    n = 0
    try:
        tar = tarfile.open(archive, "r:xz")
    except (OSError, tarfile.TarError) as e:
        raise Corrupt(f"{archive}: not a .tar.xz ({e})") from None
    with tar:
        for m in tar:
            if not m.isfile() or m.name.startswith("/") or ".." in Path(m.name).parts:
                raise Corrupt(f"{archive}: {m.name!r} is not a plain relative file")
            dest = files / m.name[len("files/"):] if m.name.startswith("files/") else site / m.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".partial")
            with tar.extractfile(m) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, 8 * MiB)
            tmp.chmod(m.mode or 0o644)
            tmp.replace(dest)
            n += 1
    return n


def compact_files(wheels: list[Path], tokenizer: Path | None, smol: Path | None, work: Path,
                  arch: int | None) -> list[tuple[str, Path]]:
    """The --xz pack's files: builder.tar.xz (genai, gguf, starlette, uvicorn, the tokenizer), ortgpu.tar.xz
    (onnxruntime-gpu; the CPU onnxruntime wheel left out: onnxruntime-gpu is an onnxruntime >= 1.31 too, what genai
    0.18's builder needs), SMOL.tar.xz; other wheels each their own .tar.xz."""
    pick = lambda pat: [w for w in wheels if re.match(pat, w.name)]  # noqa: E731
    gpu = pick(r"onnxruntime_gpu-")
    builder = pick(r"onnxruntime_genai-|gguf-|starlette-|uvicorn-")
    rest = [w for w in wheels if w not in gpu and w not in builder and not re.match(r"onnxruntime-\d", w.name)]
    toks = [(f"qwen-tokenizer/{f}", tokenizer / f) for f in ("tokenizer.json", "tokenizer_config.json")] \
        if tokenizer is not None else []
    out = [("builder.tar.xz", xz_pack(work / "builder.tar.xz", builder, toks))]
    if gpu:
        out.append(("ortgpu.tar.xz", xz_pack(work / "ortgpu.tar.xz", gpu, [], arch)))
    for w in rest:
        out.append((f"{w.name}.tar.xz", xz_pack(work / f"{w.name}.tar.xz", [w], [])))
    if smol is not None:
        out.append((f"{smol.name}.tar.xz", xz_pack(work / f"{smol.name}.tar.xz", [], [(smol.name, smol)])))
    return out


# -- there: collect the batches and join the files --------------------------------------------------
def read_manifest(stage: Path) -> dict:
    try:
        return json.loads((stage / MANIFEST).read_text())
    except FileNotFoundError:
        raise Incomplete(f"no {MANIFEST} in {stage}: stash a batch first") from None
    except ValueError as e:
        raise Corrupt(f"{stage / MANIFEST} is not JSON: {e}") from None


def stash(batch: Path, stage: Path) -> list[str]:
    """Move a batch's part into ``stage`` after checking its sha256 (a bad part is not kept); a batch after the first
    that finds no part of its pack in ``stage`` (a fresh machine: the earlier calls' parts went with the one given
    back) is FreshMachine, the batch left where it is. Batches may come in any order after the first."""
    man = read_manifest(batch)
    stage.mkdir(parents=True, exist_ok=True)
    if (stage / MANIFEST).exists() and read_manifest(stage) != man:
        raise Corrupt(f"{batch} belongs to another pack than the parts already in {stage}: empty {stage} first")
    known = {p["name"]: p for p in man["parts"]}
    here = sorted(batch.glob("part*.bin"))
    for f in here:
        p = known.get(f.name)
        if p is None:
            raise Corrupt(f"{f} is not a part of its manifest")
        if f.stat().st_size != p["size"] or sha256(f) != p["sha256"]:
            raise Corrupt(f"{f} does not match its sha256 in the manifest (a broken transfer): send it again")
    # a batch after the first finds the parts of the batches before it (in any order) unless the machine was given
    # back between the calls: the call that found no warm machine started a fresh one, an empty stage
    names = [p["name"] for p in man["parts"]]
    first = min((names.index(f.name) for f in here), default=0)
    if first > 0 and not any((stage / n).is_file() for n in names):
        raise FreshMachine(f"FRESH MACHINE: no part of the batches before this one is in {stage} (the machine was "
                           f"given back between calls): send the batches again from b1")
    moved = []
    for f in here:
        shutil.move(str(f), stage / f.name)
        moved.append(f.name)
    shutil.copy(batch / MANIFEST, stage / MANIFEST)
    return moved


def status(stage: Path) -> tuple[dict, set[str], list[str]]:
    """The manifest, the part names present in ``stage``, and the complete files' names."""
    man = read_manifest(stage)
    present = {p["name"] for p in man["parts"] if (stage / p["name"]).is_file()}
    complete = [e["name"] for e in man["files"] if all(
        p["name"] in present for p in man["parts"]
        if p["offset"] < e["offset"] + e["size"] and e["offset"] < p["offset"] + p["size"])]
    return man, present, complete


def join(stage: Path, out: Path, only: list[str] | None = None) -> list[Path]:
    """Write every complete file (or those matching ``only``) to ``out``, each checked against its
    sha256; a file asked for by ``only`` that is incomplete raises ``Incomplete``."""
    man, present, complete = status(stage)
    wanted = [e for e in man["files"] if not only or any(fnmatch.fnmatch(e["name"], pat) for pat in only)]
    if only and not wanted:
        raise Incomplete(f"no file of the pack matches {' '.join(only)}")
    missing = [e["name"] for e in wanted if e["name"] not in complete]
    if missing and only:
        have = len(present)
        raise Incomplete(f"incomplete: {', '.join(missing)} ({have} of {len(man['parts'])} parts here)")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for e in wanted:
        if e["name"] not in complete:
            continue
        dst = out / e["name"]
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.is_file() and dst.stat().st_size == e["size"] and sha256(dst) == e["sha256"]:
            written.append(dst)
            continue
        tmp = dst.with_name(dst.name + ".partial")
        with open(tmp, "wb") as w:
            for p in man["parts"]:
                lo = max(p["offset"], e["offset"])
                hi = min(p["offset"] + p["size"], e["offset"] + e["size"])
                if lo >= hi:
                    continue
                with open(stage / p["name"], "rb") as f:
                    f.seek(lo - p["offset"])
                    left = hi - lo
                    while left:
                        b = f.read(min(left, 8 * MiB))
                        if not b:
                            break
                        w.write(b)
                        left -= len(b)
        if tmp.stat().st_size != e["size"] or sha256(tmp) != e["sha256"]:
            tmp.unlink()
            raise Corrupt(f"{e['name']}: the joined bytes do not match its sha256")
        tmp.replace(dst)
        written.append(dst)
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="build the batches (here)")
    p.add_argument("--out", type=Path, default=Path(".gpu"))
    p.add_argument("--wheels", type=Path, default=None, help="where the wheels are (default: OUT/cache, downloaded)")
    p.add_argument("--models", type=Path, default=Path(os.environ.get(
        "EDGESPEC_MODELS", Path.home() / ".cache" / "edgespec" / "models")))
    p.add_argument("--tokenizer", type=Path, default=None, help="a directory with the Qwen tokenizer files")
    p.add_argument("--no-smollm2", action="store_true")
    p.add_argument("--file", type=Path, action="append", default=[], help="carry this file too (repeatable)")
    p.add_argument("--batch-mib", type=float, default=None,
                   help=f"batch size (default: {CALL_MIB} MiB less the working tree less {TREE_MARGIN_MIB} MiB)")
    p.add_argument("--xz", action="store_true", help="the wheels' trees and SmolLM2 as .tar.xz (fewer transfers)")
    p.add_argument("--keep-arch", type=int, default=None,
                   help="with --xz: keep only this GPU architecture's code in onnxruntime's CUDA library (90: H100/H200)")
    s = sub.add_parser("stash", help="move an arrived batch into the stage (there)")
    s.add_argument("batch", type=Path)
    s.add_argument("--stage", type=Path, required=True)
    j = sub.add_parser("join", help="write the complete files (there)")
    j.add_argument("--stage", type=Path, required=True)
    j.add_argument("--out", type=Path, required=True)
    j.add_argument("--only", nargs="*", default=None, help="file name patterns that must be complete")
    u = sub.add_parser("unpack", help="write a --xz archive's wheel trees and files (there)")
    u.add_argument("archive", type=Path)
    u.add_argument("--site", type=Path, required=True)
    u.add_argument("--files", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "pack":
            if args.keep_arch is not None and not args.xz:
                raise PackError("--keep-arch strips onnxruntime's CUDA library inside an --xz pack: add --xz")
            batch = batch_bytes_for(Path(__file__).resolve().parent.parent.parent, args.batch_mib)
            wheels = download_wheels(args.out / "cache") if args.wheels is None else sorted(args.wheels.glob("*.whl"))
            files: list[tuple[str, Path]] = []
            if args.xz:
                smol = None if args.no_smollm2 else args.models / SMOL
                if smol is not None and not smol.is_file():
                    raise PackError(f"{smol} is not a file")
                files += compact_files(wheels, args.tokenizer, smol, args.out / "xz", args.keep_arch)
            else:
                files += [(w.name, w) for w in wheels]
                if args.tokenizer is not None:
                    files += [(f"qwen-tokenizer/{f}", args.tokenizer / f)
                              for f in ("tokenizer.json", "tokenizer_config.json")]
                if not args.no_smollm2:
                    files.append((SMOL, args.models / SMOL))
            files += [(f.name, f) for f in args.file]
            # smallest first: the builder's wheels and the tokenizer arrive in the first batch, so the
            # shaped models export there while the rest (onnxruntime-gpu) travels
            files.sort(key=lambda nf: nf[1].stat().st_size if nf[1].is_file() else 0)
            batches = pack(files, args.out, batch)
            for d in batches:
                size = sum(f.stat().st_size for f in d.iterdir())
                print(f"{d}  {size / MiB:.1f} MiB")
            print(f"{len(batches)} batches of at most {batch / MiB:g} MiB: one transfer each")
        elif args.cmd == "stash":
            moved = stash(args.batch, args.stage)
            man, present, complete = status(args.stage)
            print(f"stashed {' '.join(moved) or 'nothing'}; {len(present)} of {len(man['parts'])} parts here; "
                  f"complete: {', '.join(complete) or 'none yet'}")
        elif args.cmd == "unpack":
            n = unpack(args.archive, args.site, args.files)
            print(f"{args.archive.name}: {n} files")
        else:
            for f in join(args.stage, args.out, args.only):
                print(f)
            man, present, complete = status(args.stage)
            missing = [e["name"] for e in man["files"] if e["name"] not in complete]
            if missing and not args.only:
                print(f"not complete yet: {', '.join(missing)} ({len(present)} of {len(man['parts'])} parts here)",
                      file=sys.stderr)
    except PackError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
