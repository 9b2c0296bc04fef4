#!/usr/bin/env python
"""Add the memory planner's measured sizes to a bundle exported before they were recorded.

    python scripts/refresh_sizes.py BUNDLE [BUNDLE ...]

For each model it records ``cpu_resident_bytes`` (the graph opened on the CPU EP in a fresh
process, as ``edgespec.load`` opens it), ``embedding_bytes`` and ``embedding_row_bytes``, exactly
as ``edgespec export`` does now, and rewrites ``edgespec.json`` in place. Needs the export
dependencies (onnx)."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgespec.errors import EdgespecError  # noqa: E402
from edgespec.manifest import load_manifest, write_manifest  # noqa: E402
from edgespec_export.bundle import measured_sizes  # noqa: E402


def refresh(bundle: Path) -> list[str]:
    """Measure ``bundle`` in place; returns the roles whose CPU footprint could not be measured."""
    m = load_manifest(bundle)  # refuses a bundle that is not one
    failed = []
    for spec in (m.target, m.drafter):
        if spec is None:
            continue
        # nothing stale survives a failed measurement
        spec = replace(spec, cpu_resident_bytes=None, embedding_bytes=0, embedding_row_bytes=0)
        sizes = measured_sizes(bundle, spec.role, spec.to_dict(bundle), log=print)
        m = replace(m, **{spec.role: replace(spec, **sizes)})
        cpu = sizes.get("cpu_resident_bytes")
        if cpu is None:
            failed.append(spec.role)
        print(f"{bundle.name} {spec.role}: {spec.bytes_on_disk / 2**20:.1f} MiB on disk, "
              + (f"{cpu / 2**20:.1f} MiB resident on the CPU EP, " if cpu is not None else "")
              + f"embedding tables {sizes['embedding_bytes'] / 2**20:.1f} MiB")
    write_manifest(m)
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
