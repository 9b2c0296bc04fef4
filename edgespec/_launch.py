"""The ``edgespec`` command's entry point: a Ctrl-C while the CLI's modules load (click, numpy: ~0.3 s) is
"interrupted", exit 130, as everywhere after it, not a KeyboardInterrupt traceback (session 64, a review)."""
from __future__ import annotations

import sys


def main(prog_name: str | None = None):
    try:
        from .cli import main as cli
    except KeyboardInterrupt:
        try:
            sys.stderr.write("error: interrupted\n")
        except (OSError, ValueError):
            pass
        raise SystemExit(130) from None
    return cli(prog_name=prog_name)
