"""(session 88) export/source.py's parts on their own, where test_export's and test_archs' exports do not reach
them: the kept copies of GGUF files. Mutation-tested (docs/bench/mutation_s88.md)."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("meanwhile", ["removed", "rewritten"])
def test_a_damaged_copy_is_deleted_even_where_its_gguf_file_changed_meanwhile(tmp_path, monkeypatch, capsys, meanwhile):
    """The copy found damaged is the one deleted: it was worked out again from the GGUF file, so a file removed
    meanwhile left the copy "not deleted (No such file or directory)", and a file rewritten meanwhile (another
    digest, no copy) left it while saying "deleted"."""
    from edgespec_export import source

    monkeypatch.setenv(source.GGUF_CACHE_ENV, str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    entry = source.gguf_cache_entry(gguf)
    (entry / "sub").mkdir(parents=True)
    (entry / "COMPLETE").write_text("{}")
    (entry / "sub" / "model.safetensors").write_bytes(bytes(8))
    if meanwhile == "removed":
        gguf.unlink()
    else:
        gguf.write_bytes(b"GGUF" + bytes(80))
    monkeypatch.setattr(source, "_UNREADABLE", set())
    source._drop_copy(gguf, entry, "model.safetensors changed after it was kept")
    assert not entry.exists() and entry in source._UNREADABLE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot be used (model.safetensors changed after it was kept); deleted;" in err
