"""`edgespec bench` end to end on a real model, with every figure of the report present."""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import numpy as np
import re

import pytest
from click.testing import CliRunner

from edgespec.bench import read_prompts
from edgespec.cli import main
from edgespec.errors import ConfigError


@pytest.mark.real
def _refused(script_main, argvs, capsys):
    """Each argv is a bad input: exit 2 with one 'error:' line."""
    for argv in argvs:
        assert script_main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error:") and len(err.strip().splitlines()) == 1, argv


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
    assert m["file_bytes"] is None or 0 < m["file_bytes"] <= m["peak_bytes"]
    assert (m["file_bytes"] is not None) == ("mapped from files" in (out / "report.md").read_text())
    for png in ("tokens_per_second.png", "acceptance_by_position.png", "time_split.png", "memory.png"):
        assert (out / png).stat().st_size > 1000
    assert "| category | drafter |" in (out / "report.md").read_text()


def test_read_prompts_spec_bench_format(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text('{"question_id": 1, "category": "code", "turns": ["a", "b"]}\n\n{"turns": ["c"]}\n')
    qs = read_prompts(p)
    assert [q["category"] for q in qs] == ["code", "default"] and qs[0]["turns"] == ["a", "b"]
    assert [q["question_id"] for q in qs] == ["1", "3"]  # (session 47: an integer id failed the report's joins)
    p.write_text('{"question_id": 1}\n')
    with pytest.raises(ConfigError, match="turns"):
        read_prompts(p)
    with pytest.raises(ConfigError, match="no such prompt file"):
        read_prompts(tmp_path / "missing.jsonl")
    for bad, match in (('{"category": ["a"], "turns": ["x"]}', "'category' must be a string, got list"),
                       ('{"category": 5, "turns": ["x"]}', "'category' must be a string, got int"),
                       ('{"turns": [123]}', "turns"),  # (session 43: tracebacks, or an error after the load)
                       ('{"turns": ["x"], "n": 1' + "0" * 5000 + "}", ":1: not JSON (Exceeds the limit"),  # (46)
                       ("[" * 100000 + "]" * 100000, ":1: not JSON (maximum recursion depth"),
                       ('{"question_id": [1], "turns": ["x"]}', "'question_id' must be a string or an integer"),
                       # (session 49: met at that turn's run, the runs before it lost)
                       ('{"turns": ["x", "y\\ud800"]}', ":1: turn 2 holds an unpaired UTF-16 surrogate"),
                       ('{"turns": ["x"], "category": "c\\udc00"}', ":1: category holds an unpaired UTF-16"),
                       ('{"turns": ["x"], "question_id": "\\ud800"}', ":1: question_id holds an unpaired UTF-16"),
                       # (session 56, a review: it stopped the bench at its run, the prompts after it not run)
                       ('{"turns": ["x", " \\n"]}', ":1: turn 2 is empty")):
        p.write_text(bad + "\n")
        with pytest.raises(ConfigError, match=re.escape(match)):
            read_prompts(p, categories=["zz"])
    assert {q["category"] for q in read_prompts()} >= {"code", "chat", "summarization", "qa", "math",
                                                        "extraction", "translation"}


def test_read_prompts_per_category():
    qs = read_prompts(per_category=1)
    cats = [q["category"] for q in qs]
    assert len(cats) == len(set(cats)) == 7


@pytest.mark.parametrize("spec", ["model:abc", "none:3", "nosuch", "auto@0", "auto@x", "none@4", "auto@65", "model:0",
                                  "model:65", "model:", "model:\u00b2", "auto@\u0663"])
def test_bad_drafter_spec_is_one_line(tiny_bundle, tmp_path, spec):
    r = CliRunner().invoke(main, ["bench", str(tiny_bundle), "--limit", "1", "--max-new-tokens", "4",
                                  "--drafters", spec, "--no-plots", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and f"unknown drafter {spec!r}" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, match", [
    (["--limit", "0"], "--limit must be at least 1"), (["--limit", "-1"], "--limit must be at least 1"),
    (["--per-category", "0"], "--per-category must be at least 1"),
    (["--drafters", ","], "no drafter to compare"), (["--drafters", "none"], "no drafter to compare"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["--categories", "code,nope"], "no category 'nope'; it has chat, code"),
    (["--draft-tokens", "65"], "--draft-tokens must be in 0..64"), (["--draft-tokens", "-1"], "must be in 0..64"),
])
def test_bad_bench_options_are_refused_before_anything_runs(tmp_path, args, match):
    """Refused before a model loads (the bundle does not even exist) and before the report folder is made."""
    r = CliRunner().invoke(main, ["bench", str(tmp_path / "no-bundle"), "--no-plots", "--out", str(tmp_path / "o"),
                                  *args])
    assert r.exit_code == 2 and match in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "o").exists()
    r = CliRunner().invoke(main, ["bench", str(tmp_path / "no-bundle"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "no such bundle" in r.stderr and not (tmp_path / "o").exists()


def test_drafters_model_alone_on_a_bundle_without_a_drafter_is_refused(smol_int4, tmp_path):
    """--drafters model on a target-only bundle compares nothing: refused (exit 2, one line, no report folder),
    as --drafters none is; beside another drafter, model is skipped with a note."""
    r = CliRunner().invoke(main, ["bench", str(smol_int4), "--limit", "1", "--max-new-tokens", "2", "--drafters",
                                  "model", "--no-plots", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "no drafter model" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "o").exists()
    r = CliRunner().invoke(main, ["bench", str(smol_int4), "--limit", "1", "--max-new-tokens", "2", "--drafters",
                                  "model,prompt-lookup", "--no-plots", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0 and "skipping --drafters model" in r.stderr, r.stderr


def test_a_report_that_cannot_be_written_is_still_printed(tiny_bundle, tmp_path, monkeypatch):
    import edgespec.bench as B

    out = tmp_path / "o"
    out.mkdir()
    (out / "report.json").write_text('{"earlier": true, "runs": []}')  # (an earlier bench's)

    def full(self, *a, **k):
        if self.name.startswith(".report.md"):
            raise OSError(28, "No space left on device")
        return real(self, *a, **k)

    real = B.Path.write_text
    monkeypatch.setattr(B.Path, "write_text", full)
    r = CliRunner().invoke(main, ["bench", str(tiny_bundle), "--limit", "1", "--max-new-tokens", "3", "--drafters",
                                  "prompt-lookup", "--no-plots", "--out", str(out)])
    assert r.exit_code == 1 and "No space left on device" in r.stderr.strip().splitlines()[-1], r.stderr
    assert "prompt-lookup" in r.stdout  # the results, printed before the files were written
    assert r.stderr.startswith("bench: 1 prompts x 2 drafters, 3 new tokens each\n"), r.stderr  # (CL153: none too)
    assert (out / "report.md").exists() is False and sorted(p.name for p in out.iterdir()) == ["report.json"]
    assert "earlier" not in json.loads((out / "report.json").read_text())  # that one was written, whole


def test_a_report_is_written_when_stdout_cannot_take_it(tiny_bundle, tmp_path):
    """(session 48, a review) A pager quit or a closed stdout ended the run at the report's echo, before its files
    were written: the whole run lost."""
    import os
    import subprocess
    import sys

    out = tmp_path / "o"
    p = subprocess.run([sys.executable, "-m", "edgespec.cli", "bench", str(tiny_bundle), "--limit", "1",
                        "--max-new-tokens", "3", "--drafters", "prompt-lookup", "--no-plots", "--out", str(out)],
                       stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300,
                       preexec_fn=lambda: os.close(1))  # (stdout closed)
    assert p.returncode == 1, p.stderr
    assert sorted(f.name for f in out.iterdir()) == ["report.json", "report.md"], p.stderr


def test_a_draft_bound_runner_drafts_at_most_that_many(tiny_bundle):
    """``auto@N`` (an A/B of the draft bound in one run) asks the engine for at most N draft tokens a
    round and drafts no more; ``auto`` leaves the engine's bound; both are exact."""
    from edgespec import load
    from edgespec.bench import parse_drafters, run_bench

    assert parse_drafters(["auto@3", "model:2", "auto"], 5) == {"auto@3": None, "model:2": 2, "auto": 5}
    eng = load(tiny_bundle)
    asked = []
    real = eng.stream_ids

    def spy(ids, **kw):
        asked.append((kw["drafter"], kw.get("max_draft_tokens"), kw.get("draft_tokens")))
        return real(ids, **kw)

    eng.stream_ids = spy
    prompts = [{"question_id": "rep", "category": "code", "turns": ["one two three one two three one two three " * 4]}]
    rep = run_bench(eng, prompts, ["prompt-lookup@2", "prompt-lookup"], max_new_tokens=40, log=lambda s: None)
    assert asked[-3:] == [("none", None, None), ("prompt-lookup", 2, None), ("prompt-lookup", None, None)]
    runs = {r.drafter: r for r in rep.runs}
    assert len(runs["prompt-lookup@2"].drafted_by_position) <= 2 and runs["prompt-lookup@2"].drafted > 0
    assert runs["prompt-lookup@2"].exact and runs["prompt-lookup"].exact
    assert runs["prompt-lookup"].model_drafting is None  # no model call: nothing to price apart
    rep = run_bench(eng, prompts, ["model:2"], max_new_tokens=12, log=lambda s: None)
    m = {r.drafter: r for r in rep.runs}["model:2"].model_drafting  # (scripts/gpu/predict.py prices these)
    assert m["calls"] > 0 and m["tokens"] > m["calls"] and m["call_s"] > 0


def test_a_bench_at_top_p_0_is_greedy_and_judged_exact(tiny_bundle):
    """(session 72) top_p 0 is greedy decoding at any temperature (SamplingParams.greedy): a bench run so is judged
    exact against plain decoding and labelled greedy, not "sampled: exactness not checked"."""
    from edgespec import load
    from edgespec.bench import run_bench

    eng = load(tiny_bundle)
    prompts = [{"question_id": "rep", "category": "code", "turns": ["one two three one two three " * 3]}]
    rep = run_bench(eng, prompts, ["prompt-lookup"], max_new_tokens=12, temperature=0.9, top_p=0.0,
                    log=lambda s: None)
    assert {r.drafter: r.exact for r in rep.runs} == {"none": None, "prompt-lookup": True}
    md = rep.markdown()
    assert "· greedy ·" in md and "exactness not checked" not in md and "✓" in md
    rep = run_bench(eng, prompts, ["prompt-lookup"], max_new_tokens=12, temperature=0.9, top_p=0.5, seed=1,
                    log=lambda s: None)
    assert {r.drafter: r.exact for r in rep.runs} == {"none": None, "prompt-lookup": None}
    assert "exactness not checked" in rep.markdown()


def test_external_runners_are_checked_against_their_reference(tiny_bundle):
    """A runner beside edgespec's (scripts/bench_spec.py puts onnxruntime-genai there) is judged
    exact against edgespec's `none`, or against the runner it names as its reference."""
    from edgespec import load
    from edgespec.bench import run_bench

    eng = load(tiny_bundle)
    seen: dict[str, list[int]] = {}

    def same(ids, n):  # replays edgespec's own autoregressive tokens
        eng.reset()
        out = [t for _, toks, _, _ in eng.stream_ids(ids, max_new_tokens=n, drafter="none") for t in toks]
        seen["same"] = out
        return {"token_ids": out, "decode_s": 0.01}

    def other(ids, n):  # differs from edgespec, but equals the "same" runner it names
        return {"token_ids": seen["same"], "decode_s": 0.01, "reference": "same"}

    def wrong(ids, n):
        return {"token_ids": [t + 1 for t in seen["same"]], "decode_s": 0.01, "drafted": 4, "accepted": 1}

    def own(ids, n):  # its own reference (llama.cpp's autoregressive run): judged against nothing (session 45)
        return {"token_ids": [t + 2 for t in seen["same"]], "decode_s": 0.01, "reference": "own"}

    rep = run_bench(eng, read_prompts(limit=1), ["prompt-lookup"], max_new_tokens=6,
                    external={"same": same, "other": other, "wrong": wrong, "own": own}, log=lambda s: None)
    exact = {r.drafter: r.exact for r in rep.runs}
    assert exact == {"none": None, "prompt-lookup": True, "same": True, "other": True, "wrong": False, "own": None}
    s = rep.summary()["all"]
    assert s["wrong"]["acceptance_rate"] == 0.25 and not s["wrong"]["exact"]
    rows = {line.split(" | ")[1]: line.rstrip(" |").rsplit(" | ", 1)[1] for line in rep.markdown().splitlines()
            if line.startswith("| all | ")}
    assert rows["own"] == "–" and rows["same"] == "✓" and rows["wrong"] == "✗"
    # (session 49, a review) a runner judged against nothing is not "exact": true in report.json (it said a pass)
    assert s["own"]["exact"] is None and s["none"]["exact"] is True and s["same"]["exact"] is True
    assert rows["none"] == "✓"  # (the reference, greedy: not ✗ for having no run judged)


def test_bench_runners_do_not_recall_each_other_and_a_stopped_bench_keeps_its_runs(tiny_bundle, tmp_path, capsys):
    """(session 49, a review) With the suffix drafter's memory on (`bench --memory`), each runner's reply was recorded
    at its end and recalled by the next runner on that prompt as a perfect repeat (`auto` after `suffix` 4.09x, alone
    1.07x): now one reference reply a turn is remembered once every runner has run it. And a bench stopped by Ctrl-C
    or an error lost every run done: they come with the exception, written by write_partial_report."""
    from edgespec import load
    from edgespec.bench import run_bench, write_partial_report

    eng = load(tiny_bundle, memory=str(tmp_path / "m.npz"))
    sfx = eng.decoder.drafters["suffix"]
    recalled = []
    prompts = [{"question_id": "q1", "category": "code", "turns": ["def add(a, b):", "and subtract?"]}]
    rep = run_bench(eng, prompts, ["suffix", "auto"], max_new_tokens=12,
                    log=lambda line: recalled.append(list(sfx.recall_scores)))
    assert len(rep.runs) == 6 and recalled[:3] == [[], [], []], recalled  # the first turn: nothing recalled
    assert len({tuple(r) for r in recalled[3:]}) == 1, recalled  # the second: each runner the same memory
    assert sfx.recording and eng.memory_stats()["memory_sequences"] == 2  # a reference a turn; recording put back
    calls = []

    def stop(line):
        calls.append(line)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as e:
        run_bench(eng, prompts * 2, ["suffix"], max_new_tokens=6, log=stop)
    part = e.value.report
    assert len(part.runs) == 2 and part.stopped == "interrupted" and sfx.recording
    write_partial_report(part, tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert len(saved["runs"]) == 2 and saved["stopped"] == "interrupted"
    assert "Stopped early" in (tmp_path / "out" / "report.md").read_text()
    write_partial_report(None, tmp_path / "none")  # (nothing measured: nothing written)
    assert not (tmp_path / "none").exists()
    # (session 55, a review) beside a whole report, a stopped one is written as report.partial.*, not over it
    from edgespec.bench import write_report

    write_report(rep, tmp_path / "out", plots=False)
    whole = (tmp_path / "out" / "report.json").read_text()
    write_partial_report(part, tmp_path / "out")
    assert (tmp_path / "out" / "report.json").read_text() == whole
    assert json.loads((tmp_path / "out" / "report.partial.json").read_text())["stopped"] == "interrupted"
    assert "Stopped early" in (tmp_path / "out" / "report.partial.md").read_text()
    # (session 56, a review) nor over a stopped report of more runs; over one of fewer or as many, as before
    fewer = copy.deepcopy(part)
    fewer.runs = fewer.runs[:1]
    write_partial_report(part, tmp_path / "again")
    write_partial_report(fewer, tmp_path / "again")
    assert len(json.loads((tmp_path / "again" / "report.json").read_text())["runs"]) == 2
    assert len(json.loads((tmp_path / "again" / "report.partial.json").read_text())["runs"]) == 1
    write_partial_report(part, tmp_path / "again")
    assert len(json.loads((tmp_path / "again" / "report.json").read_text())["runs"]) == 2
    # and a whole report written without plots takes an earlier run's plots away (they were another run's)
    (tmp_path / "again" / "time_split.png").write_bytes(b"old")
    write_report(rep, tmp_path / "again", plots=False)
    assert not (tmp_path / "again" / "time_split.png").exists()
    # (session 64, a review) ... and an earlier interrupted run's report.partial.* beside it (they were left)
    assert not (tmp_path / "again" / "report.partial.json").exists()
    assert not (tmp_path / "again" / "report.partial.md").exists()
    # a report.json or report.md a bench did not write is refused before a run (both were replaced)
    from edgespec.bench import check_report_files

    check_report_files(tmp_path / "again")  # (a bench's own: taken)
    (tmp_path / "again" / "report.md").write_text("my notes beside a bench's report.json")
    with pytest.raises(ConfigError, match="report.md is not a report of edgespec bench"):
        check_report_files(tmp_path / "again")
    write_report(rep, tmp_path / "again", plots=False)
    check_report_files(tmp_path / "nothing-yet")
    for mine in ({"report.json": '{"mine": 1}'}, {"report.md": "my notes"},
                 {"report.md": "my notes", "report.json": "not json"}):
        notes = tmp_path / f"notes{len(mine)}{sorted(mine)[0]}"
        notes.mkdir()
        for name, text in mine.items():
            (notes / name).write_text(text)
        with pytest.raises(ConfigError, match="is not a report of edgespec bench; it is not replaced"):
            check_report_files(notes)
        assert all((notes / name).read_text() == text for name, text in mine.items())
    # (session 92, a review) nor a plot's name in a folder with no report of a bench's: a user's memory.png was
    # deleted as a stale plot (--no-plots) or overwritten; refused before a run, and left as it is by a report
    # written there all the same (scripts/bench_spec.py runs no check), with plots or without
    for plots in (False, True):
        pics = tmp_path / f"pics{plots}"
        pics.mkdir()
        (pics / "memory.png").write_bytes(b"my picture")
        (pics / "time_split.png").write_bytes(b"mine too")
        with pytest.raises(ConfigError, match=r"time_split.png is no plot of edgespec bench \(no report of one beside "
                                              r"it\); it is not replaced"):
            check_report_files(pics)
        capsys.readouterr()
        files = write_report(rep, pics, plots=plots)
        assert (pics / "memory.png").read_bytes() == b"my picture"
        assert (pics / "time_split.png").read_bytes() == b"mine too"
        assert pics / "memory.png" not in files and pics / "time_split.png" not in files
        assert "memory.png, time_split.png in " in capsys.readouterr().err
        assert (pics / "report.json").is_file()
        if plots:  # (the bench's other plots written beside them)
            assert (pics / "tokens_per_second.png").is_file() and pics / "tokens_per_second.png" in files
        # a report now beside them: they count as a bench's, a later report's to replace or take away
        check_report_files(pics)
    rep = run_bench(eng, prompts[:1], ["suffix"], max_new_tokens=4, in_process=["genai-ar"], log=lambda s: None)
    assert "the process's: genai-ar loaded into it too" in rep.markdown()


def test_width_curve_script_on_a_tiny_bundle(tiny_int4_bundle, tmp_path, capsys):
    """scripts/bench_width.py (the verify-width cost curve, README, Benchmarks: "target call, tokens per call") runs on a
    bundle as the runtime opens it and writes every width it was asked for, raw and under the
    measured width policy, and the drafter's step."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import bench_width

    out = tmp_path / "w.json"
    assert bench_width.main([str(tiny_int4_bundle), "--widths", "1-3,5", "--context", "16", "--reps", "2",
                             "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert sorted(int(w) for w in d["raw_ms"]) == [1, 2, 3, 5] == sorted(int(w) for w in d["policy_ms"])
    assert all(v > 0 for v in d["raw_ms"].values()) and d["drafter_step_ms"] is not None
    assert tuple(d["policy"]) != (1, 1)  # the CPU EP's INT4 graph needs at least two positions a call
    assert "| 5 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench_width.main([str(tiny_int4_bundle), "--widths", "0-2"])


def test_replay_policy_prices_the_rounds_the_same_every_run(tiny_bundle, tmp_path, capsys):
    """scripts/replay_policy.py (session 64: a timing-free A/B of the round policy): the policy's costs frozen at the
    given prices, every call of the target and the drafter while decoding priced at them, so two runs give the same
    figures; plain decoding's time is its calls at the one-token price (and the round's Python time); every output
    checked against plain decoding."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import replay_policy

    runs = []
    for i in range(2):
        out = tmp_path / f"r{i}.json"
        assert replay_policy.main([str(tiny_bundle), "--categories", "code", "--per-category", "1",
                                   "--max-new-tokens", "40", "--drafters", "none,model,auto", "--read-ms", "0.02",
                                   "--target-ms", '{"1": 10, "4": 10, "8": 20}', "--step-ms", "3",
                                   "--round-ms", "0.5", "--json", str(out)]) == 0
        runs.append(json.loads(out.read_text()))
    assert runs[0] == runs[1]
    rows = {r["drafter"]: r for r in runs[0]}
    assert all(r["exact"] for r in runs[0] if r["drafter"] != "none")
    none = rows["none"]  # (one call a round, of one token unless a free draft fills a second: 10 ms either way)
    assert none["drafter_calls"] == 0 and none["target_calls"] == none["rounds_run"] > 0
    assert none["ms"] == pytest.approx(10.5 * none["target_calls"])
    assert rows["model"]["drafter_calls"] > 0
    assert "| code |" in capsys.readouterr().out
    class Recursing:  # (OnnxLM._run's argmax through the copied logits calls _run again: one call, priced once)
        def _run(self, ids, past, argmax=False, positions=None):
            return self._run(ids, past, positions=positions) if argmax else ids

    lm = Recursing()
    meter = replay_policy.Meter(lm, lambda n: 10.0 * n, alt_ms=1.0)
    meter.on = True
    lm._run([1, 2, 3, 4], 0, argmax=True, positions=[0, 1, 2, 1])  # 3 causal rows and an alternate
    assert meter.calls == 1 and meter.ms == pytest.approx(41.0)
    assert replay_policy.target_price({1: 10.0, 4: 10.0, 8: 20.0})(6) == pytest.approx(15.0)
    assert replay_policy.target_price({1: 10.0, 4: 10.0, 8: 20.0})(10) == pytest.approx(25.0)
    with pytest.raises(SystemExit):
        replay_policy.main([str(tiny_bundle), "--drafters", "nonesuch"])
    # sampled (session 65): seeds 0..N-1 a prompt and drafter, the same figures every run, no exactness check
    sampled = []
    for i in range(2):
        out = tmp_path / f"s{i}.json"
        assert replay_policy.main([str(tiny_bundle), "--categories", "code", "--per-category", "1",
                                   "--max-new-tokens", "24", "--drafters", "none,model", "--temperature", "1.0",
                                   "--seeds", "2", "--json", str(out)]) == 0
        sampled.append(json.loads(out.read_text()))
    assert sampled[0] == sampled[1]
    assert [(r["drafter"], r["seed"]) for r in sampled[0]] == [("none", 0), ("model", 0), ("none", 1), ("model", 1)]
    assert all(r["exact"] is None for r in sampled[0])
    # --unseeded-policy (session 66): the draws seeded, the policy an unseeded generation's (it learns from the
    # frozen prices and carries what it learns), still the same figures every run
    from edgespec.policy import RoundPolicy

    begin, seen, unseeded = RoundPolicy.begin, [], []

    def spy(self, *a, **kw):
        seen.append(kw.get("reproducible"))
        return begin(self, *a, **kw)

    RoundPolicy.begin = spy
    try:
        for i in range(2):
            out = tmp_path / f"u{i}.json"
            assert replay_policy.main([str(tiny_bundle), "--categories", "code", "--per-category", "1",
                                       "--max-new-tokens", "24", "--drafters", "model", "--temperature", "1.0",
                                       "--seeds", "2", "--unseeded-policy", "--json", str(out)]) == 0
            unseeded.append(json.loads(out.read_text()))
    finally:
        RoundPolicy.begin = begin
    assert unseeded[0] == unseeded[1] and seen == [False] * 4
    with pytest.raises(SystemExit):
        replay_policy.main([str(tiny_bundle), "--unseeded-policy"])  # (greedy generations are never seeded)
    with pytest.raises(SystemExit):
        replay_policy.main([str(tiny_bundle), "--temperature", "-1"])
    with pytest.raises(SystemExit):
        replay_policy.main([str(tiny_bundle), "--seeds", "3"])  # (greedy: one reply a prompt)
    # (session 73) top_p 0 at a temperature above 0 is greedy decoding (SamplingParams.greedy, session 72): one
    # reply a prompt, checked exact against plain decoding, not a sampled run left unchecked
    out = tmp_path / "p0.json"
    assert replay_policy.main([str(tiny_bundle), "--categories", "code", "--per-category", "1", "--max-new-tokens",
                               "24", "--drafters", "none,model", "--temperature", "0.7", "--top-p", "0",
                               "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["drafter"] for r in rows] == ["none", "model"] and rows[1]["exact"] is True
    for bad in (["--temperature", "0.7", "--top-p", "0", "--seeds", "2"], ["--temperature", "0.7", "--top-p", "1.5"],
                ["--top-p", "0"]):
        with pytest.raises(SystemExit):
            replay_policy.main([str(tiny_bundle), *bad])


def test_replay_policy_replays_the_traffic_workload(smol_int4, tmp_path):
    """(session 92) ``replay_policy.py --traffic``: scripts/bench_traffic.py's workload (repeated requests, the
    code-editing session, questions over the manual) priced at fixed costs, with its memory (each request's plain
    reply remembered) and documents: the same figures every run, plain decoding first whatever the order asked,
    every output exact; a request asked again word for word is recalled from the memory."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import replay_policy

    runs = []
    for i in range(2):
        out = tmp_path / f"t{i}.json"
        assert replay_policy.main([str(smol_int4), "--traffic", "--limit", "1", "--drafters", "suffix",
                                   "--max-new-tokens", "8", "--json", str(out)]) == 0
        runs.append(json.loads(out.read_text()))
    assert runs[0] == runs[1]
    rows = runs[0]
    assert [r["drafter"] for r in rows[:2]] == ["none", "suffix"] and len(rows) == 2 * (3 + 4 + 8)
    assert list(dict.fromkeys(r["category"] for r in rows)) == ["repeat-first", "repeat-again", "repeat-same",
                                                                  "code-edit", "rag"]
    assert all(r["exact"] for r in rows if r["drafter"] == "suffix")
    same = {r["drafter"]: r for r in rows if r["category"] == "repeat-same"}
    # (its reply recalled whole: one round drafts the rest of it; from the prompt alone it took 6 calls)
    assert same["suffix"]["target_calls"] <= 2 < same["none"]["target_calls"], same
    for bad in (["--traffic", "--categories", "code"], ["--traffic", "--temperature", "0.7"], ["--traffic", "--fresh"],
                ["--limit", "1"], ["--traffic", "--limit", "0"]):
        with pytest.raises(SystemExit):
            replay_policy.main([str(smol_int4), *bad])


def test_probe_width_ops_names_the_operator_behind_the_width_policy(tiny_int4_bundle, capsys):
    """scripts/probe_width_ops.py finds the first node whose output for a shared position differs
    between a one-token call and a wider one (docs/how-it-works.md, Exactness); on the CPU EP's INT4 graph the
    logits of widths 1 and 2 differ (the policy's premise) and the report names an operator."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import probe_width_ops

    r = probe_width_ops.probe(str(tiny_int4_bundle), widths=(1, 2, 3))
    assert (1, 2) not in r["logits_agree"] and (2, 3) in r["logits_agree"]
    first = r["first_differing"][0]
    assert first["op"] in {"GroupQueryAttention", "MatMulNBits", "MatMul"} and (1, 2) in first["pairs"]
    assert probe_width_ops.main([str(tiny_int4_bundle), "--widths", "1", "2", "--show", "1"]) == 0
    assert "differ" in capsys.readouterr().out


def test_ab_bundles_script_compares_two_bundles_and_flags_a_different_target(tiny_bundle, tiny_int4_bundle,
                                                                             tmp_path, capsys):
    """scripts/ab_bundles.py (the reduced-vocabulary A/B in the README) alternates two bundles per
    prompt: a bundle against itself is exact and prints a B/A ratio per runner; two bundles whose
    targets differ (fp32 against INT4) are each exact against their own plain decoding, and their
    plain outputs are said to differ (exit 0), but caught as greedy mismatches under --same-target
    (exit 1); a missing bundle is a one-line error (exit 2)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import ab_bundles

    small = ["--drafters", "model,auto", "--per-category", "1", "--max-new-tokens", "8"]
    assert ab_bundles.main([str(tiny_int4_bundle), str(tiny_int4_bundle), *small]) == 0
    out = capsys.readouterr().out
    assert "| all |" in out and "model B/A" in out and "auto B/A" in out and "none B/A" in out
    assert "B's output equals A's on every prompt" in out
    assert ab_bundles.main([str(tiny_bundle), str(tiny_int4_bundle), *small]) == 0
    out = capsys.readouterr()
    assert "B's output differs from A's" in out.out and "MISMATCH" not in out.err
    assert ab_bundles.main([str(tiny_bundle), str(tiny_int4_bundle), *small, "--same-target"]) == 1
    assert "MISMATCH" in capsys.readouterr().err
    plain = ["--drafters", "none", "--per-category", "1", "--max-new-tokens", "8", "--same-target"]
    assert ab_bundles.main([str(tiny_bundle), str(tiny_int4_bundle), *plain]) == 1  # plain decoding alone, too
    assert "MISMATCH: none-B" in capsys.readouterr().err
    assert ab_bundles.main([str(tiny_int4_bundle), str(tiny_int4_bundle), *small, "--prompts", str(tmp_path / "no")]) == 2
    assert capsys.readouterr().err.startswith("error: no such prompt file")
    assert ab_bundles.main([str(tmp_path / "missing"), str(tiny_int4_bundle), *small]) == 2
    assert capsys.readouterr().err.startswith("error:")


def test_bench_chatui_runs_a_front_ends_traffic_on_a_tiny_bundle(tiny_int4_bundle, tmp_path, capsys, monkeypatch):
    """scripts/bench_chatui.py (docs/bench/machines.md, "A chat front end's traffic"): each reply, then the short requests
    about it, on two engines whose policies price the model drafter's read differently (A: the rule before
    session 32, patched in), every run exact (exit 0), a row per kind of request; bad --tasks: exit 2."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import bench_chatui

    monkeypatch.setitem(bench_chatui.TASKS, "title", (bench_chatui.TASKS["title"][0], 16))  # (a 256-token context)
    out, prompts = tmp_path / "c.json", tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": f"q{i}", "category": c, "turns": [q]}) + "\n" for i, (c, q) in
                               enumerate([("code", "Write a loop."), ("qa", "Why is the sky blue?")])))
    assert bench_chatui.main([str(tiny_int4_bundle), "--prompts", str(prompts), "--max-new-tokens", "12",
                              "--tasks", "title", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| reply |" in table and "| title |" in table and "| all |" in table and "plain decoding: yes" in table
    runs = json.loads(out.read_text())
    assert {r["runner"] for r in runs} == {"none-A", "none-B", "auto-A", "auto-B"} and all(r["same"] for r in runs)
    assert {r["kind"] for r in runs} == {"reply", "title"}
    with pytest.raises(SystemExit) as e:
        bench_chatui.main([str(tiny_int4_bundle), "--tasks", "poem"])
    assert e.value.code == 2
    # A's rule is the old one: the average length less what was produced, at least 16
    from edgespec.policy import RoundPolicy

    pol = RoundPolicy()
    pol._lengths.extend([100, 10, 10])
    pol._produced = 30
    avg = (10 + 0.7 * 10 + 0.49 * 100) / (1 + 0.7 + 0.49)
    assert bench_chatui.averaged_horizon(pol, 199) == 16 and pol.horizon(199) == 70
    pol._produced = 0
    assert bench_chatui.averaged_horizon(pol, 199) == pytest.approx(avg)


def test_ab_bundles_policy_options_set_each_sides_round_policy(tiny_int4_bundle, capsys, monkeypatch):
    """--policy-a/--policy-b (session 25: a policy A/B on one bundle) set RoundPolicy parameters on
    one side only, both sides stay exact, the header names them; an unknown name or a value that is
    not a number is a one-line usage error (exit 2)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import ab_bundles
    import edgespec

    seen = []
    real = edgespec.load

    def load(*a, **kw):
        e = real(*a, **kw)
        seen.append(e)
        return e

    monkeypatch.setattr(edgespec, "load", load)
    small = ["--drafters", "auto", "--per-category", "1", "--max-new-tokens", "8", "--same-target"]
    b = str(tiny_int4_bundle)
    assert ab_bundles.main([b, b, *small, "--policy-a", "share_prior=1e12,probe_every=8"]) == 0
    out = capsys.readouterr().out
    assert "(policy share_prior=1e12,probe_every=8)" in out and "every drafter's output equals" in out
    a, bb = seen[-2].decoder.policy, seen[-1].decoder.policy
    assert (a.share_prior, a.probe_every) == (1e12, 8) and (bb.share_prior, bb.probe_every) == (1.0, 64)
    for bad in ("nope=1", "share_prior", "share_prior=x", "share_prior=0"):
        with pytest.raises(SystemExit) as e:
            ab_bundles.main([b, b, *small, "--policy-b", bad])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert not err.startswith("usage: ") and ("policy parameter" in err or "share_prior" in err)


def test_probe_sampling_cost_times_the_sampler_in_and_out_of_the_loop(tiny_bundle, tmp_path, capsys):
    """scripts/probe_sampling_cost.py (README, autoregressive decoding: sampling's cost inside the
    loop) times ``distribution`` on every sampled row of a real decoding run and again on copies of
    those rows; the run's sampling is restored afterwards, and bad input is a one-line error."""
    import sys
    from pathlib import Path

    from edgespec import sampling, verify

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import probe_sampling_cost

    r = probe_sampling_cost.probe(str(tiny_bundle), tokens=6, temperature=0.7, top_p=0.8)
    assert r["rows"] == 5 and r["in_loop_us"] > 0 and r["tight_loop_us"] > 0
    assert 0 < r["outside_run_us"] < r["token_us"]
    assert verify.distribution is sampling.distribution
    assert probe_sampling_cost.main([str(tiny_bundle), "--tokens", "4"]) == 0
    assert "tight loop" in capsys.readouterr().out
    assert probe_sampling_cost.main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("error:")
    with pytest.raises(SystemExit):
        probe_sampling_cost.main([str(tiny_bundle), "--temperature", "0"])


def test_probe_draft_stop_collects_positions_and_simulates_rules(tiny_int4_bundle, capsys):
    """scripts/probe_draft_stop.py (README, dynamic model drafts): one row per output position with
    an acceptance and the drafter's top probability, and a round simulation whose arithmetic is
    checked on rows where everything is accepted."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import probe_draft_stop as pds

    rows = pds.collect(str(tiny_int4_bundle), 0.0, 6, limit=2)
    assert rows.shape == (12, 4) and set(np.unique(rows[:, 1])) <= {0.0, 1.0} and (rows[:, 2] <= 1).all()
    assert (rows[:, 3] == rows[:, 1]).all()  # greedy: the argmax is the draft
    sampled = pds.collect(str(tiny_int4_bundle), 0.8, 6, limit=1)
    assert ((sampled[:, 1] > 0) & (sampled[:, 1] <= 1 + 1e-9)).all()
    assert ((sampled[:, 3] > 0) & (sampled[:, 3] <= 1 + 1e-9)).all() and (sampled[:, 3] != sampled[:, 1]).any()
    sure = np.array([(0, 1.0, 1.0, 1.0)] * 9)  # 9 positions, all accepted: one round of 8 drafts and a bonus
    widths = [0] + [1.0 + 0.1 * (w - 1) for w in range(1, 17)]
    assert pds.simulate(sure, 0.25, widths, pds.cumulative(0.5)) == pytest.approx(9 / (8 * 0.25 + 1.8))
    assert pds.simulate(sure, 0.25, widths, pds.fixed(2, 0.5)) == pytest.approx(9 / (3 * (2 * 0.25 + 1.2)))
    assert pds.main([str(tiny_int4_bundle), "--tokens", "4", "--limit", "1"]) == 0
    assert "cumulative stop theta=0.5" in capsys.readouterr().out
    assert pds.main([str(tiny_int4_bundle), "--tokens", "4", "--limit", "1", "--temperature", "0.8"]) == 0
    assert "argmax drafted as a point mass instead" in capsys.readouterr().out


def test_probe_draft_temperature_prints_the_acceptance_by_drafter_temperature(tiny_int4_bundle, capsys):
    """scripts/probe_draft_temperature.py (session 32): sum(min(p, q)) per factor, in (0, 1], the same at the
    factor 1 as probe_draft_stop's sampled acceptance; bad numbers are a usage error (exit 2)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import probe_draft_stop as pds
    import probe_draft_temperature as pdt

    import edgespec

    eng = edgespec.load(tiny_int4_bundle, memory=False)
    res = pdt.collect(eng, 0.8, [0.5, 1.0], 6, per_category=1)
    r = res["all"]
    assert 0 < r[-1] <= 6 * len([c for c in res if c != "all"])  # positions: at most 6 a prompt
    assert 0 < r[0] <= r[-1] and 0 < r[1] <= r[-1] and r[0] != r[1]
    rows = pds.collect(str(tiny_int4_bundle), 0.8, 6, limit=1)  # the first prompt, the same seed
    first = next(c for c in res if c != "all")
    assert res[first][1] == pytest.approx(rows[:, 1].sum(), rel=1e-6)
    assert pdt.main([str(tiny_int4_bundle), "--temperatures", "1.0", "--factors", "0.8,1", "--tokens", "4",
                     "--per-category", "1"]) == 0
    assert "| 1 | all |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        pdt.main([str(tiny_int4_bundle), "--factors", "x"])
    assert e.value.code == 2


def test_bench_spec_passes_repeat_the_prompt_set_under_new_names(tiny_bundle, tmp_path, capsys):
    """scripts/bench_spec.py --passes N: the prompt set N times (sampled figures from more samples),
    every repeat its own run in the report; a pass count below 1 is refused."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import bench_spec

    qs = [{"question_id": "a", "category": "x", "turns": ["t"]}, {"question_id": "b", "category": "y", "turns": ["u"]}]
    assert [q["question_id"] for q in bench_spec.repeat_passes(qs, 3)] == ["a", "b", "a#2", "b#2", "a#3", "b#3"]
    assert bench_spec.repeat_passes(qs, 1) == qs
    out = tmp_path / "r"
    assert bench_spec.main([str(tiny_bundle), "--drafters", "prompt-lookup", "--no-genai", "--categories", "code",
                            "--max-new-tokens", "4", "--passes", "2", "--temperature", "0.8", "--no-plots",
                            "--out", str(out)]) == 0
    runs = json.loads((out / "report.json").read_text())["runs"]
    ids = [r["question_id"] for r in runs if r["drafter"] == "none"]
    assert len(ids) == 2 and ids[1] == ids[0] + "#2"
    with pytest.raises(SystemExit):
        bench_spec.main([str(tiny_bundle), "--passes", "0", "--no-genai"])
    # --seed (session 65): every sampled generation seeded, so a run's replies repeat; refused without sampling
    seeded = []
    for i in range(2):
        assert bench_spec.main([str(tiny_bundle), "--drafters", "model", "--no-genai", "--categories", "code",
                                "--max-new-tokens", "12", "--temperature", "1.0", "--seed", "7", "--no-plots",
                                "--out", str(tmp_path / f"s{i}")]) == 0
        seeded.append([(r["drafter"], r["new_tokens"], r["drafted"], r["accepted"], r["rounds"])
                       for r in json.loads((tmp_path / f"s{i}" / "report.json").read_text())["runs"]])
    assert seeded[0] == seeded[1] and any(d == "model" and n > 0 for d, n, *_ in seeded[0])
    with pytest.raises(SystemExit):
        bench_spec.main([str(tiny_bundle), "--seed", "7", "--no-genai"])


def test_probe_close_memory_runs_both_ways(tiny_bundle):
    """scripts/probe_close_memory.py (README, Python API: Engine.close) runs its cycles with ``del`` and with
    ``close`` in fresh processes, one line a cycle and way; a missing bundle is a non-zero exit."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "probe_close_memory.py"
    r = subprocess.run([sys.executable, str(script), str(tiny_bundle), "--cycles", "2"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == ["del", "del", "close", "close"]
    assert all("loaded" in ln and "after" in ln for ln in lines)
    r = subprocess.run([sys.executable, str(script), str(Path(tiny_bundle).parent / "missing")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("error:") and "no such bundle" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_probe_drafter_cache_times_a_step_after_each_kind_of_call(tiny_bundle, tmp_path, capsys):
    """scripts/probe_drafter_cache.py (docs/bench/sessions.md, session 20: the drafter's first step after a target call)
    prints a median step time for each thing run before it; bad input is a one-line error."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import probe_drafter_cache

    res = probe_drafter_cache.probe(str(tiny_bundle), reps=3, sweep_mib=8)
    assert list(res) == ["back to back", "after a target call", "after a 8 MiB sweep", "after a 16 MiB sweep",
                         "after a 2 ms sleep"]
    assert all(v > 0 for v in res.values())
    assert probe_drafter_cache.main([str(tiny_bundle), "--reps", "2", "--sweep-mib", "4"]) == 0
    assert capsys.readouterr().out.count("drafter step") == 5
    assert probe_drafter_cache.main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("error:")
    with pytest.raises(SystemExit):
        probe_drafter_cache.main([str(tiny_bundle), "--reps", "0"])


def test_probe_llamacpp_refuses_bad_input_in_one_line(tiny_bundle, tmp_path, capsys):
    """scripts/probe_llamacpp.py (README, Benchmarks: why llama.cpp decodes as it does here) needs llama.cpp,
    which CI does not build: its bad input is checked here, its runs where llama-server exists."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import probe_llamacpp

    assert probe_llamacpp.main([str(tmp_path / "none.gguf"), "--tokenizer", str(tiny_bundle)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no such GGUF file") and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit):
        probe_llamacpp.main([str(tmp_path / "none.gguf"), "--tokenizer", str(tiny_bundle), "--reps", "0"])
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"GGUF")
    from llamacpp_baseline import SERVER

    if not SERVER.is_file():
        assert probe_llamacpp.main([str(fake), "--tokenizer", str(tiny_bundle)]) == 2
        assert "build_llamacpp.sh" in capsys.readouterr().err
    else:  # llama.cpp is built here: a bundle that is not one is refused before any server starts
        assert probe_llamacpp.main([str(fake), "--tokenizer", str(tmp_path / "no-bundle")]) == 2
        assert "no such bundle" in capsys.readouterr().err


def test_profile_ops_splits_a_call_by_operator(tiny_bundle, tmp_path, capsys, monkeypatch):
    """scripts/profile_ops.py (sessions 17 and 23) times one-token calls of the drafter or the target
    after --context tokens under onnxruntime's profiler and prints their operators' shares; a missing
    bundle or a context past the model's is a one-line error, a bad option a usage error. The profiler's
    files are removed after each run, failed ones included (each run left ~0.4 MB in /tmp before)."""
    import sys
    import tempfile
    from pathlib import Path

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import profile_ops

    r = profile_ops.profile(str(tiny_bundle), "target", context=20, calls=3)
    assert r["wall_ms"] > 0 and r["nodes"] > 0 and r["ops"] and 0 < r["kernels_ms"] <= r["model_run_ms"]
    assert r["calls_with_kernels"] == 3  # every timed call's kernels found inside its run
    assert all(ms >= 0 and n > 0 for ms, n in r["ops"].values())
    assert profile_ops.main([str(tiny_bundle), "--context", "16", "--calls", "2"]) == 0
    out = capsys.readouterr().out
    assert "drafter, one-token calls after 16 tokens" in out and "nodes/call" in out
    assert profile_ops.main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("error:")
    assert profile_ops.main([str(tiny_bundle), "target", "--context", "100000"]) == 2
    assert "does not fit" in capsys.readouterr().err
    for bad in (["--context", "0"], ["sideways"]):
        with pytest.raises(SystemExit):
            profile_ops.main([str(tiny_bundle), *bad])
    assert list(tmp.iterdir()) == []


def test_ab_calls_times_both_bundles_calls_alternating(tiny_bundle, tmp_path, capsys):
    """scripts/ab_calls.py (docs/bench/sessions.md, session 21: the fused bundle's call costs against the unfused one's)
    prints, per target width and for the drafter step, both bundles' medians and their ratio; bad input is a
    one-line error or a usage error."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import ab_calls

    res = ab_calls.measure([str(tiny_bundle), str(tiny_bundle)], [1, 3], reps=2, context=16)
    assert [sorted(r) for r in res] == [["drafter step", "target 1", "target 3"]] * 2
    assert all(v > 0 for r in res for v in r.values())
    assert ab_calls.main([str(tiny_bundle), str(tiny_bundle), "--widths", "1,2", "--reps", "2", "--context", "8"]) == 0
    out = capsys.readouterr().out
    assert out.count(" A ") == 3 and "target 2" in out
    assert ab_calls.main([str(tiny_bundle), str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("error:")
    for bad in (["--widths", "0"], ["--widths", "x"], ["--reps", "0"]):
        with pytest.raises(SystemExit):
            ab_calls.main([str(tiny_bundle), str(tiny_bundle), *bad])


def test_memory_reports_say_what_is_mapped_from_files(tmp_path):
    """proc_status reads RssFile beside VmHWM and VmRSS (kB in /proc, bytes out); the reports' memory line says
    how much of the resident set is file pages (clean, reclaimable), and nothing where /proc has no figure."""
    from edgespec.bench import file_part
    from edgespec.measure import file_rss, proc_status

    st = tmp_path / "status"
    st.write_text("Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssAnon:\t 512 kB\nRssFile:\t  300 kB\n")
    assert proc_status(st) == {"VmHWM": 2048 * 1024, "VmRSS": 1024 * 1024, "RssFile": 300 * 1024}
    assert proc_status(tmp_path / "missing") == {}
    assert file_part(None) == ""
    assert file_part(300 * 2**20) == " (at the end 300 MiB of it mapped from files: clean pages, reclaimable)"
    here = file_rss()
    assert here is None or here > 0  # this process maps its libraries


def test_this_process_s_memory_figures_agree_with_proc(tmp_path, monkeypatch):
    """(session 83, mutants E1-E3, E5, E7 of measure.py) The peak (ru_maxrss, KiB made bytes) agrees with /proc's
    VmHWM, the resident set now (statm's resident pages, not its virtual size) with VmRSS; a sample's high-water mark
    is VmHWM (above VmRSS once a large array was freed); a /proc line whose figure is no number is skipped; the high
    water is /proc's where it has one, else the peak."""
    import edgespec.measure as ms

    big = np.ones(256 << 20, np.uint8)  # 256 MiB touched, then freed: the high-water mark stays
    del big
    st = ms.proc_status()
    assert abs(ms.peak_rss() / st["VmHWM"] - 1) < 0.1, (ms.peak_rss(), st)
    assert abs(ms.rss_now() / ms.proc_status()["VmRSS"] - 1) < 0.1
    s = ms.sample("now")
    assert s.vm_hwm >= st["VmHWM"] and s.vm_hwm - s.rss > 128 << 20 and s.peak_rss > 0 and s.gpu is None
    f = tmp_path / "status"
    f.write_text("VmHWM:\t  ? kB\nVmRSS:\t\nRssFile:\t 3 kB\n")
    assert ms.proc_status(f) == {"RssFile": 3 * 1024}
    monkeypatch.setattr(ms, "proc_status", lambda: {"VmHWM": 5 << 20})
    assert ms.high_water_rss() == 5 << 20
    monkeypatch.setattr(ms, "proc_status", lambda: {})
    assert ms.high_water_rss() == ms.peak_rss()


def test_the_measured_prompt_fits_the_context_beside_the_decoded_tokens():
    """(session 83, mutants E9, E10) ``prompt_length``: what fills the context beside the decoded tokens by default, a
    prompt asked for kept where it fits and cut where it does not, and at least one token."""
    from edgespec.measure import prompt_length

    assert prompt_length(256) == 223 and prompt_length(256, 10) == 10 and prompt_length(256, 1000) == 223
    assert prompt_length(20) == 1 and prompt_length(20, 5) == 1 and prompt_length(256, 1000, 8) == 247


@pytest.mark.real
def test_bench_traffic_runs_the_workload_and_reports_exact_outputs_and_memory(smol_int4, tmp_path, capsys):
    """scripts/bench_traffic.py (issue #17's workload: README, Drafters that remember) on SmolLM2, one prompt a
    part: every run exact, the store's growth and memory reported, the resident memory with its file-mapped
    part; bad input is a one-line error (a missing bundle; a context too small for the workload) or a usage
    error."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import bench_traffic

    out = tmp_path / "traffic"
    # (`auto` alone beside `none`: each runner is 15 runs, most of their time the prefills of long prompts)
    assert bench_traffic.main([str(smol_int4), "--drafters", "auto", "--max-new-tokens", "8", "--limit", "1",
                               "--no-per-category", "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert set(rep["traffic"]) >= {"repeat-first", "repeat-again", "repeat-same", "code-edit", "rag", "all"}
    assert all(r["exact"] is not False for r in rep["runs"])
    assert {r["drafter"] for r in rep["runs"]} == {"none", "auto"}
    assert rep["memory"]["memory_tokens"] > 0 and rep["peak_rss"] > 0
    md = (out / "report.md").read_text()
    assert "| all | auto |" in md and "Peak resident memory" in md
    assert (rep["file_rss"] is not None) == ("mapped from files" in md)
    capsys.readouterr()
    assert bench_traffic.main([str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    with pytest.raises(SystemExit):
        bench_traffic.main([str(smol_int4), "--max-new-tokens", "0"])


def test_probe_alternates_counts_the_drafters_ranks_of_the_targets_tokens(tiny_bundle, tmp_path, capsys):
    """scripts/probe_alternates.py (session 26) prints, per category, the share of the target's greedy
    tokens at the drafter's first and second choice, and writes every rank with --out; a bad --prompts,
    a missing prompt file or bundle is a one-line error (exit 2)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import probe_alternates
    from edgespec.bench import DEFAULT_PROMPTS

    out = tmp_path / "ranks.json"
    assert probe_alternates.main([str(tiny_bundle), "--prompts", f"{DEFAULT_PROMPTS}:1", "--max-new-tokens", "6",
                                  "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| rank 1 where rank 0 failed |" in text and "| all |" in text
    ranks = json.loads(out.read_text())
    assert ranks and all(len(r["ranks"]) == 6 and all(x >= 0 for x in r["ranks"]) for r in ranks)
    _refused(probe_alternates.main, [[str(tiny_bundle), *bad] for bad in (
        ["--prompts", "nofile"], ["--prompts", f"{DEFAULT_PROMPTS}:0"], ["--prompts", f"{tmp_path}/x.jsonl:2"],
        ["--max-new-tokens", "100000"])], capsys)
    assert probe_alternates.main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("error:")
    with pytest.raises(SystemExit):
        probe_alternates.main([str(tiny_bundle), "--max-new-tokens", "0"])


def test_probe_free_alternates_counts_second_continuations(tiny_bundle, tmp_path, capsys):
    """scripts/probe_free_alternates.py (session 58) prints, per category, how often the context index's first guess
    and, where it missed, its second continuation were the target's greedy token; a prompt longer than the context is
    left out (said); a bad --prompts or a missing bundle is a one-line error (exit 2)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import probe_free_alternates
    from edgespec.bench import DEFAULT_PROMPTS

    assert probe_free_alternates.main([str(tiny_bundle), "--prompts", f"{DEFAULT_PROMPTS}:1", "--max-new-tokens",
                                       "8"]) == 0
    text = capsys.readouterr().out
    assert "| second continuation right (of wrong) |" in text and "| all |" in text
    assert probe_free_alternates.main([str(tiny_bundle), "--max-new-tokens", "100000"]) == 0
    assert "prompts longer than the context allows were left out" in capsys.readouterr().out
    _refused(probe_free_alternates.main, [[str(tiny_bundle), "--prompts", bad] for bad in (
        "nofile", f"{DEFAULT_PROMPTS}:0", f"{tmp_path}/x.jsonl:2")], capsys)
    assert probe_free_alternates.main([str(tmp_path / "missing")]) == 2


def test_check_exact_compares_every_drafter_with_greedy_decoding(tiny_int4_bundle, smol_int4, tmp_path, capsys):
    """scripts/check_exact.py (session 27) decodes each prompt with --drafter none and with each
    drafter and bound, and exits 0 when every output is greedy's; a planted width policy that lets
    one-token calls through on a kernel whose one-token path differs is reported (exit 1); bad
    arguments and bundles are one-line errors (exit 2)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import check_exact
    from edgespec.bench import DEFAULT_PROMPTS

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(DEFAULT_PROMPTS.read_text().splitlines()[:3]) + "\n")
    args = [str(tiny_int4_bundle), "--prompts", str(prompts), "--max-new-tokens", "24", "--max-draft", "4,12"]
    assert check_exact.main(args) == 0
    out = capsys.readouterr().out
    assert "width policy: at least 2" in out and "12 of 12 outputs equal to greedy decoding" in out
    # SmolLM2 INT4's one-token path differs on the CPU EP by up to ~0.7 in the logits (docs/how-it-works.md, Exactness):
    # forced one-token calls drift in these runs, and the script says where
    rc = check_exact.main([str(smol_int4), "--prompts", str(prompts), "--max-new-tokens", "48", "--max-draft", "4,12",
                           "--min-width", "1"])
    out = capsys.readouterr().out
    assert rc == 1 and "differs from greedy at token" in out
    _refused(check_exact.main, [args + bad for bad in (
        ["--max-draft", "x"], ["--max-draft", "0"], ["--drafters", "nope"], ["--prompts", str(tmp_path / "no")])], capsys)
    assert check_exact.main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("error:")
    with pytest.raises(SystemExit):
        check_exact.main([str(tiny_int4_bundle), "--max-new-tokens", "0"])


def test_bench_loop_times_the_choice_and_the_drafting_a_call(tiny_bundle, tmp_path, capsys):
    """scripts/bench_loop.py (session 27): per drafter and pass, target calls and the round policy's
    plus the drafting's milliseconds a call; bad arguments are one-line errors (exit 2)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import bench_loop

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": "r", "category": "code", "turns": ["one two three " * 6]}) + "\n")
    assert bench_loop.main([str(tiny_bundle), "--prompts", str(prompts), "--max-new-tokens", "16", "--passes", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all("choose+draft" in line and "ms a call" in line for line in out)
    _refused(bench_loop.main, [[str(tiny_bundle), "--prompts", str(prompts), *bad] for bad in (
        ["--drafters", "nope"], ["--max-draft", "0"], ["--prompts", str(tmp_path / "none")])], capsys)
    with pytest.raises(SystemExit):
        bench_loop.main([str(tiny_bundle), "--passes", "0"])


def test_bench_prompt_cache_runs_chats_in_turns_and_checks_the_replies(tiny_bundle, tmp_path, capsys):
    """scripts/bench_prompt_cache.py: the later turns restore their history (the 'on' passes), the
    replies are the same as without the prompt cache (exit 0), bad inputs are one-line errors (exit 2)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import bench_prompt_cache

    prompts = tmp_path / "chats.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [t]}) + "\n" for t in (
        "alpha beta gamma delta " * 3, "one two three four five " * 3, "red green blue " * 4)))
    out = tmp_path / "pc.json"
    assert bench_prompt_cache.main([str(tiny_bundle), "--prompts", str(prompts), "--turns", "2", "--passes", "1",
                                    "--max-new-tokens", "6", "--json", str(out), "--restart"]) == 0
    rep = json.loads(out.read_text())
    r = rep["restart"]
    assert r["same"] and r["file_bytes"] > 0 and r["file1"]["restored"] > 0 and r["file2"]["restored"] > 0
    assert r["none1"]["restored"] == 0 == r["none2"]["restored"]
    assert rep["same"] and "same replies with and without the prompt cache: yes" in capsys.readouterr().out
    on, off = rep["results"]["on"][0], rep["results"]["off"][0]
    assert off["summary"]["restored_tokens"] == 0 and on["summary"]["restored_tokens"] > 0
    assert all(r["restored"] > 0 for r in on["records"] if r["turn"] == 2)
    (tmp_path / "empty.jsonl").write_text("")
    _refused(bench_prompt_cache.main, [[str(tiny_bundle), "--prompts", str(tmp_path / "none.jsonl")],
                                       [str(tiny_bundle), "--prompts", str(tmp_path / "empty.jsonl")],
                                       [str(tmp_path / "no-bundle"), "--prompts", str(prompts)]], capsys)
    for bad in (["--turns", "0"], ["--prompt-cache-mb", "0"]):
        with pytest.raises(SystemExit):
            bench_prompt_cache.main([str(tiny_bundle), *bad])


def test_each_runner_learns_from_its_own_runs_only(tiny_bundle):
    """(session 45, a review) One engine runs every runner on a prompt in turn; its round policy (acceptance,
    recent reply lengths, costs) and the model drafter's calibration carried what earlier runners learned on that
    prompt into the later ones (`auto`, run last, began each prompt knowing its reply). Each runner now has its own:
    a runner's policy saw its own generations only, and the engine's is put back as it was found."""
    from edgespec import load
    from edgespec.bench import run_bench

    eng = load(tiny_bundle, memory=False)
    own = eng.decoder.policy
    found = own._generation
    seen, calls = {}, []
    real = eng.stream_ids

    def spy(ids, **kw):  # the policy each runner's generation starts from
        seen.setdefault(kw["drafter"], []).append((id(eng.decoder.policy), eng.decoder.policy._generation))
        calls.append(kw["drafter"])
        return real(ids, **kw)

    eng.stream_ids = spy
    prompts = [{"question_id": f"p{i}", "category": "code", "turns": [f"def f{i}(x):\n    return x + {i}\n" * 3]}
               for i in range(3)]
    rep = run_bench(eng, prompts, ["model", "prompt-lookup", "auto"], max_new_tokens=16, log=lambda s: None)
    assert all(r.exact for r in rep.runs if r.drafter != "none")
    # (session 56, a review) every runner is warmed up once before any is timed, on the engine's own state: a
    # warm-up of plain decoding alone left the drafter's and the wider calls' first costs to the first runner timed
    assert calls[:4] == ["none", "model", "prompt-lookup", "auto"], calls
    for name in ("none", "model", "prompt-lookup", "auto"):
        assert seen[name][0][0] == id(own)
        seen[name] = seen[name][1:]
    for name in ("model", "prompt-lookup", "auto"):
        ids = {pid for pid, _ in seen[name]}
        gens = [g for _, g in seen[name]]
        assert len(ids) == 1, name  # one policy a runner
        assert gens == [found, found + 1, found + 2], (name, gens)  # which saw its own generations only
    assert len({seen[n][0][0] for n in ("none", "model", "prompt-lookup", "auto")}) == 4
    assert eng.decoder.policy is own
    # the warm-ups sample as the bench does (a sampled bench's first runner paid its sampler's first calls)
    temps = []
    eng.stream_ids = lambda ids, **kw: temps.append(kw.get("temperature")) or real(ids, **kw)
    run_bench(eng, prompts[:1], ["prompt-lookup"], max_new_tokens=4, temperature=0.7, log=lambda s: None)
    assert temps == [0.7] * 4, temps  # (two warm-ups, two runs)


def test_a_prompt_the_context_cannot_hold_is_left_out_named_and_the_others_reported(tiny_bundle, tmp_path):
    """A prompt longer than the context stopped the whole bench at it (exit 3, every run before it lost): it is
    left out before anything runs, named in the log and the report; a later turn that outgrows the context (with
    the reply before it) ends its prompt there, its first turn kept. ``auto@8`` alone loads the drafter model it
    drafts with (``auto`` did, ``auto@8`` ran without it), and the report says its threads and profile."""
    prompts = tmp_path / "p.jsonl"
    rows = [{"question_id": "short", "category": "qa", "turns": ["Hi there"]},
            {"question_id": "long", "category": "qa", "turns": ["word " * 400]},
            {"question_id": "grows", "category": "qa", "turns": ["Hello", "more " * 100]}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "o"
    r = CliRunner().invoke(main, ["bench", str(tiny_bundle), "--prompts", str(prompts), "--max-context", "128",
                                  "--max-new-tokens", "4", "--drafters", "auto@8", "--threads", "1", "--no-plots",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["left_out"] == ["long", "grows turn 2"], rep["left_out"]
    assert sorted({(x["question_id"], x["turn"]) for x in rep["runs"]}) == [("grows", 0), ("short", 0)]
    assert "left out long: its prompt has" in r.stderr and "grows turn 2 left out" in r.stderr
    assert "Left out (longer than the context): long, grows turn 2." in (out / "report.md").read_text()
    assert rep["plan"]["drafter"] == "model" and "drafter" in rep["plan"]["weights"], rep["plan"]
    # (whether auto@8 then drafts with it on 4-token replies is the round policy's choice from measured costs, a
    # timing: session 49's suite on a slower CPU saw it draft without; the plan above is what this test is about)
    assert all(x["drafter"] in ("none", "auto@8") for x in rep["runs"])
    s = rep["settings"]
    assert s["profile"] == "default" and s["threads"] in (1, 0, 2) and s["max_draft_tokens"] >= 1
    assert f"{s['threads']} threads · " in (out / "report.md").read_text() or not s["threads"]
    # no prompt fits: an error (a report of no runs, exit 0, said nothing was measured)
    prompts.write_text(json.dumps(rows[1]) + "\n")
    r = CliRunner().invoke(main, ["bench", str(tiny_bundle), "--prompts", str(prompts), "--max-context", "128",
                                  "--max-new-tokens", "4", "--drafters", "prompt-lookup", "--no-plots",
                                  "--out", str(tmp_path / "none")])
    assert r.exit_code == 3 and "no prompt fits the context of" in r.stderr


def test_the_benchmark_scripts_refuse_bad_input_in_one_line_before_loading(tmp_path, capsys, monkeypatch, tiny_bundle,
                                                                           copy_bundle):
    """The scripts the README's figures cite ended bad input in a traceback (a missing bundle, prompts file or
    category, an unknown drafter, --reps 0: statistics' 'no median'), the prompts' and drafters' only once the model
    (and genai) had loaded; --llamacpp beside --temperature was dropped without a word: exit 2, one 'error:' line."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import bench_ar
    import bench_spec
    import profile_widths

    import edgespec
    loads = []
    monkeypatch.setattr(edgespec, "load", lambda *a, **k: loads.append(a) or pytest.fail("loaded"))
    missing = str(tmp_path / "no-bundle")
    _refused(bench_spec.main, [[missing, "--prompts", str(tmp_path / "none.jsonl")],
                               [missing, "--categories", "nosuch"], [missing, "--drafters", "foo"],
                               [missing, "--drafters", "auto,auto"]], capsys)
    # (session 49, a review) tracebacks once the model and genai had loaded
    monkeypatch.setattr(bench_spec, "SERVER", Path(__file__))  # (as if llama.cpp were built: the checks after it)
    for argv, msg in ((["--genai-k", "0"], "--genai-k"), (["--genai-k", "17"], "--genai-k"),
                      (["--ngram-size", "1"], "--ngram-size"), (["--llamacpp", "--llamacpp-draft-k", "a"], "draft-k"),
                      (["--llamacpp", "--llamacpp-target", missing], "--llamacpp-target: no such file")):
        with pytest.raises(SystemExit) as e:
            bench_spec.main([missing, *argv])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "error:" in err and msg in err, (argv, err)
    # (session 57) genai's runs on a bundle without genai_config.json (an exact-kernels one): a traceback once the
    # model and llama.cpp had loaded
    nogenai = copy_bundle(tiny_bundle)
    (nogenai / "target" / "genai_config.json").unlink()
    with pytest.raises(SystemExit) as e:
        bench_spec.main([str(nogenai)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "error:" in err and "--no-genai" in err, err
    for argv in (["--no-genai"], ["--temperature", "0.7"]):  # (no genai runs: on to the model's load)
        with pytest.raises(pytest.fail.Exception, match="loaded"):
            bench_spec.main([str(nogenai), *argv])
    assert len(loads) == 2
    loads.clear()
    # ... and its draft-model run on a drafter without one (a drafter-vocab cut): left out, said (a traceback)
    assert "genai-draft:4" in bench_spec.genai_runners(tiny_bundle, 4, 3, True, None)
    (nogenai / "drafter" / "genai_config.json").unlink()
    assert set(bench_spec.genai_runners(nogenai, 4, 3, True, None)) == {"genai-ar", "genai-ngram:4"}
    assert "no genai-draft:4 run" in capsys.readouterr().err
    monkeypatch.undo()
    for script, argv in ((bench_spec, [missing]), (bench_ar, [missing]), (profile_widths, [missing])):
        _refused(script.main, [argv], capsys)
    for script, argv in ((bench_ar, [missing, "--reps", "0"]), (bench_spec, [missing, "--llamacpp", "--temperature",
                                                                            "0.7"])):
        with pytest.raises(SystemExit) as e:
            script.main(argv)
        assert e.value.code == 2 and "error:" in capsys.readouterr().err
    assert not loads


def test_a_report_file_name_that_is_a_folder_is_refused_before_the_bench(tiny_bundle, tmp_path):
    """(session 55, a review) --out's report.json a folder: the whole bench ran, then its report was lost to an error
    naming a temporary file. Refused before it runs, the file named; a write that fails later names its file too."""
    from click.testing import CliRunner

    from edgespec.integrity import write_whole
    from edgespec.cli import main

    (tmp_path / "rep" / "report.json").mkdir(parents=True)
    r = CliRunner().invoke(main, ["bench", str(tiny_bundle), "--limit", "1", "--max-new-tokens", "4", "--drafters",
                                  "prompt-lookup", "--out", str(tmp_path / "rep"), "--no-plots"])
    assert r.exit_code == 2 and "bench:" not in r.stderr, r.output  # (before the bench's first line)
    assert r.stderr.strip() == f"error: cannot write the report to {tmp_path / 'rep' / 'report.json'}: it is a folder"
    with pytest.raises(OSError, match=r"cannot write .*report\.json: Is a directory"):
        write_whole(tmp_path / "rep" / "report.json", "{}")
    assert not [p for p in (tmp_path / "rep").iterdir() if p.name.startswith(".")]  # (no temporary file left)
    # (session 57) --out a file: "File exists" said nothing; the file is left as it was
    (tmp_path / "notes.txt").write_text("mine")
    r = CliRunner().invoke(main, ["bench", str(tiny_bundle), "--limit", "1", "--max-new-tokens", "4", "--drafters",
                                  "prompt-lookup", "--out", str(tmp_path / "notes.txt"), "--no-plots"])
    assert r.exit_code == 2 and r.stderr.strip().endswith("it is a file; --out names a folder"), r.output
    assert (tmp_path / "notes.txt").read_text() == "mine"
    # ... and plots where no runner drafted: matplotlib's empty-legend warning reached the user
    import warnings

    from edgespec.bench import Report, Run, _plots

    runs = [Run("q", "code", 1, d, 4, 1.0, 0.1, 30.0, 30.0, 0, 0, 0, 4, 0.0, 0.1, 0.0, [], [], True)
            for d in ("none", "prompt-lookup")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (tmp_path / "plots").mkdir()
        made = _plots(Report("b", {}, {}, runs), tmp_path / "plots")
    assert tmp_path / "plots" / "acceptance_by_position.png" in made


def test_bench_checks_its_drafters_bound_and_report_folder_before_loading(tiny_bundle, tmp_path, cli_load_args,
                                                                          monkeypatch):
    """(session 99, a second mutation pass of cli.py: CL24, CL25, CL137-CL140, CL142, CL145, CL148) Before the models
    load: --drafters' names are taken with spaces around them, --draft-tokens up to its bound (then they load with no
    prompt cache and --drafter-provider's), and a --out that cannot be made is refused: one under a file or a link
    to nothing (named), in a folder this process may not enter; once they have loaded, a folder where no file can
    be made."""
    import errno
    import os
    import tempfile

    from conftest import LoadCalled
    from edgespec.cli import _check_writable
    from edgespec.profiles import MAX_DRAFT

    def bench(*args):
        return CliRunner().invoke(main, ["bench", str(tiny_bundle), "--no-plots", "--limit", "1", *map(str, args)])

    r = bench("--drafters", "prompt-lookup, none", "--draft-tokens", MAX_DRAFT, "--out", tmp_path / "r",
              "--drafter-provider", "cpu")
    assert isinstance(r.exception, LoadCalled), r.output
    # (CL24, CL25) loaded with no prompt cache (the report's memory is compared with the plan, which leaves it out)
    # and the drafter's provider
    assert cli_load_args["prompt_cache_mb"] == 0 and cli_load_args["drafter_provider"] == "cpu", cli_load_args
    (tmp_path / "file").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")
    for near in (tmp_path / "file", tmp_path / "dangling"):
        r = bench("--out", near / "sub")
        assert r.exit_code == 2 and r.stderr == f"error: cannot write the report to {near / 'sub'}: {near} is not a " \
            "folder\n", r.output
    real = os.access  # (root may enter any folder: the check's own question is answered no)
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if str(p) == str(tmp_path) and
                        mode == os.W_OK | os.X_OK else real(p, mode, **k))
    r = bench("--out", tmp_path / "new")
    assert r.stderr == f"error: cannot write the report to {tmp_path / 'new'}: {tmp_path} is not writable\n", r.output
    monkeypatch.setattr(os, "access", real)

    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    with pytest.raises(ConfigError, match=r"cannot write the report to .*/made: Read-only file system$"):
        _check_writable(str(tmp_path / "made"))


def test_bench_spec_closes_llama_servers_whatever_ends_the_run(tiny_bundle, tmp_path, monkeypatch):
    """(session 57) an error after llama.cpp's servers had started and before the bench's own try (genai's warm-up:
    its bundle had no genai_config.json) left two llama-server processes running after the script had exited. They
    are closed whatever ends the run now; and a later server that fails to start closes the ones started."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import bench_spec
    import llamacpp_baseline

    closed = []

    def fail(ids, n):
        raise RuntimeError("warm-up failed")

    monkeypatch.setattr(bench_spec, "SERVER", Path(__file__))
    monkeypatch.setattr(bench_spec, "llamacpp_runners", lambda *a, **k: ({"llama-ar": fail}, lambda: closed.append(1)))
    (tmp_path / "t.gguf").write_bytes(b"GGUF")
    with pytest.raises(RuntimeError, match="warm-up failed"):
        bench_spec.main([str(tiny_bundle), "--no-genai", "--llamacpp", "--llamacpp-target", str(tmp_path / "t.gguf"),
                         "--llamacpp-draft-k", "", "--out", str(tmp_path / "out"), "--categories", "code",
                         "--per-category", "1"])
    assert closed == [1]

    started = []

    class Server:
        def __init__(self, model, **kw):
            if started:
                raise RuntimeError("llama-server exited (1)")
            started.append(self)
            self.closed = False

        def close(self):
            self.closed = True

    monkeypatch.setattr(llamacpp_baseline, "LlamaServer", Server)
    with pytest.raises(RuntimeError, match="exited"):
        llamacpp_baseline.llamacpp_runners("t.gguf", None, threads=2, ctx=64)
    assert len(started) == 1 and started[0].closed


def test_bench_stopped_by_sigterm_keeps_its_runs_and_a_failed_one_leaves_no_folder(tiny_bundle, tmp_path, monkeypatch):
    """Session 65, a review: `timeout`, CI or a closed ssh session (SIGTERM, SIGHUP) ended bench at once, exit 143
    without a word, its finished runs lost and an empty --out folder left; Ctrl-C wrote them. Now both write the
    runs done and say the bench was terminated; a bench that fails before a run removes the folder it made."""
    import os
    import signal

    import edgespec.bench as bench_mod
    from edgespec.cli import main

    real = bench_mod._bench_prompts

    def term_after_two(engine, prompts, order, parsed, external, rep, states, sfx, log, **kw):
        def log2(line):
            log(line)
            if len(rep.runs) >= 2:
                os.kill(os.getpid(), signal.SIGTERM)

        return real(engine, prompts, order, parsed, external, rep, states, sfx, log2, **kw)

    if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:  # (a runner's own handler: the command keeps it)
        pytest.skip("SIGTERM has a handler in this process")
    monkeypatch.setattr(bench_mod, "_bench_prompts", term_after_two)
    out = tmp_path / "rep"
    r = CliRunner().invoke(main, ["bench", str(tiny_bundle), "--limit", "3", "--max-new-tokens", "4", "--drafters",
                                  "prompt-lookup", "--no-plots", "--out", str(out)])
    assert r.exit_code == 143 and r.output.strip().splitlines()[-1] == "error: terminated", r.output
    saved = json.loads((out / "report.json").read_text())
    assert len(saved["runs"]) >= 2 and saved["stopped"] == "terminated"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # (the command's handler taken away again)
    monkeypatch.setattr(bench_mod, "_bench_prompts", real)
    r = CliRunner().invoke(main, ["bench", str(tiny_bundle), "--limit", "2", "--max-new-tokens", "4", "--drafters",
                                  "prompt-lookup", "--no-plots", "--max-context", "16", "--out", str(tmp_path / "o5")])
    assert r.exit_code == 3 and "no prompt fits" in r.output, r.output
    assert not (tmp_path / "o5").exists()
    r = CliRunner().invoke(main, ["bench", str(tiny_bundle), "--limit", "2", "--max-new-tokens", "4", "--drafters",
                                  "prompt-lookup", "--no-plots", "--max-context", "16", "--out",
                                  str(tmp_path / "reports" / "bench")])  # (the default's shape: its parent made too)
    assert r.exit_code == 3 and not (tmp_path / "reports").exists(), r.output
    (tmp_path / "mine").mkdir()  # a folder the user made stays
    r = CliRunner().invoke(main, ["bench", str(tiny_bundle), "--limit", "2", "--max-new-tokens", "4", "--drafters",
                                  "prompt-lookup", "--no-plots", "--max-context", "16", "--out", str(tmp_path / "mine")])
    assert r.exit_code == 3 and (tmp_path / "mine").is_dir()
