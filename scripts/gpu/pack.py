#!/usr/bin/env python3
"""Carry files to a GPU machine that has no network, in transfers of limited size.

The machine this plans for (README: GPU) takes files only as copies of the working tree plus
named ignored folders, at most 64 MiB per transfer. Everything it lacks (the onnxruntime-gpu and
onnxruntime-genai wheels, gguf, SmolLM2's weights, the Qwen tokenizer) goes as one byte stream:
the files one after the other, smallest first, cut into batches of at most ``--batch-mib``, one batch per
transfer. Each batch carries the whole manifest (every file's offset, size and sha256, every
part's sha256), so the far side knows at any point what it has and what is complete.

Here (a connected machine):

    python scripts/gpu/pack.py pack --tokenizer bundles/qwen-coder-b128/tokenizer --out .gpu
        # -> .gpu/b1 ... .gpu/bN, each <= 60 MiB, each one transfer

There, one batch per call (the batch folder arrives in the working tree):

    python3 scripts/gpu/pack.py stash .gpu/b3 --stage /tmp/edgespec-gpu/parts
    python3 scripts/gpu/pack.py join --stage /tmp/edgespec-gpu/parts --out /tmp/edgespec-gpu/files \
        [--only '*.whl']

``join`` writes each file whose bytes have all arrived and whose sha256 matches, and says what is
still missing; it exits 3 when a file asked for (``--only``) is incomplete and 4 when a part or a
file does not match its sha256 (nothing corrupt is left behind). Only the standard library is
used: it runs on any Python 3.9+.
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

MiB = 1 << 20
MANIFEST = "MANIFEST.json"
# What the GPU run needs that its machine does not have (KINDS.md in the device library: it has
# torch, transformers, onnx and onnxruntime 1.30 CPU, no onnxruntime-gpu, genai or gguf).
# onnxruntime (CPU) 1.31.1 too: genai 0.18 needs onnxruntime >= 1.31, and with it in the first batch
# the export (install.sh's builder site) starts while onnxruntime-gpu is still travelling
WHEELS = ("onnxruntime-gpu==1.31.1", "onnxruntime-genai==0.18.0", "gguf==0.19.0", "onnxruntime==1.31.1")
PLATFORM_ARGS = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                 "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
                 "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"


class PackError(Exception):
    exit_code = 2


class Incomplete(PackError):
    exit_code = 3


class Corrupt(PackError):
    exit_code = 4


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


# -- there: collect the batches and join the files --------------------------------------------------
def read_manifest(stage: Path) -> dict:
    try:
        return json.loads((stage / MANIFEST).read_text())
    except FileNotFoundError:
        raise Incomplete(f"no {MANIFEST} in {stage}: stash a batch first") from None
    except ValueError as e:
        raise Corrupt(f"{stage / MANIFEST} is not JSON: {e}") from None


def stash(batch: Path, stage: Path) -> list[str]:
    """Move a batch's part into ``stage`` after checking its sha256 (a bad part is not kept)."""
    man = read_manifest(batch)
    stage.mkdir(parents=True, exist_ok=True)
    if (stage / MANIFEST).exists() and read_manifest(stage) != man:
        raise Corrupt(f"{batch} belongs to another pack than the parts already in {stage}: empty {stage} first")
    moved = []
    known = {p["name"]: p for p in man["parts"]}
    for f in sorted(batch.glob("part*.bin")):
        p = known.get(f.name)
        if p is None:
            raise Corrupt(f"{f} is not a part of its manifest")
        if f.stat().st_size != p["size"] or sha256(f) != p["sha256"]:
            raise Corrupt(f"{f} does not match its sha256 in the manifest (a broken transfer): send it again")
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
    p.add_argument("--batch-mib", type=float, default=60.0)
    s = sub.add_parser("stash", help="move an arrived batch into the stage (there)")
    s.add_argument("batch", type=Path)
    s.add_argument("--stage", type=Path, required=True)
    j = sub.add_parser("join", help="write the complete files (there)")
    j.add_argument("--stage", type=Path, required=True)
    j.add_argument("--out", type=Path, required=True)
    j.add_argument("--only", nargs="*", default=None, help="file name patterns that must be complete")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "pack":
            files: list[tuple[str, Path]] = []
            if args.wheels is None:
                files += [(w.name, w) for w in download_wheels(args.out / "cache")]
            else:
                files += [(w.name, w) for w in sorted(args.wheels.glob("*.whl"))]
            if args.tokenizer is not None:
                files += [(f"qwen-tokenizer/{f}", args.tokenizer / f)
                          for f in ("tokenizer.json", "tokenizer_config.json")]
            if not args.no_smollm2:
                files.append((SMOL, args.models / SMOL))
            files += [(f.name, f) for f in args.file]
            # smallest first: the builder's wheels and the tokenizer arrive in the first batch, so the
            # shaped models export there while the rest (onnxruntime-gpu) travels
            files.sort(key=lambda nf: nf[1].stat().st_size if nf[1].is_file() else 0)
            batches = pack(files, args.out, int(args.batch_mib * MiB))
            for d in batches:
                size = sum(f.stat().st_size for f in d.iterdir())
                print(f"{d}  {size / MiB:.1f} MiB")
            print(f"{len(batches)} batches of at most {args.batch_mib:g} MiB: one transfer each")
        elif args.cmd == "stash":
            moved = stash(args.batch, args.stage)
            man, present, complete = status(args.stage)
            print(f"stashed {' '.join(moved) or 'nothing'}; {len(present)} of {len(man['parts'])} parts here; "
                  f"complete: {', '.join(complete) or 'none yet'}")
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
