#!/usr/bin/env python
"""Add the memory planner's measured sizes to a bundle exported before they were recorded.

    python scripts/refresh_sizes.py BUNDLE [BUNDLE ...]

For each model it records ``cpu_resident_bytes`` (the graph opened on the CPU EP in a fresh
process, as ``edgespec.load`` opens it), ``embedding_bytes`` and ``embedding_row_bytes``, exactly
as ``edgespec export`` does now, and rewrites ``edgespec.json`` in place. Needs the export
dependencies (onnx)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgespec.errors import EdgespecError  # noqa: E402
from edgespec.manifest import MANIFEST_NAME, load_manifest  # noqa: E402
from export.bundle import measured_sizes  # noqa: E402


def refresh(bundle: Path) -> list[str]:
    """Measure ``bundle`` in place; returns the roles whose CPU footprint could not be measured."""
    m = load_manifest(bundle)  # refuses a bundle that is not one
    path = bundle / MANIFEST_NAME
    raw = m.raw  # the manifest as parsed, rewritten below with the new figures
    failed = []
    for role, entry in raw["models"].items():
        for key in ("cpu_resident_bytes", "embedding_bytes", "embedding_row_bytes"):
            entry.pop(key, None)  # nothing stale survives a failed measurement
        sizes = measured_sizes(bundle, role, entry, log=print)
        entry.update(sizes)
        cpu = sizes.get("cpu_resident_bytes")
        if cpu is None:
            failed.append(role)
        print(f"{bundle.name} {role}: {getattr(m, role).bytes_on_disk / 2**20:.1f} MiB on disk, "
              + (f"{cpu / 2**20:.1f} MiB resident on the CPU EP, " if cpu is not None else "")
              + f"embedding tables {sizes['embedding_bytes'] / 2**20:.1f} MiB")
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(raw, indent=1, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)
    return failed


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    try:
        failed = [f"{b} {role}" for b in sys.argv[1:] for role in refresh(Path(b))]
    except (EdgespecError, OSError) as e:
        sys.exit(f"error: {e}")
    if failed:
        sys.exit(f"not measured (the plan uses file sizes for these): {', '.join(failed)}")
