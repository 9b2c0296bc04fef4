"""onnxruntime-genai's own generator on an edgespec bundle's graphs, for side-by-side benchmarks.

Token ids in, token ids out (no og.Tokenizer), greedy, batch 1, CPU. Import it from other scripts
in scripts/ (``from genai_baseline import genai_autoregressive, genai_speculative``) or run it as a
self-test::

    python scripts/genai_baseline.py BUNDLE [--drafter DIR] [--max-new-tokens N] [--draft-tokens K]

This is a benchmark helper, not part of the runtime: it needs ``onnxruntime-genai`` (an export-time
dependency of edgespec), and it never writes into a bundle. A model directory is any folder holding
``genai_config.json`` + ``model.onnx`` as written by the genai model builder (a bundle's
``target/`` or ``drafter/``); a bundle root is accepted too and means its ``target/``.

onnxruntime-genai 0.18 API used here:

* ``og.Config(dir)``; ``cfg.clear_providers()`` (CPU); ``cfg.overlay(json)`` for session options;
  ``og.Model(cfg)``.
* ``og.GeneratorParams(model)``; ``params.set_search_options(do_sample=False, max_length=...)``;
  ``params.set_speculative_options(max_draft_tokens=K, ngram_size=N, ngram_chained_lookup=bool,
  min_adaptive_k=M, cooldown=bool)``.
* ``og.Generator(model, params)``; ``generator.append_tokens(int32 [1, S])`` (prefill);
  ``generator.generate_next_token()`` emits exactly ONE token per call, in speculative mode too
  (a round's extra tokens are buffered and drained by later calls); ``generator.get_next_tokens()``;
  ``generator.is_done()``; ``generator.get_sequence(0)`` (excludes a final EOS);
  ``generator.get_speculative_stats() -> dict``.
* Draft-model speculation is switched on by a ``model.draft`` section in genai_config.json (same
  fields as ``model.decoder``; ``filename`` must be a relative path under the config's directory)
  plus ``speculative.max_draft_tokens``. We write such a config into a temp dir with hard links to the
  two bundles' graphs (each in its own sub-folder, since both use ``model.onnx.data``).
* N-gram (prompt lookup) speculation needs no config change: ``set_speculative_options(
  ngram_size=N)`` with N in 2..16 (matches the last N-1 tokens). It cannot be combined with a draft.

Timing: ``prefill_seconds`` is ``append_tokens`` (the prompt forward); ``decode_seconds`` covers
every ``generate_next_token`` call, i.e. all the returned tokens (the first one is the argmax of the
prefill logits, so autoregressive decode runs len(ids)-1 target forwards -- the same count as
edgespec's loop after its prefill). Model load / session creation is excluded; models are cached
per (directory, threads) across calls.
"""
from __future__ import annotations

import argparse
import atexit
import copy
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

try:
    import onnxruntime_genai as og
except ImportError as e:  # pragma: no cover - the benchmark extra is missing
    raise ImportError("genai_baseline needs onnxruntime-genai (pip install onnxruntime-genai)") from e

GENAI_CONFIG = "genai_config.json"
MAX_DRAFT_TOKENS = 16  # Speculative_Element::kMaxDraftTokens in onnxruntime-genai 0.18

_models: dict[tuple, "og.Model"] = {}
_tempdirs: list[str] = []


@atexit.register
def release() -> None:
    """Drop the cached models and remove their views (done at exit). A view's hard links stay until then, and
    onnx refuses to load external data that has several ("a potential hardlink attack"): a process that goes on
    to read the bundles with onnx (the export tools, another test) calls this first."""
    _models.clear()
    while _tempdirs:
        shutil.rmtree(_tempdirs.pop(), ignore_errors=True)


def model_dir(path: str | os.PathLike) -> Path:
    """The folder with genai_config.json: ``path`` itself, or a bundle root's ``target/``."""
    p = Path(path).resolve()
    for cand in (p, p / "target"):
        if (cand / GENAI_CONFIG).is_file():
            return cand
    raise FileNotFoundError(f"{path}: no {GENAI_CONFIG} here or in target/ (was the bundle exported "
                            f"with the genai model builder?)")


def _session_overlay(threads: int | None) -> dict:
    return {"intra_op_num_threads": int(threads)} if threads else {}


def _load(config_dir: Path, threads: int | None, key: tuple) -> "og.Model":
    if key not in _models:
        cfg = og.Config(str(config_dir))
        cfg.clear_providers()  # CPU
        so = _session_overlay(threads)
        if so:
            cfg.overlay(json.dumps({"model": {"decoder": {"session_options": so}}}))
        _models[key] = og.Model(cfg)
    return _models[key]


def load_model(path: str | os.PathLike, threads: int | None = None) -> "og.Model":
    """A cached plain (no draft) og.Model on CPU for a genai model dir or bundle root."""
    d = model_dir(path)
    key = ("plain", str(d), threads)
    return _models[key] if key in _models else _load(_builder_view(d), threads, key)


def _builder_view(d: Path) -> Path:
    """``d`` itself, or where its graph takes edgespec's ``logits_skip`` input (every export since
    session 29), a temp dir holding the graph without it (the builder's inputs only, which is all
    onnxruntime-genai feeds), its genai_config.json and hard links to its external data."""
    import onnx

    from edgespec_export.kernels import strip_logits_skip

    fname = json.loads((d / GENAI_CONFIG).read_text())["model"]["decoder"]["filename"]
    m = onnx.load(str(d / fname), load_external_data=False)
    if not strip_logits_skip(m.graph):
        return d
    tmp = _view_dir(d, "genai_view_")
    for f in _graph_files(d, fname)[1:] + [d / GENAI_CONFIG]:
        _link(f, tmp / f.name)
    onnx.save(m, str(tmp / fname))
    return tmp


def _view_dir(d: Path, prefix: str) -> Path:
    """A temp dir (removed at exit) on ``d``'s filesystem, so that its files can be hard links."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    if os.stat(tmp).st_dev != os.stat(d).st_dev:  # another filesystem: beside the bundle where it may
        try:
            beside = Path(tempfile.mkdtemp(prefix=prefix, dir=d.resolve().parent.parent))
            tmp.rmdir()
            tmp = beside
        except OSError:  # a read-only folder: the temp dir, with copies (_link)
            pass
    _tempdirs.append(str(tmp))
    return tmp


def _link(src: Path, dst: Path) -> None:
    """A hard link: onnxruntime refuses external data whose resolved path (a symlink's target) lies
    outside the graph's folder. A copy where the filesystem has no hard links (or refuses one)."""
    try:
        os.link(src.resolve(), dst)
    except OSError:
        shutil.copy2(src.resolve(), dst)


def _graph_files(d: Path, filename: str) -> list[Path]:
    files = [d / filename] + sorted(d.glob(filename + ".data*")) + sorted(d.glob(filename + "_data*"))
    return [f for f in files if f.is_file()]


def load_speculative_model(target: str | os.PathLike, drafter: str | os.PathLike, max_draft_tokens: int = 4,
                           threads: int | None = None) -> "og.Model":
    """A cached og.Model whose config has a ``model.draft`` section (draft-model speculation).

    Writes genai_config.json into a temp dir with ``target/`` and ``draft/`` sub-folders of
    hard links to the two graphs (and their external data); the bundles are never touched.
    """
    td, dd = model_dir(target), model_dir(drafter)
    key = ("draft", str(td), str(dd), int(max_draft_tokens), threads)
    if key in _models:
        return _models[key]
    td, dd = _builder_view(td), _builder_view(dd)
    tcfg = json.loads((td / GENAI_CONFIG).read_text())
    dcfg = json.loads((dd / GENAI_CONFIG).read_text())
    if int(tcfg["model"]["vocab_size"]) != int(dcfg["model"]["vocab_size"]):
        raise ValueError(f"target vocab {tcfg['model']['vocab_size']} != drafter vocab {dcfg['model']['vocab_size']}")
    tmp = _view_dir(td, "genai_spec_")
    cfg = copy.deepcopy(tcfg)
    so = _session_overlay(threads)
    blocks = {}
    for sub, src, c in (("target", td, tcfg), ("draft", dd, dcfg)):
        block = copy.deepcopy(c["model"]["decoder"])
        fname = block["filename"]
        (tmp / sub).mkdir()
        files = _graph_files(src, fname)
        if not files or files[0].name != fname:
            raise FileNotFoundError(f"{src / fname} is missing")
        for f in files:
            _link(f, tmp / sub / f.name)
        block["filename"] = f"{sub}/{fname}"
        if so:
            block.setdefault("session_options", {}).update(so)
        blocks[sub] = block
    cfg["model"]["decoder"] = blocks["target"]
    cfg["model"]["draft"] = blocks["draft"]
    cfg["speculative"] = {"max_draft_tokens": int(max_draft_tokens)}
    (tmp / GENAI_CONFIG).write_text(json.dumps(cfg, indent=2))
    return _load(tmp, None, key)


def _check_k(k: int) -> int:
    k = int(k)
    if not 1 <= k <= MAX_DRAFT_TOKENS:
        raise ValueError(f"draft_tokens must be in 1..{MAX_DRAFT_TOKENS} for onnxruntime-genai, got {k}")
    return k


def _run(model: "og.Model", prompt_ids: Sequence[int], max_new_tokens: int, spec: dict | None):
    """Greedy generation; returns (new ids incl. a final EOS, prefill s, decode s, generator)."""
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("the prompt is empty")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + int(max_new_tokens), batch_size=1)
    if spec:
        params.set_speculative_options(**spec)
    gen = og.Generator(model, params)
    t0 = time.perf_counter()
    gen.append_tokens(np.asarray([prompt], dtype=np.int32))
    t1 = time.perf_counter()
    new: list[int] = []
    while not gen.is_done() and len(new) < max_new_tokens:
        gen.generate_next_token()
        new.append(int(gen.get_next_tokens()[0]))
    t2 = time.perf_counter()
    # the sequence genai keeps excludes a final EOS; the per-call tokens must agree with it
    seq = [int(t) for t in gen.get_sequence(0)][len(prompt):]
    if new[: len(seq)] != seq or len(new) - len(seq) > 1:
        raise RuntimeError(f"genai's per-step tokens {new} disagree with its sequence {seq}")
    return new, t1 - t0, t2 - t1, gen


def genai_autoregressive(model_dir: str | os.PathLike, prompt_ids: Sequence[int], max_new_tokens: int, *,
                         threads: int | None = None) -> tuple[list[int], float, float]:
    """Plain greedy decoding with onnxruntime-genai on CPU, batch 1.

    Returns ``(new_token_ids, decode_seconds, prefill_seconds)``; the ids include a final EOS if
    one was generated (as edgespec's ``Result.token_ids`` do).
    """
    model = load_model(model_dir, threads)
    new, prefill_s, decode_s, _ = _run(model, prompt_ids, max_new_tokens, None)
    return new, decode_s, prefill_s


def genai_speculative(target_dir: str | os.PathLike, prompt_ids: Sequence[int], max_new_tokens: int,
                      draft_tokens: int, drafter_dir: str | os.PathLike | None = None, *,
                      ngram_size: int = 3, ngram_chained_lookup: bool = False, adaptive_k: int = 0,
                      threads: int | None = None) -> tuple[list[int], float, dict]:
    """onnxruntime-genai's own greedy speculative decoding on CPU, batch 1.

    With ``drafter_dir``: draft-model speculation (``model.draft`` config section), ``draft_tokens``
    = K drafted per round. Without: n-gram / prompt-lookup speculation with ``ngram_size`` (2..16,
    matches the last N-1 tokens; edgespec's prompt lookup matches up to 3 tokens, i.e. N=4) and
    up to ``draft_tokens`` proposed per round. ``adaptive_k`` > 0 turns on genai's adaptive width
    (``min_adaptive_k``: start/floor, ceiling 16; ``draft_tokens`` is then not the ceiling).

    Returns ``(new_token_ids, decode_seconds, stats)``: ``stats`` is
    ``generator.get_speculative_stats()`` plus ``mode``, ``prefill_seconds`` and ``options``.
    """
    k = _check_k(draft_tokens)
    if drafter_dir is not None:
        model = load_speculative_model(target_dir, drafter_dir, k, threads)
        spec = {"max_draft_tokens": k}
        mode = "draft-model"
    else:
        if not 2 <= int(ngram_size) <= 16:
            raise ValueError(f"ngram_size must be in 2..16, got {ngram_size}")
        model = load_model(target_dir, threads)
        spec = {"ngram_size": int(ngram_size), "max_draft_tokens": k,
                "ngram_chained_lookup": bool(ngram_chained_lookup)}
        mode = "ngram"
    if adaptive_k:
        spec["min_adaptive_k"] = _check_k(adaptive_k)
    new, prefill_s, decode_s, gen = _run(model, prompt_ids, max_new_tokens, spec)
    stats = dict(gen.get_speculative_stats())
    stats.update(mode=mode, prefill_seconds=prefill_s, options=spec)
    return new, decode_s, stats


# -- self-test ---------------------------------------------------------------------------------------
_PROMPT = ("Here is a function. Repeat it exactly, then rename `total` to `acc`:\n\n"
           "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n")


def _prompt_ids(bundle: Path) -> tuple[list[int], object | None]:
    """Chat-encode the test prompt with edgespec when the bundle has a manifest (returns the engine)."""
    if (bundle / "edgespec.json").is_file():
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import edgespec

        engine = edgespec.load(bundle, model_sampling=False, use_drafter=False)
        return engine.encode([{"role": "user", "content": _PROMPT}]), engine
    return [1, 504, 3458, 282, 4649, 314, 253, 14840], None


def _first_diff(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _rate(n: int, s: float) -> str:
    """Decode speed as edgespec's Stats.tokens_per_second: tokens after the first / decode time."""
    return f"{(n - 1) / s:7.1f} tok/s" if s > 0 and n > 1 else "   n/a"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle", help="edgespec bundle root (or a genai model dir)")
    ap.add_argument("--drafter", help="genai model dir / bundle for draft-model speculation "
                                      "(default: the bundle's drafter/ if it has one)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--ngram-size", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-edgespec", action="store_true", help="skip the edgespec greedy comparison")
    a = ap.parse_args(argv)

    bundle = Path(a.bundle)
    tdir = model_dir(bundle)
    drafter = a.drafter
    if drafter is None and (bundle / "drafter" / GENAI_CONFIG).is_file():
        drafter = str(bundle / "drafter")
    prompt, engine = _prompt_ids(bundle) if not a.no_edgespec else ([1, 504, 3458, 282, 4649, 314, 253, 14840], None)
    n = a.max_new_tokens
    print(f"onnxruntime-genai {og.__version__}; target {tdir}; prompt {len(prompt)} tokens; "
          f"max_new_tokens {n}; threads {a.threads or 'default'}")
    ok = True

    load_model(tdir, a.threads)
    genai_autoregressive(tdir, prompt, 4, threads=a.threads)  # warm-up
    ar, dec, pre = genai_autoregressive(tdir, prompt, n, threads=a.threads)
    print(f"autoregressive   : {len(ar)} tokens, prefill {pre * 1000:6.1f} ms, decode {dec:6.3f} s "
          f"{_rate(len(ar), dec)}\n  ids {ar}")

    runs = [("ngram", None)]
    if drafter:
        runs.append(("draft-model", drafter))
    for name, d in runs:
        try:
            ids, dec_s, st = genai_speculative(tdir, prompt, n, a.draft_tokens, d, ngram_size=a.ngram_size,
                                               threads=a.threads)
        except Exception as e:  # report and keep going
            ok = False
            print(f"{name:17s}: FAILED: {type(e).__name__}: {e}")
            continue
        diff = _first_diff(ids, ar)
        same = "== autoregressive" if diff is None else f"differs from autoregressive at new token {diff}"
        hits = f", ngram hits/misses {st['ngram_lookup_hits']}/{st['ngram_lookup_misses']}" if name == "ngram" else ""
        print(f"{name:17s}: {len(ids)} tokens, decode {dec_s:6.3f} s {_rate(len(ids), dec_s)}; {same}\n"
              f"  rounds {st['rounds']}, proposed {st['draft_tokens_proposed']}, accepted "
              f"{st['draft_tokens_accepted']} (rate {st['acceptance_rate']:.2f}), target passes "
              f"{st['target_forward_passes']}, draft passes {st['draft_forward_passes']}, "
              f"draft ms {st['total_draft_ms']:.1f}, target ms {st['total_target_ms']:.1f}{hits}")
        if diff is not None:
            print(f"  ids {ids}")

    if engine is not None:
        from edgespec.decoder import Stats

        cfg = engine.config(max_new_tokens=n, drafter="none")
        for _ in engine.decoder.generate(prompt, engine.config(max_new_tokens=4, drafter="none")):
            pass  # warm-up (note: edgespec then reuses the cached prompt prefix)
        st = Stats()
        es = [t for step in engine.decoder.generate(prompt, cfg, st) for t in step.tokens]
        diff = _first_diff(es, ar)
        print(f"edgespec greedy  : {len(es)} tokens, decode {st.decode_s:6.3f} s "
              f"{_rate(len(es), st.decode_s)} (prefix-cached prefill); "
              + ("== genai autoregressive" if diff is None else f"DIFFERS from genai at new token {diff}"))
        if diff is not None:
            print(f"  ids {es}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
