"""Tests for the gaps a mutation test of edgespec/bench.py found (session 94, docs/bench/mutation_s94.md; mutants in
docs/bench/mutation_harness/bench_mut.py): the report's arithmetic and its words, worked by hand on runs made up
here, and the prompts file's edges. Each fails with its mutant; no model is loaded."""
from __future__ import annotations

import json

import pytest

from edgespec.bench import Report, Run, read_prompts
from edgespec.errors import ConfigError


def _run(qid, cat, drafter, new_tokens, decode_s, ttft_ms, drafted=0, accepted=0, rounds=0, calls=0, exact=None,
         draft_s=0.0, target_s=0.0, other_s=0.0):
    return Run(qid, cat, 0, drafter, new_tokens, ttft_ms, decode_s, 0.0, 0.0, drafted, accepted, rounds, calls,
               draft_s, target_s, other_s, [], [], exact)


def _report(settings=None, runs=()):
    s = {"max_new_tokens": 16, "temperature": 0.0, "top_p": 1.0, "threads": 2, **(settings or {})}
    return Report("b", {"cpu": "cpu", "providers": "cpu"}, s, runs=list(runs))


RUNS = [  # two prompts of "a", one of "b"; `none` the reference, `auto` drafting, `llama-ar` an unjudged runner
    _run("1", "a", "none", 11, 1.0, 10.0, rounds=10, calls=10, target_s=0.9, other_s=0.1),
    _run("1", "a", "auto", 11, 0.5, 20.0, drafted=8, accepted=6, rounds=4, calls=4, exact=True, draft_s=0.1,
         target_s=0.3, other_s=0.1),
    _run("1", "a", "llama-ar", 11, 0.4, 5.0, calls=11),
    _run("2", "a", "none", 5, 0.5, 30.0, rounds=4, calls=4, target_s=0.5),
    _run("2", "a", "auto", 5, 0.25, 40.0, drafted=4, accepted=2, rounds=2, calls=2, exact=True, target_s=0.25),
    _run("2", "a", "llama-ar", 5, 0.2, 5.0, calls=5),
    _run("3", "b", "none", 3, 0.2, 8.0, rounds=2, calls=2, target_s=0.2),
    _run("3", "b", "auto", 3, 0.1, 8.0, drafted=2, accepted=1, rounds=1, calls=1, exact=False, target_s=0.1),
]


def test_the_summary_s_figures_worked_by_hand():
    """Each figure of `summary()`: tokens/s over the tokens after the first, acceptance (accepted over drafted, none
    where nothing was drafted), accepted per round, tokens per target call, mean TTFT, TPOT, speedup against `none` of
    the same category, exactness (none's by definition, an unjudged runner's none, one mismatch enough to fail)."""
    s = _report(runs=RUNS).summary()
    assert list(s) == ["a", "b", "all"]
    a = s["a"]
    assert a["none"] == {"tokens_per_second": 9.333, "acceptance_rate": None, "mean_accepted_length": 0.0,
                         "tokens_per_target_call": 1.143, "ttft_ms": 20.0, "tpot_ms": 107.14, "draft_s": 0.0,
                         "target_s": 1.4, "other_s": 0.1, "exact": True, "runs": 2, "speedup": 1.0}
    assert a["auto"] == {"tokens_per_second": 18.667, "acceptance_rate": 0.6667, "mean_accepted_length": 1.333,
                         "tokens_per_target_call": 2.667, "ttft_ms": 30.0, "tpot_ms": 53.57, "draft_s": 0.1,
                         "target_s": 0.55, "other_s": 0.1, "exact": True, "runs": 2, "speedup": 2.0}
    assert a["llama-ar"]["exact"] is None and a["llama-ar"]["speedup"] == 2.5
    b = s["b"]
    assert b["none"]["tokens_per_second"] == 10.0 and b["auto"]["tokens_per_second"] == 20.0
    assert b["auto"]["speedup"] == 2.0 and b["auto"]["exact"] is False  # (its own category's base, not a's)
    al = s["all"]["auto"]
    assert al["exact"] is False and al["acceptance_rate"] == round(9 / 14, 4) and al["runs"] == 3
    assert al["tokens_per_second"] == round(16 / 0.85, 3) and s["all"]["none"]["tokens_per_second"] == round(16 / 1.7, 3)


def test_a_category_without_a_none_run_has_no_speedup_and_a_run_of_one_token_no_tpot():
    s = _report(runs=[_run("1", "a", "auto", 1, 0.0, 9.0, drafted=0, calls=1, exact=True)]).summary()
    v = s["a"]["auto"]
    assert v["speedup"] is None and v["tpot_ms"] is None and v["tokens_per_second"] == 0.0
    assert v["acceptance_rate"] is None and v["mean_accepted_length"] is None


def test_the_markdown_table_and_its_words():
    md = _report(runs=RUNS).markdown()
    assert md.startswith("# edgespec bench: b\n")
    assert "cpu · cpu · max_new_tokens 16 · greedy · 2 threads · 8 runs" in md
    assert "| a | auto | 18.7 | 2.00× | 0.67 | 1.33 | 2.67 | 30 | 53.6 | ✓ |" in md
    assert "| a | none | 9.3 | 1.00× | – | 0.00 | 1.14 | 20 | 107.1 | ✓ |" in md
    assert "| a | llama-ar | 23.3 | 2.50× | – | – | 1.00 | 5 | 42.9 | – |" in md  # (unjudged: –, not a tick)
    assert "| b | auto | 20.0 | 2.00× | 0.50 | 1.00 | 3.00 | 8 | 50.0 | ✗ |" in md
    assert "Left out" not in md and "Stopped early" not in md
    rep = _report({"threads": 0, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "repetition_penalty": 1.1},
                  runs=[r for r in RUNS if r.drafter != "llama-ar"])
    rep.left_out, rep.stopped = ["9", "4 turn 2"], "interrupted"
    md = rep.markdown()
    assert ("sampled (temperature 0.7, top-p 0.9, top-k 40, repetition penalty 1.1: exactness not checked) · "
            "threads: onnxruntime's default (one per core) · 6 runs") in md
    assert "| a | none | 9.3 | 1.00× | – | 0.00 | 1.14 | 20 | 107.1 | – |" in md  # (sampled: nothing judged)
    assert rep.summary()["a"]["none"]["exact"] is None  # (nor in the JSON: no reference to be exact against)
    assert "Left out (longer than the context): 9, 4 turn 2." in md
    assert "**Stopped early** (interrupted): these are the runs done before it." in md
    md = _report({"top_p": 0.0, "temperature": 0.8, "repetition_penalty": 1.2}, runs=RUNS[:2]).markdown()
    assert "· greedy (repetition penalty 1.2) ·" in md and "| a | none | 10.0 | 1.00× |" in md and "| ✓ |" in md


def test_a_prompts_file_s_edges(tmp_path):
    """A line of spaces is skipped, an id that is true is refused, --limit keeps that many, an empty file or one of
    blank lines has no prompts."""
    p = tmp_path / "q.jsonl"
    p.write_text('{"turns": ["a"]}\n   \n{"turns": ["b"]}\n{"turns": ["c"]}\n')
    assert [q["turns"][0] for q in read_prompts(p)] == ["a", "b", "c"]
    assert [q["question_id"] for q in read_prompts(p, limit=2)] == ["1", "3"]
    p.write_text('{"turns": ["a"], "question_id": true}\n')
    with pytest.raises(ConfigError, match="'question_id' must be a string or an integer, got bool"):
        read_prompts(p)
    for text in ("", "\n  \n"):
        p.write_text(text)
        with pytest.raises(ConfigError, match=r"q\.jsonl: no prompts$"):
            read_prompts(p)


def test_a_drafter_named_twice_is_refused_and_none_may_be():
    """A runner twice ran twice a prompt, its second run starting from what the first learned, one row for both."""
    from edgespec.bench import parse_drafters

    with pytest.raises(ConfigError, match=r"^--drafters names 'auto', 'model:4' twice$"):
        parse_drafters(["model:4", "auto", "none", "auto", "model:4"])
    assert parse_drafters(["none", "auto", "none", "auto@8", "model:4"]) == {"none": None, "auto": None,
                                                                             "auto@8": None, "model:4": 4}
    assert parse_drafters(["model", "prompt-lookup"], draft_tokens=3) == {"model": 3, "prompt-lookup": 3}
    # (a bound runner drafts adaptively up to its bound, whatever --draft-tokens fixes for the others; none drafts none)
    assert parse_drafters(["none", "auto@8", "model:5"], draft_tokens=3) == {"none": None, "auto@8": None, "model:5": 5}


def test_prediction_is_no_bench_runner():
    from edgespec.bench import parse_drafters

    with pytest.raises(ConfigError, match="the prediction drafter drafts from a request's prediction"):
        parse_drafters(["prediction"])


def test_a_dangling_link_named_as_a_report_file_is_refused(tmp_path):
    """A symbolic link to nothing where report.md goes: the write would follow it, or fail after the whole run."""
    from edgespec.bench import check_report_files

    (tmp_path / "report.md").symlink_to(tmp_path / "gone" / "x.md")
    with pytest.raises(ConfigError, match=r"report\.md: it is no regular file"):
        check_report_files(tmp_path)


def _filler(tok, before, room):
    """A user turn after ``before`` whose chat prompt is exactly ``room`` tokens."""
    for word in ("word ", "a ", "xy ", "the "):
        for n in range(1, room):
            text = word * n
            got = len(tok.encode_chat([*before, {"role": "user", "content": text}]))
            if got == room:
                return text
            if got > room:
                break
    pytest.skip("no filler of exactly the context's length with this tokenizer")


def test_a_turn_of_exactly_the_context_is_left_out_and_a_later_turn_reads_the_reply_before_it(tiny_bundle):
    """A prompt of as many tokens as the context leaves no room for a reply: left out, as a longer one is, first
    turns and later ones alike. A later turn's prompt holds the reply to the turn before it (the conversation's), and
    each run's TPOT is its decode time over the tokens after the first."""
    import edgespec
    from edgespec.bench import run_bench

    eng = edgespec.load(tiny_bundle, memory=False, max_context=128)
    tok, room = eng.tokenizer, eng.decoder.target.max_context
    seen = []
    encode_chat = tok.encode_chat

    def recorded(msgs, *a, **kw):
        seen.append([dict(m) for m in msgs])
        return encode_chat(msgs, *a, **kw)

    tok.encode_chat = recorded
    try:
        rep = run_bench(eng, [{"question_id": "q", "category": "c", "turns": ["Hi", "And then?"]}], ["prompt-lookup"],
                        max_new_tokens=6, log=lambda s: None)
        second = seen[-1]
        assert [m["role"] for m in second] == ["user", "assistant", "user"]
        reply = tok.decode(_reply_ids(eng, second[:1]))
        assert second[1]["content"] == reply and reply
        for r in rep.runs:
            assert r.new_tokens > 1 and r.tpot_ms == pytest.approx(1000 * r.decode_s / (r.new_tokens - 1))
        first = [{"role": "user", "content": _filler(tok, [], room)}]
        rep = run_bench(eng, [{"question_id": "full", "category": "c", "turns": [first[0]["content"]]},
                              {"question_id": "q", "category": "c",
                               "turns": ["Hi", _filler(tok, [{"role": "user", "content": "Hi"},
                                                             {"role": "assistant", "content": reply}], room)]}],
                        ["prompt-lookup"], max_new_tokens=6, log=lambda s: None)
        assert rep.left_out == ["full", "q turn 2"]
        assert {(r.question_id, r.turn) for r in rep.runs} == {("q", 0)}
    finally:
        tok.encode_chat = encode_chat
        eng.close()


def _reply_ids(eng, msgs):
    eng.reset()
    out = []
    for _, toks, _, _ in eng.stream_ids(eng.tokenizer.encode_chat(msgs), max_new_tokens=6, temperature=0.0,
                                        top_p=1.0, min_p=0.0, top_k=0, repetition_penalty=1.0, drafter="none"):
        out.extend(toks)
    return out


def test_a_users_markdown_is_no_report_and_a_stop_before_any_run_writes_none(tmp_path, capsys):
    """A report.md of one's own notes (a heading, not the bench's) is not replaced; a bench stopped before its first
    run writes no report of nothing (and says nothing of one)."""
    from edgespec.bench import check_report_files, write_partial_report

    (tmp_path / "report.md").write_text("# My notes on the bench\n")
    with pytest.raises(ConfigError, match=r"report\.md is not a report of edgespec bench"):
        check_report_files(tmp_path)
    (tmp_path / "report.md").write_text("# edgespec bench: an earlier run\n")
    check_report_files(tmp_path)
    out = tmp_path / "o"
    out.mkdir()
    rep = _report()
    rep.stopped = "interrupted"
    write_partial_report(rep, out)
    assert list(out.iterdir()) == [] and capsys.readouterr().err == ""
    rep.runs = RUNS[:1]
    write_partial_report(rep, out)
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]
    assert "wrote the 1 runs done (stopped early: interrupted)" in capsys.readouterr().err


def test_a_stopped_run_keeps_the_partial_report_beside_it(tmp_path):
    """An interrupted run written as report.json (over a stopped one of fewer runs) leaves an earlier run's
    report.partial.* in place; a whole run's report takes them away (stale beside it)."""
    from edgespec.bench import write_partial_report, write_report

    def stopped(n):
        rep = _report(runs=RUNS[:n])
        rep.stopped = "interrupted"
        return rep

    write_report(stopped(2), tmp_path, plots=False, stem="report.partial")
    write_report(stopped(1), tmp_path, plots=False)
    write_partial_report(stopped(3), tmp_path)
    assert len(json.loads((tmp_path / "report.json").read_text())["runs"]) == 3
    assert (tmp_path / "report.partial.json").exists() and (tmp_path / "report.partial.md").exists()
    write_report(_report(runs=RUNS), tmp_path, plots=False)
    assert not (tmp_path / "report.partial.json").exists() and not (tmp_path / "report.partial.md").exists()
