"""(the mutation run's copy only) Tests that need no server or model first, then the served refusal tables, then
the rest: with -x a mutant is caught by the quick tests before the slow ones run. MUTORDER_QUICK=1: the first two
groups alone (a first stage); MUTORDER_LIGHT=1: only tests whose fixtures are pytest's own (a wider set's no-model
tests)."""
import os

import pytest

HEAVY = {"server", "client", "engine", "smol_int4", "tiny_bundle", "model_id"}

LIGHT = {"tmp_path", "monkeypatch", "capsys", "capfd", "request", "tmp_path_factory", "caplog", "recwarn"}


def _light(it) -> bool:
    return all(f in LIGHT or f.startswith("_") for f in getattr(it, "fixturenames", ()))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    def rank(it):
        if not set(getattr(it, "fixturenames", ())) & HEAVY:
            return 0
        return 1 if any(w in it.name for w in ("bad_input", "errors_name", "error_messages")) else 2
    if os.environ.get("MUTORDER_LIGHT"):
        gone = [it for it in items if not _light(it)]
        items[:] = [it for it in items if _light(it)]
        config.hook.pytest_deselected(items=gone)
        return
    items.sort(key=rank)
    if os.environ.get("MUTORDER_QUICK"):
        gone = [it for it in items if rank(it) == 2]
        items[:] = [it for it in items if rank(it) < 2]
        config.hook.pytest_deselected(items=gone)

