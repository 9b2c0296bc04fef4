"""``one_line_errors``: a script's ``main`` whose edgespec errors (a bundle that is not one, a bad option, a prompts
file) end in one ``error:`` line and exit 2, as the CLI says them, not in a traceback."""
from __future__ import annotations

import functools
import sys


def one_line_errors(main):
    @functools.wraps(main)
    def wrapped(argv=None) -> int:
        from edgespec.errors import EdgespecError

        try:
            return main(argv)
        except EdgespecError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2

    return wrapped
