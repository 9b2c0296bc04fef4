#!/usr/bin/env python3
"""Perplexity of bundles' targets on one text, side by side with llama.cpp's ``llama-perplexity`` on the
GGUF the first bundle was exported from: what edgespec's export (the GGUF dequantized, then quantized
again to INT4) costs in quality against the GGUF's own quantization, on the same tokens.

    python scripts/perplexity_vs_llamacpp.py bundles/qwen-coder-b128-xk bundles/qwen-coder-b128 --llamacpp \\
        --out docs/bench/perplexity_s34.md

Both tools cut the text's tokens into windows of ``--window`` and score positions window/2+1 .. window-1 of
each (edgespec/perplexity.py follows llama-perplexity's rule). Default text: scripts/data/heldout_code.txt,
Python written in 2026 (a copy of edgespec/policy.py), which the 2024 models cannot have seen. Runs one
after the other (one heavy job at a time).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TEXT = ROOT / "scripts" / "data" / "heldout_code.txt"
PERPLEXITY = ROOT / ".llamacpp" / "bin" / "llama-perplexity"


def llamacpp(gguf: str, text: Path, window: int, windows: int | None, threads: int, flags=()) -> dict:
    """llama-perplexity's final estimate, its chunk count and its wall time (``flags``: more options, e.g. a KV
    cache type)."""
    if not PERPLEXITY.is_file():
        raise FileNotFoundError(f"{PERPLEXITY} is missing: run scripts/build_llamacpp.sh first")
    cmd = [str(PERPLEXITY), "-m", gguf, "-f", str(text), "-c", str(window), "-b", str(window), "-t", str(threads),
           "-tb", str(threads)] + (["--chunks", str(windows)] if windows else []) + list(flags)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    secs = time.perf_counter() - t0
    out = p.stdout + p.stderr
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"llama-perplexity failed ({p.returncode}): {out[-2000:]}")
    chunks = re.search(r"calculating perplexity over (\d+) chunks", out)
    return {"perplexity": float(m.group(1)), "error": float(m.group(2)), "windows": int(chunks.group(1)) if chunks
            else None, "seconds": secs,
            "command": " ".join([".llamacpp/bin/llama-perplexity", "-m", Path(gguf).name, "-f", _rel(text)] + cmd[5:])}


def _rel(p: Path) -> str:
    try:
        return str(Path(p).resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--text", default=str(TEXT))
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--max-windows", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llamacpp", action="store_true", help="also llama-perplexity on the first bundle's GGUF")
    ap.add_argument("--llamacpp-cache-type", action="append", default=[],
                    help="with --llamacpp: a run with this KV cache type too (-ctk and -ctv, flash attention on, "
                         "where llama.cpp quantizes values; e.g. q8_0; repeatable)")
    ap.add_argument("--out", default=None, help="write the report (markdown) here too")
    args = ap.parse_args(argv)
    import edgespec
    from edgespec.errors import EdgespecError
    from edgespec.perplexity import perplexity

    text = Path(args.text).read_text(encoding="utf-8")
    rows, gguf = [], None
    try:
        for b in args.bundles:
            eng = edgespec.load(b, model_sampling=False, max_context=args.window, threads=args.threads, use_drafter=False, memory=False,
                                prompt_cache_mb=0)
            gguf = gguf or eng.manifest.sources.get("target")
            r = perplexity(eng, eng.tokenizer.encode(text, parse_special=False), args.window, args.max_windows)
            eng.close()
            rows.append((f"edgespec, {Path(b).name}", r.perplexity, None, r.windows, r.seconds))
            print(f"{b}: {r.perplexity:.4f} ({r.windows} windows, {r.tokens} tokens scored, {r.seconds:.0f} s)",
                  file=sys.stderr)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cmd = None
    if args.llamacpp:
        if not (gguf and str(gguf).endswith(".gguf")):
            print("error: --llamacpp needs a bundle exported from a GGUF", file=sys.stderr)
            return 2
        try:
            r = llamacpp(str(gguf), Path(args.text), args.window, args.max_windows, args.threads)
            typed = [(t, llamacpp(str(gguf), Path(args.text), args.window, args.max_windows, args.threads,
                                  ("-ctk", t, "-ctv", t, "-fa", "on"))) for t in args.llamacpp_cache_type]
        except (OSError, RuntimeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        cmd = r["command"]
        rows.append((f"llama.cpp, {Path(gguf).name}", r["perplexity"], r["error"], r["windows"], r["seconds"]))
        rows += [(f"llama.cpp, {Path(gguf).name}, KV {t} (`-ctk {t} -ctv {t} -fa on`)", x["perplexity"], x["error"],
                  x["windows"], x["seconds"]) for t, x in typed]
    lines = [f"# Perplexity on {Path(args.text).name}, windows of {args.window}", "",
             "`python scripts/perplexity_vs_llamacpp.py " + " ".join(args.bundles)
             + (f" --window {args.window}" if args.window != 512 else "")
             + (f" --max-windows {args.max_windows}" if args.max_windows else "")
             + (" --llamacpp" if args.llamacpp else "")
             + "".join(f" --llamacpp-cache-type {t}" for t in args.llamacpp_cache_type) + "`", ""]
    if cmd:
        lines += [f"llama.cpp: `{cmd}`", ""]
    lines += ["| runner | perplexity | windows | seconds |", "|---|---|---|---|"]
    for name, ppl, err, n, secs in rows:
        lines.append(f"| {name} | {ppl:.4f}{f' +/- {err:.4f}' if err is not None else ''} | {n} | {secs:.0f} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
