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


def test_a_source_is_a_gguf_file_a_model_folder_or_a_hub_id(tmp_path):
    """``resolve``: what each spelling of a source is, and one ExportError for each that is none: a file of another
    kind, a .gguf file that is not GGUF (its magic), a folder without config.json (naming a GGUF file it holds)."""
    from edgespec.errors import ExportError
    from edgespec_export.source import resolve

    gguf = tmp_path / "m.GGUF"
    gguf.write_bytes(b"GGUF" + bytes(12))
    s = resolve(str(gguf))
    assert (s.kind, s.path) == ("gguf", gguf.resolve())
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    s = resolve(str(folder))
    assert (s.kind, s.path) == ("hf-dir", folder.resolve())
    s = resolve("Qwen/Qwen2.5-0.5B")
    assert (s.kind, s.path) == ("hub", None)
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04" + bytes(12))
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    other = tmp_path / "model.safetensors"
    other.write_bytes(bytes(8))
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "b.gguf").write_bytes(b"GGUF")
    (bare / "a.gguf").write_bytes(b"GGUF")
    (folder / "sub").mkdir()
    for spec, message in ((fake, "fake.gguf is not a GGUF file \\(bad magic\\)"),
                          (empty, "empty.gguf is not a GGUF file \\(bad magic\\)"),
                          (other, "model.safetensors is a file but not a .gguf model"),
                          (bare, "bare is not a Hugging Face model directory: no config.json \\(it holds a.gguf: "
                                 "pass that file\\)"),
                          (folder / "sub", "is not a Hugging Face model directory: no config.json$"),
                          (tmp_path / "missing", "no such model")):
        with pytest.raises(ExportError, match=message):
            resolve(str(spec))
