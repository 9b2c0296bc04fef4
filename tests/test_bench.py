"""`edgespec bench` end to end on a real model, with every figure of the report present."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgespec.bench import read_prompts
from edgespec.cli import main
from edgespec.errors import ConfigError


@pytest.mark.real
def test_bench_on_smollm2(smol_int4, tmp_path):
    out = tmp_path / "rep"
    r = CliRunner().invoke(main, ["bench", str(smol_int4), "--limit", "3", "--max-new-tokens", "16",
                                  "--drafters", "prompt-lookup,auto,none", "--out", str(out)])
    assert r.exit_code == 0, r.output
    rep = json.loads((out / "report.json").read_text())
    assert {"summary", "runs", "memory", "plan", "device", "settings"} <= set(rep)
    s = rep["summary"]["all"]
    assert set(s) == {"none", "prompt-lookup", "auto"}
    for d, v in s.items():
        for k in ("tokens_per_second", "speedup", "acceptance_rate", "mean_accepted_length", "ttft_ms", "tpot_ms",
                  "draft_s", "target_s", "other_s", "exact"):
            assert k in v, (d, k)
        assert v["exact"], f"{d} changed the greedy output"
    assert s["none"]["speedup"] == 1.0
    m = rep["memory"]
    assert m["peak_bytes"] > 0 and m["planned_bytes"] > 0 and m["samples"]
    for png in ("tokens_per_second.png", "acceptance_by_position.png", "time_split.png", "memory.png"):
        assert (out / png).stat().st_size > 1000
    assert "| category | drafter |" in (out / "report.md").read_text()


def test_read_prompts_spec_bench_format(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text('{"question_id": 1, "category": "code", "turns": ["a", "b"]}\n\n{"turns": ["c"]}\n')
    qs = read_prompts(p)
    assert [q["category"] for q in qs] == ["code", "default"] and qs[0]["turns"] == ["a", "b"]
    p.write_text('{"question_id": 1}\n')
    with pytest.raises(ConfigError, match="turns"):
        read_prompts(p)
    with pytest.raises(ConfigError, match="no such prompt file"):
        read_prompts(tmp_path / "missing.jsonl")
    assert {q["category"] for q in read_prompts()} >= {"code", "chat", "summarization", "qa", "math",
                                                        "extraction", "translation"}
