"""scripts/gpu/: carrying files to a GPU machine with no network in size-limited transfers (pack,
stash, join with sha256 checks) and installing wheels there with `pip install --target`, as far as
a CPU machine can check it (docs/gpu.md, issue #13)."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
import pack  # noqa: E402


def _files(tmp_path: Path, sizes=(100, 2500, 7)) -> list[tuple[str, Path]]:
    rng = __import__("random").Random(5)
    out = []
    for i, n in enumerate(sizes):
        p = tmp_path / "src" / f"f{i}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(bytes(rng.randrange(256) for _ in range(n)))
        out.append((f"dir/f{i}.bin" if i == 1 else f"f{i}.bin", p))
    return out


def test_pack_stash_join_round_trip(tmp_path):
    files = _files(tmp_path)
    batches = pack.pack(files, tmp_path / "tree", 1000)
    assert [b.name for b in batches] == ["b1", "b2", "b3"]  # 2607 bytes in parts of at most 1000
    assert all(sum(f.stat().st_size for f in b.glob("part*")) <= 1000 for b in batches)
    stage, out = tmp_path / "stage", tmp_path / "out"
    pack.stash(batches[0], stage)
    assert pack.status(stage)[2] == ["f0.bin"]  # the first file is whole after one batch
    with pytest.raises(pack.Incomplete, match="dir/f1.bin"):
        pack.join(stage, out, ["dir/*"])
    assert pack.main(["join", "--stage", str(stage), "--out", str(out), "--only", "dir/*"]) == 3
    assert [p.name for p in pack.join(stage, out)] == ["f0.bin"]  # what is complete, without --only
    for b in batches[1:][::-1]:  # any order
        pack.stash(b, stage)
    written = pack.join(stage, out, ["*"])
    assert [p.relative_to(out).as_posix() for p in written] == [n for n, _ in files]
    for (_, src), dst in zip(files, written):
        assert dst.read_bytes() == src.read_bytes()
    assert not list(batches[1].glob("part*"))  # stashed parts moved out of the working tree


def test_a_broken_part_is_refused_and_not_kept(tmp_path, capsys):
    batches = pack.pack(_files(tmp_path), tmp_path / "tree", 1000)
    part = next(batches[1].glob("part*"))
    data = bytearray(part.read_bytes())
    data[10] ^= 1
    part.write_bytes(bytes(data))
    stage = tmp_path / "stage"
    assert pack.main(["stash", str(batches[1]), "--stage", str(stage)]) == 4
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "sha256" in err and err.count("\n") == 1
    assert part.exists() and not (stage / part.name).exists()
    # a batch of another pack does not mix with the parts already stashed
    pack.stash(batches[0], stage)
    other = pack.pack(_files(tmp_path / "o", sizes=(50, 60)), tmp_path / "tree2", 1000)
    with pytest.raises(pack.Corrupt, match="another pack"):
        pack.stash(other[0], stage)


def test_joined_bytes_are_checked(tmp_path):
    batches = pack.pack(_files(tmp_path), tmp_path / "tree", 1000)
    stage = tmp_path / "stage"
    for b in batches:
        pack.stash(b, stage)
    part = stage / "part002.bin"  # damaged after it arrived
    data = bytearray(part.read_bytes())
    data[0] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(pack.Corrupt, match="dir/f1.bin"):
        pack.join(stage, tmp_path / "out", ["dir/*"])
    assert not (tmp_path / "out" / "dir" / "f1.bin").exists()
    assert not list((tmp_path / "out").rglob("*.partial"))


def test_pack_errors(tmp_path):
    with pytest.raises(pack.PackError, match="not a file"):
        pack.pack([("x", tmp_path / "missing")], tmp_path / "tree", 10)
    a = _files(tmp_path)[0]
    with pytest.raises(pack.PackError, match="share a name"):
        pack.pack([a, a], tmp_path / "tree", 10)
    with pytest.raises(pack.Incomplete, match="stash a batch first"):
        pack.join(tmp_path / "empty", tmp_path / "out")


def _wheel(where: Path, dist: str = "tinypkg", pkg: str = "tinypkg", init: bytes = b"VALUE = 42\n",
           version: str = "0.1") -> Path:
    """A minimal pure-Python wheel (``dist`` ``version``, one package ``pkg``)."""
    info = f"{dist}-{version}.dist-info"
    files = {f"{pkg}/__init__.py": init,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    path = where / f"{dist}-{version}-py3-none-any.whl"
    where.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def _install(stage: Path, cwd: Path, **extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHON=sys.executable, **extra)
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "install.sh"), str(stage)], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)


def _imports(env_sh: Path, cwd: Path, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(["bash", "-c", f"source {env_sh} && {sys.executable} -c '{code}'"],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=60)


def test_install_into_a_target_directory(tmp_path):
    """install.sh on this CPU machine: joins the wheel from its parts, installs it and edgespec with
    `pip install --target`, writes env.sh; a fresh interpreter with env.sh's PYTHONPATH imports both."""
    whl = _wheel(tmp_path / "wheels")
    stage = tmp_path / "stage"
    for b in pack.pack([(whl.name, whl)], tmp_path / "tree", 400):
        pack.stash(b, stage / "parts")
    r = _install(stage, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "edgespec from " + str(stage / "site") in r.stdout
    assert (stage / "site" / "tinypkg" / "__init__.py").is_file() and (stage / "env.sh").is_file()
    check = _imports(stage / "env.sh", tmp_path, "import tinypkg, edgespec_export; "
                     "print(tinypkg.VALUE, edgespec_export.__file__)")
    assert check.returncode == 0 and check.stdout.startswith("42 " + str(stage / "site")), check.stderr
    # a missing part: a one-line error and a non-zero exit, nothing installed
    (stage / "parts" / "part001.bin").unlink()
    r = _install(stage, tmp_path)
    assert r.returncode == 3 and r.stderr.startswith("error: incomplete: tinypkg") and r.stderr.count("\n") == 1


def test_builder_site_first_then_the_gpu_wheel(tmp_path):
    """The export starts before onnxruntime-gpu has arrived: the pack puts the small files first, the
    builder's site (WHEELS, SITE, ENV_SH) installs the CPU onnxruntime with what arrived, and the
    full install later takes onnxruntime-gpu and leaves the CPU onnxruntime out (both are the
    package onnxruntime)."""
    fake = "__version__ = \"9.0\"\nKIND = \"{}\"\ndef get_available_providers():\n    return [KIND]\n"
    big = _wheel(tmp_path / "wheels", "onnxruntime_gpu", "onnxruntime", fake.format("gpu").encode() + b"# " + os.urandom(3000).hex().encode(), "9.0")
    cpu = _wheel(tmp_path / "wheels", "onnxruntime", "onnxruntime", fake.format("cpu").encode(), "9.0")
    tiny = _wheel(tmp_path / "wheels")
    files = sorted([(w.name, w) for w in (big, cpu, tiny)], key=lambda nf: nf[1].stat().st_size)
    batches = pack.pack(files, tmp_path / "tree", cpu.stat().st_size + tiny.stat().st_size)
    stage = tmp_path / "stage"
    man = json.loads((batches[0] / "MANIFEST.json").read_text())
    assert man["files"][-1]["name"] == big.name and len(batches) > 1
    pack.stash(batches[0], stage / "parts")  # the first batch: the small wheels, not the big one
    r = _install(stage, tmp_path, WHEELS="onnxruntime-[0-9]*.whl tinypkg*", SITE=str(stage / "site-build"),
                 ENV_SH=str(stage / "env-build.sh"))
    assert r.returncode == 0, r.stdout + r.stderr
    check = _imports(stage / "env-build.sh", tmp_path, "import onnxruntime, tinypkg; print(onnxruntime.KIND)")
    assert check.stdout.strip() == "cpu", check.stderr
    # the GPU wheel is incomplete yet: asking for it is a one-line error
    r = _install(stage, tmp_path)
    assert r.returncode == 3 and "onnxruntime_gpu" in r.stderr
    for b in batches[1:]:
        pack.stash(b, stage / "parts")
    r = _install(stage, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    check = _imports(stage / "env.sh", tmp_path, "import onnxruntime, tinypkg; print(onnxruntime.KIND)")
    assert check.stdout.strip() == "gpu", check.stderr
    assert not (stage / "site" / "onnxruntime-9.0.dist-info").exists()
    # wheels asked for that the pack does not carry: one error line, a non-zero exit
    r = _install(stage, tmp_path, WHEELS="nothing-like-it*.whl", SITE=str(stage / "site-none"))
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert not (stage / "site-none").exists()


# -- predict.py: the CPU rounds priced at a GPU's measured costs --------------------------------------
import predict  # noqa: E402


def _gpu(policy: dict, step: float = 2.0) -> dict:
    return {"shaped": {"width_ms": {"policy": {str(w): v for w, v in policy.items()}},
                       "drafter_step_ms": {"1": step, "2": step + 0.1, "4": step + 0.3, "8": step + 0.7}}}


def test_curve_and_rounds():
    at = predict.curve({"1": 3.0, "2": 3.0, "4": 4.0, "8": 6.0})
    assert at(1) == 3.0 and at(3) == 3.5 and at(6) == 5.0 and at(12) == 8.0  # past the end: the last slope
    # 5 rounds with a draft at position 1, 3 at 2, 1 at 3: 2 rounds of 1, 2 of 2, 1 of 3
    assert predict.rounds_by_length([5, 3, 1]) == {1: 2, 2: 2, 3: 1}


def test_predict_prices_each_round():
    """One prompt: greedy made 10 calls; auto made 2 rounds of 3 drafts and 2 plain calls, drafting
    for 0.1 s on a CPU whose drafter step is 10 ms. At 1 ms a one-token call, 2 ms a 4-token call
    and a 2 ms drafter step: AR 10 ms + 1 ms other; auto 2 x 2 + 2 x 1 ms, 0.1 x 2/10 s drafting,
    1 ms other."""
    cpu = {"runs": [
        {"question_id": "q", "turn": 0, "category": "code", "drafter": "none", "new_tokens": 10, "target_calls": 10,
         "draft_s": 0.0, "other_s": 0.001, "decode_s": 0.5, "drafted_by_position": []},
        {"question_id": "q", "turn": 0, "category": "code", "drafter": "auto", "new_tokens": 10, "target_calls": 4,
         "draft_s": 0.1, "other_s": 0.001, "decode_s": 0.25, "drafted_by_position": [2, 2, 2]}]}
    res = predict.predict(_gpu({1: 1.0, 4: 2.0}, step=2.0), cpu, cpu_step_ms=10.0)
    c = res["categories"]["code"]
    spec = 2 * 0.002 + 2 * 0.001 + 0.1 * 0.2 + 0.001
    assert abs(c["predicted_speedup"] - round(0.011 / spec, 3)) < 1e-9
    assert c["cpu_measured_speedup"] == 2.0 and res["categories"]["all"] == c


def test_predict_prices_the_model_drafters_calls_at_the_gpus_costs():
    """A run that records its model drafter's calls (session 27): each call at the GPU's step plus the
    GPU's per-token slope for each token past its first, the rest of the drafting time as it ran; a
    run without the record scales all its drafting time (the older reports)."""
    gpu = _gpu({1: 1.0}, step=2.0)  # drafter calls of 1/2/4/8 tokens: 2.0/2.1/2.3/2.7 ms: 0.1 ms a token
    base = {"question_id": "q", "turn": 0, "category": "code", "target_calls": 10, "other_s": 0.0,
            "decode_s": 1.0, "new_tokens": 10, "drafted_by_position": []}
    new = dict(base, drafter="auto", draft_s=0.5, model_drafting={"calls": 12, "tokens": 312, "call_s": 0.4})
    old = dict(base, drafter="auto", draft_s=0.5)
    for run, want in ((new, 0.1 + (12 * 2.0 + 300 * 0.1) / 1e3), (old, 0.5 * 2.0 / 10.0)):
        res = predict.predict(gpu, {"runs": [dict(base, drafter="none"), run]}, cpu_step_ms=10.0)
        spec = 10 * 1.0 / 1e3 + want
        assert abs(res["categories"]["code"]["predicted_speedup"] - round(0.010 / spec, 3)) < 1e-9, run
    assert predict.drafting_seconds(dict(old, model_drafting=None), 0.2, 2.0, 0.1) == 0.5  # no model call


def test_gpu_prices_ignore_this_machines_timings():
    gpu = _gpu({1: 3.0, 2: 3.0, 8: 6.0}, step=2.0)
    gpu["shaped"]["width_policy"] = {"target": [2, 1]}
    cost = predict.gpu_priced_cost_model(gpu)
    cost.min_width, cost.width_multiple = 1, 2  # what this machine's target would set at begin()
    assert cost.padded(1) == 2 and cost.padded(3) == 3  # the GPU's policy stands
    cost.observe_target(1, 9.0)
    cost.observe_draft(9.0, "model")
    cost.observe_catchup(100, 9.0, "model")
    assert cost.target_cost(1) == 0.003 and cost.step_cost("model") == 0.002
    assert abs(cost.upfront_cost(100, "model") - (0.002 + 100 * 0.0001)) < 1e-12
    cost.observe_draft(0.0001, "prompt-lookup")  # the memory drafters' own costs are still learned here
    assert cost.step_cost("prompt-lookup") == 0.0001


def test_live_prediction_keeps_to_the_gpus_bound_on_verify_calls(tiny_bundle, tmp_path):
    """--live plays the rounds here as the GPU would: at its prices and, since session 27, within its
    width probe's bound (--verified-width): no draft longer than the bound less one, every output
    equal to greedy decoding."""
    gpu = _gpu({1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.1}, step=0.1)  # flat and cheap: long drafts pay
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": f"q{i}", "category": "code", "turns": [t]}) + "\n"
                               for i, t in enumerate(["def add(a, b): return a + b\n" * 4, "one two three " * 8])))
    rep = predict.live(str(tiny_bundle), gpu, None, tmp_path / "r", max_new_tokens=24, verified_width=4,
                       prompts=str(prompts))
    runs = [r for r in rep["runs"] if r["drafter"] == "auto"]
    assert runs and all(len(r["drafted_by_position"] or []) <= 3 for r in runs)
    assert all(r["exact"] is not False for r in rep["runs"])


def test_token_ms_prefers_the_measured_drafter_reads():
    """predict.token_ms: the drafter's catch-up reads priced by the slope of its timed long calls where
    the run has them (bench.py's drafter_read_ms), else the lower of the short calls' slope and the
    target's long calls' (scaled to the drafter)."""
    shaped = _gpu({1: 2.0, 8: 3.0, 16: 3.5, 32: 4.3}, step=1.0)["shaped"]  # drafter 1.0-1.7 ms: 0.1/token
    assert abs(predict.token_ms(shaped, 1.0) - min(0.1, (4.3 - 3.0) / 24 * 1.0 / 2.0)) < 1e-12
    shaped["drafter_read_ms"] = {"16": 1.5, "64": 2.0, "512": 6.5}
    assert abs(predict.token_ms(shaped, 1.0) - 5.0 / 496) < 1e-12
    assert abs(predict.token_ms(shaped, 2.0) - 2 * 5.0 / 496) < 1e-12  # a step priced twice: reads too
    shaped["drafter_read_skip_ms"] = {"16": 1.2, "512": 2.2}  # the last row's logits only (session 29)
    assert abs(predict.token_ms(shaped, 1.0) - 1.0 / 496) < 1e-12


def test_bench_exactness_section_on_the_cpu_ep(smol_cuda, tmp_path, monkeypatch):
    """bench.py's exactness section (session 27) runs check_exact.py on the provider; on the CPU EP
    (a dry run) the cuda-layout SmolLM2 is exact at draft bounds 8 and 15 under the floor."""
    import bench

    from edgespec.bench import read_prompts

    out = tmp_path / "run.json"
    monkeypatch.setattr(bench, "EXACT_TOKENS", 24)  # (128 on the GPU; the CPU EP runs float16 graphs slowly)
    few = tmp_path / "few.jsonl"  # (and three prompts of the shipped ones: code, a summary, a question)
    few.write_text("".join(json.dumps(p) + "\n" for p in read_prompts(categories=("code", "summarization", "qa"),
                                                                       per_category=1)))
    monkeypatch.setattr(bench, "EXACT_PROMPTS", few)
    assert bench.main(["--provider", "cpu", "--sections", "exactness", "--smol-cuda", str(smol_cuda),
                       "--json", str(out)]) == 0
    res = json.loads(out.read_text())["exactness"]
    assert res["rc"] == 0 and "at least 2" in res["policy"] and res["differs"] == []
    assert res["result"].endswith("outputs equal to greedy decoding") and "--prompts" in res["command"]


def test_predict_bad_input(tmp_path, capsys):
    """A GPU file without the measured curve, neither or both of --cpu/--live, a missing file: one
    'error:' line and exit 2."""
    good = tmp_path / "gpu.json"
    good.write_text(__import__("json").dumps(_gpu({1: 1.0, 4: 2.0})))
    bare = tmp_path / "bare.json"
    bare.write_text("{}")
    cases = [["--gpu", str(bare), "--cpu", str(good), "--cpu-step-ms", "10"],
             ["--gpu", str(good), "--cpu-step-ms", "10"],
             ["--gpu", str(good), "--cpu", str(good), "--live", "x", "--cpu-step-ms", "10"],
             ["--gpu", str(tmp_path / "missing.json"), "--cpu", str(good), "--cpu-step-ms", "10"],
             ["--gpu", str(good), "--live", "x", "--cpu-step-ms", "10", "--verified-width", "-1"],
             ["--gpu", str(good), "--live", "x", "--cpu-step-ms", "10", "--verified-width", "1"]]
    for argv in cases:
        assert predict.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, (argv, err)


def test_probe_graphs_on_the_cpu_ep(tiny_cuda_bundle, tmp_path, capsys):
    """probe_graphs.py's bindings on the CPU EP (no replays there: its 'graph' session runs
    ordinary calls): the static-mask calls of the graph session equal the static session's bitwise
    at every step and width, and every figure is recorded; a missing bundle or a bundle without a
    drafter is one error line and exit 2."""
    import probe_graphs

    out = tmp_path / "probe.json"
    assert probe_graphs.main([str(tiny_cuda_bundle), "--provider", "cpu", "--widths", "1,3", "--steps", "6",
                              "--context", "128", "--past", "32", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    for w in ("1", "3"):
        rec = res["widths"][w]
        assert "error" not in rec, rec
        assert rec["graph_bitwise_equal_steps"] == 6 and rec["graph_argmax_agrees"] == 1.0
        assert rec["graph_ms"] > 0 and rec["static_ms"] > 0 and rec["dynamic_ms"] > 0
    capsys.readouterr()
    assert probe_graphs.main([str(tmp_path / "nope"), "--provider", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_bench_overlap_section_on_the_cpu_ep(tiny_cuda_bundle, tmp_path):
    """bench.py's overlap section times the target's verify call and the drafter's steps alone and
    from two threads at once; on the CPU EP (a dry run) every cell is filled, and the worker's
    drafts leave both caches where they were (the next cell's calls would fail otherwise)."""
    import bench

    out = tmp_path / "run.json"
    assert bench.main(["--provider", "cpu", "--sections", "overlap", "--shaped", str(tiny_cuda_bundle),
                       "--reps", "2", "--json", str(out)]) == 0
    res = json.loads(out.read_text())["overlap"]
    assert set(res) == {"bundle", "context", "default"}  # the own-stream variant is a CUDA provider option
    cells = res["default"]
    assert len(cells) == 16
    for c in cells.values():
        assert c["verify_ms"] > 0 and c["draft_ms"] > 0 and c["both_ms"] > 0


def test_bench_threads_section_on_the_cpu_ep(tiny_cuda_bundle, tmp_path):
    """bench.py's threads section (session 75: onnxruntime keeps captured CUDA graphs per thread) times
    generations on the loading thread, on fresh threads and on one device thread of their own; on
    the CPU EP (a dry run) every figure is there and every output equals greedy decoding."""
    import bench

    out = tmp_path / "run.json"
    assert bench.main(["--provider", "cpu", "--sections", "threads", "--smol-cuda", str(tiny_cuda_bundle),
                       "--json", str(out)]) == 0
    res = json.loads(out.read_text())["threads"]
    assert res["exact"] is True
    assert len(res["loading_thread_s"]) == 3 and len(res["fresh_thread_s"]) == len(res["one_device_thread_s"]) == 6
    assert all(t > 0 for k in ("loading_thread_s", "fresh_thread_s", "one_device_thread_s") for t in res[k])


def test_bench_serve_section_on_the_cpu_ep(tiny_cuda_bundle, tmp_path, monkeypatch):
    """bench.py's serve section (session 75) starts ``edgespec serve`` in a process of its own and sends the same
    greedy chat request 8 times: on the CPU EP (a dry run) every request answered with the same text, the seconds of
    each there, and the server stopped cleanly (exit 0). Its log's folder is removed after (session 92: one was left
    in /tmp at every run), its tail kept in the result."""
    import tempfile

    import bench

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    out = tmp_path / "run.json"
    assert bench.main(["--provider", "cpu", "--sections", "serve", "--smol-cuda", str(tiny_cuda_bundle),
                       "--json", str(out)]) == 0
    res = json.loads(out.read_text())["serve"]
    assert "error" not in res, res
    assert len(res["seconds"]) == 8 and all(t > 0 for t in res["seconds"]) and res["same_text"] is True
    assert res["rc"] == 0 and "--provider cpu" in res["command"]
    assert "edgespec: stopped" in res["log_tail"] and not list(temp.glob("edgespec-serve-*"))


def test_probe_overlap_on_the_cpu_ep(tiny_cuda_bundle, tmp_path, capsys):
    """scripts/gpu/probe_overlap.py (session 29, for the next GPU window): plain onnxruntime sessions of
    the target and the drafter with fixed bindings (the logits skip at 0), timed alone and from two
    threads; on the CPU EP one variant (no graphs, no streams), every figure filled. Bad input: one
    error line, exit 2."""
    import probe_overlap

    js = tmp_path / "o.json"
    assert probe_overlap.main([str(tiny_cuda_bundle), "--provider", "cpu", "--calls", "5", "--past", "32",
                               "--json", str(js)]) == 0
    res = json.loads(js.read_text())
    assert list(res["variants"]) == ["no_graphs"]
    rec = res["variants"]["no_graphs"]
    assert rec["target_call_ms"] > 0 and rec["drafter_call_ms"] > 0 and rec["both_ms_per_pair"] > 0
    assert rec["overlap"] > 0
    capsys.readouterr()
    assert probe_overlap.main([str(tmp_path / "nothing"), "--provider", "cpu"]) == 2
    assert probe_overlap.main([str(tiny_cuda_bundle), "--provider", "cpu", "--calls", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)


# -- session 54 (a review): what one call carries, compact packs, a fresh machine, run.sh's deadline --------------
def test_the_default_batch_fits_a_call_beside_the_working_tree(capsys):
    """Every call carries the working tree too (5.7 MiB in session 54) and at most 64 MiB in all: 60 MiB batches,
    the default until then, were over it. The default is 64 MiB less the tree less 2 MiB; a size given that does
    not fit beside the tree is refused in one line."""
    tree = pack.tree_bytes(ROOT)
    assert tree > 1 << 20  # (the tree was measured: git lists this checkout's files)
    batch = pack.batch_bytes_for(ROOT, None)
    assert batch + tree + 64 * 1024 <= 64 * pack.MiB  # (and the batch's MANIFEST.json)
    assert batch >= 40 * pack.MiB
    assert pack.batch_bytes_for(ROOT, 10) == 10 * pack.MiB
    with pytest.raises(pack.PackError, match="come to more than the 64 MiB a call carries"):
        pack.batch_bytes_for(ROOT, 63.5)
    assert pack.main(["pack", "--wheels", str(ROOT / "no-such-dir"), "--no-smollm2", "--batch-mib", "62",
                      "--out", str(ROOT / ".gpu-test-unused")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: a batch of 62 MiB") and err.count("\n") == 1
    assert not (ROOT / ".gpu-test-unused").exists()


def _elf_with_fatbin(containers: list[list[tuple[int, bytes]]]) -> bytes:
    """A minimal ELF64 library whose .nv_fatbin section holds ``containers``, each a list of (sm arch, code)."""
    import struct

    fat = b""
    for entries in containers:
        body = b""
        for arch, code in entries:
            head = struct.pack("<HHIQ", 2, 0x11, 64, len(code)) + bytes(12) + struct.pack("<I", arch)
            body += head + bytes(64 - len(head)) + code
        fat += struct.pack("<IHHQ", pack.FATBIN_MAGIC, 1, 16, len(body)) + body
        fat += bytes(-len(fat) % 8)
    names = b"\0.shstrtab\0.nv_fatbin\0"
    strtab_off, fat_off = 64, 64 + len(names) + (-len(names) % 8)
    shoff = fat_off + len(fat)
    ehdr = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9) + bytes(0x28 - 16) + struct.pack("<Q", shoff) + bytes(
        0x3A - 0x30) + struct.pack("<HHH", 64, 3, 1)
    ehdr += bytes(64 - len(ehdr))

    def sh(name, off, size):
        return struct.pack("<IIQQQQ", name, 1, 0, 0, off, size) + bytes(64 - 40)

    shdrs = bytes(64) + sh(1, strtab_off, len(names)) + sh(11, fat_off, len(fat))
    return ehdr + names + bytes(fat_off - 64 - len(names)) + fat + shdrs


def test_keep_arch_zeroes_other_gpus_code_and_keeps_the_layout():
    """--keep-arch 90: every fat binary entry for another architecture than sm_90 has its code zeroed, headers and
    size unchanged (so every offset of the library is the same); a library with no sm_90 code, or no ELF, is
    refused."""
    sm80, sm90, sm90b, sm120 = os.urandom(300), os.urandom(200), os.urandom(96), os.urandom(50)
    lib = _elf_with_fatbin([[(80, sm80), (90, sm90)], [(120, sm120)], [(90, sm90b), (86, os.urandom(40))]])
    buf = bytearray(lib)
    st = pack.keep_arch(buf, 90)
    assert st == {"containers": 3, "without_arch": 1, "zeroed": 390, "kept": 296}
    assert len(buf) == len(lib) and sm90 in buf and sm90b in buf and sm80 not in buf and sm120 not in buf
    assert bytes(buf).count(bytes(300)) == 1 and buf[:64] == lib[:64] and buf[-192:] == lib[-192:]
    with pytest.raises(pack.PackError, match="no code for sm_89"):
        pack.keep_arch(bytearray(lib), 89)
    import struct  # (a review) a container header of 0 bytes looped forever; one past the section wrote past it

    off, _ = pack._fatbin_section(lib)
    for hsize, grow in ((0, 0), (16, 4096)):
        bad = bytearray(lib)
        magic, ver, hs, fs = struct.unpack_from("<IHHQ", bad, off)
        struct.pack_into("<IHHQ", bad, off, magic, ver, hsize, fs + grow if hsize else 0)
        with pytest.raises(pack.PackError, match="not a layout this knows"):
            pack.keep_arch(bad, 90)
    with pytest.raises(pack.PackError, match="not an ELF64"):
        pack.keep_arch(bytearray(b"MZ" + bytes(100)), 90)


def test_an_xz_pack_installs_as_the_wheels_would(tmp_path, capsys):
    """pack --xz --keep-arch 90: builder.tar.xz (genai, gguf, the tokenizer) and ortgpu.tar.xz (onnxruntime-gpu, its
    CUDA library stripped; the CPU onnxruntime wheel left out), cut into batches; install.sh unpacks them into
    the site as pip lays wheels out and the tokenizer into STAGE/files; the stash of a batch whose predecessors
    are not in the stage says FRESH MACHINE and exits 7."""
    w = tmp_path / "wheels"
    lib = _elf_with_fatbin([[(80, os.urandom(4000)), (90, b"H200" * 100)]])
    fake = "__version__ = \"9.0\"\nKIND = \"{}\"\ndef get_available_providers():\n    return [KIND]\n"
    gpu = _wheel(w, "onnxruntime_gpu", "onnxruntime", fake.format("gpu").encode(), "9.0")
    with zipfile.ZipFile(gpu, "a") as z:
        z.writestr("onnxruntime/capi/libonnxruntime_providers_cuda.so", lib)
    _wheel(w, "onnxruntime", "onnxruntime", fake.format("cpu").encode(), "9.0")
    _wheel(w, "onnxruntime_genai", "onnxruntime_genai", b"G = 1\n", "0.18.0")
    _wheel(w, "gguf", "gguf", b"F = 1\n", "0.19.0")
    _wheel(w, "starlette", "starlette", b"S = 1\n", "1.10.0")  # (edgespec serve's, session 75: in the builder's)
    _wheel(w, "uvicorn", "uvicorn", b"U = 1\n", "0.55.0")
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text('{"t": "' + os.urandom(3000).hex() + '"}')
    (tok / "tokenizer_config.json").write_text("{}")
    out = tmp_path / "tree"
    assert pack.main(["pack", "--wheels", str(w), "--tokenizer", str(tok), "--no-smollm2", "--xz", "--keep-arch",
                      "90", "--batch-mib", "0.002", "--out", str(out)]) == 0
    batches = sorted(out.glob("b*"), key=lambda b: int(b.name[1:]))
    names = [e["name"] for e in json.loads((batches[0] / "MANIFEST.json").read_text())["files"]]
    assert sorted(names) == ["builder.tar.xz", "ortgpu.tar.xz"] and len(batches) >= 3
    stage = tmp_path / "stage"
    assert pack.main(["stash", str(batches[1]), "--stage", str(stage / "parts")]) == 7  # b1 never came
    assert list(batches[1].glob("part*.bin")) and not list((stage / "parts").glob("part*"))  # (nothing moved)
    for b in batches:
        pack.stash(b, stage / "parts")
    r = _install(stage, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    site = stage / "site"
    assert (site / "onnxruntime_gpu-9.0.dist-info" / "RECORD").is_file()
    assert (site / "onnxruntime_genai" / "__init__.py").read_bytes() == b"G = 1\n"
    assert (site / "starlette" / "__init__.py").read_bytes() == b"S = 1\n"
    assert (site / "uvicorn" / "__init__.py").read_bytes() == b"U = 1\n"
    assert {"starlette==1.10.0", "uvicorn==0.55.0"} <= set(pack.WHEELS)  # (what a real pack downloads)
    assert not (site / "onnxruntime-9.0.dist-info").exists()
    stripped = (site / "onnxruntime" / "capi" / "libonnxruntime_providers_cuda.so").read_bytes()
    assert len(stripped) == len(lib) and b"H200" * 100 in stripped and stripped != lib
    assert (stage / "files" / "qwen-tokenizer" / "tokenizer.json").read_text() == (tok / "tokenizer.json").read_text()
    check = _imports(stage / "env.sh", tmp_path, "import onnxruntime, gguf; print(onnxruntime.KIND)")
    assert check.stdout.strip() == "gpu", check.stderr
    assert pack.main(["pack", "--wheels", str(w), "--keep-arch", "90", "--no-smollm2", "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] + "\n" == "error: --keep-arch strips onnxruntime's CUDA library inside an --xz pack: add --xz\n"


def test_run_sh_keeps_to_its_budget(tmp_path):
    """run.sh bounds every step by one deadline (RUN_BUDGET): a background export that never ends was waited
    for SHAPED_WAIT (360 s) on its own before, and the steps' timeouts added to over 1,100 s against a device
    call's 600. Here with a budget of 35 s the wait stops at what it leaves less the bench's share (BENCH_KEEP 10 s)
    and 20 s, and the bench still has its share (the diff's review: the wait took it, the bench got 1 s)."""
    import time

    stage = tmp_path / "stage"
    (stage / "parts").mkdir(parents=True)
    (stage / "env.sh").write_text("")
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        (stage / "shaped.pid").write_text(str(sleeper.pid))
        env = {**os.environ, "STAGE": str(stage), "OUT": str(tmp_path / "out"), "PYTEST": "0", "PROVIDER": "cpu",
               "SECTIONS": "env", "RUN_BUDGET": "35", "BENCH_KEEP": "10",
               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        t0 = time.monotonic()
        r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "run.sh")], capture_output=True, text=True,
                           env=env, timeout=120)
        took = time.monotonic() - t0
    finally:
        sleeper.kill()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no SmolLM2 in the pack" in r.stdout and "bench rc=0" in r.stdout
    assert 4 <= took < 33, took
    assert json.loads((tmp_path / "out" / "gpu-run.json").read_text())["env"]


def test_smoke_cuda_dry_run_on_the_cpu():
    """scripts/gpu/smoke_cuda.py: onnxruntime's own kernels of an INT4 graph on the CUDA EP against the CPU EP,
    first thing after install.sh (a stripped CUDA library that fails is told in seconds); --provider cpu here."""
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu" / "smoke_cuda.py"), "--provider", "cpu"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ok: CPUExecutionProvider"), r.stdout + r.stderr
