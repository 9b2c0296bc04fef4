"""``python -m edgespec``: the ``edgespec`` command."""
from ._launch import main

main(prog_name="edgespec")  # (its messages name the command as users type it)
