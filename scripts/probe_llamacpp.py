"""Why llama.cpp decodes as fast as it does on this machine: its plain decoding of one GGUF under a few
configurations, one llama-server each (scripts/build_llamacpp.sh builds it), side by side in one run.

    python scripts/probe_llamacpp.py MODEL.gguf --tokenizer BUNDLE [--thp]

Rows: 1 and 2 threads (tok/s that doubles with the threads is compute-bound, not bandwidth-bound), weight
repacking off, the threadpool polling on, and with --thp transparent huge pages set to "always" for the
run (root only; the setting is put back). Each row: decode tok/s of --reps 128-token greedy replies to one
prompt, and llama.cpp's own prefill tok/s for that prompt.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
PROMPT = "Write a Python function that parses an ISO 8601 date string and returns a datetime."


def _thp_mode() -> str | None:
    try:
        return next(w.strip("[]") for w in THP.read_text().split() if w.startswith("["))
    except (OSError, StopIteration):
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("--tokenizer", required=True, help="a bundle of the same model (its tokenizer makes the prompt ids)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--thp", action="store_true", help='also run with transparent huge pages "always" (root)')
    a = ap.parse_args(argv)
    if a.reps < 1 or a.tokens < 1:
        ap.error("--reps and --tokens must be at least 1")
    if not Path(a.gguf).is_file():
        print(f"error: no such GGUF file: {a.gguf}", file=sys.stderr)
        return 2
    from llamacpp_baseline import SERVER, LlamaServer

    if not SERVER.is_file():
        print(f"error: {SERVER} is missing: run scripts/build_llamacpp.sh first", file=sys.stderr)
        return 2
    from edgespec.errors import EdgespecError
    from edgespec.manifest import load_manifest
    from edgespec.tokenizer import Tokenizer

    try:
        m = load_manifest(a.tokenizer)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ids = Tokenizer(m.tokenizer_dir, add_bos=m.add_bos, bos_token_id=m.bos_token_id).encode(PROMPT)
    rows = [("2 threads", 2, [], None), ("1 thread", 1, [], None), ("2 threads, no repacking", 2, ["--no-repack"], None),
            ("2 threads, polling 50", 2, ["--poll", "50"], None)]
    before = _thp_mode()
    if a.thp:
        if before is None or not THP.exists():
            print("error: --thp: no transparent huge page setting to change here", file=sys.stderr)
            return 2
        rows.append(("2 threads, THP always", 2, [], "always"))
    print(f"llama.cpp plain decoding, {a.gguf}, {a.reps} x {a.tokens} tokens (THP: {before})")
    print("| configuration | decode tok/s | prefill tok/s |\n|---|---|---|")
    try:
        for name, threads, extra, thp in rows:
            if thp:
                try:
                    THP.write_text(thp)
                except OSError as e:
                    print(f"error: cannot set transparent huge pages: {e.strerror or e}", file=sys.stderr)
                    return 2
            s = LlamaServer(a.gguf, threads=threads, ctx=max(1024, len(ids) + a.tokens + 16), extra=extra)
            try:
                s.complete(ids, 8)  # warm
                t = [s.complete(ids, a.tokens)["timings"] for _ in range(a.reps)]
            finally:
                s.close()
            rates = ", ".join(f"{x['predicted_n'] / x['predicted_ms'] * 1000:.1f}" for x in t)
            print(f"| {name} | {rates} | {t[0]['prompt_per_second']:.1f} |", flush=True)
    finally:
        if a.thp and before and _thp_mode() != before:
            THP.write_text(before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
