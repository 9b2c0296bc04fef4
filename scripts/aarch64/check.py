"""edgespec's kernels on aarch64 (their portable path), checked under qemu's user-mode emulation against this x86-64
machine's AVX2 path, bit for bit. No ARM machine needed: ``scripts/aarch64/setup.sh`` makes an aarch64 Python with
onnxruntime, numpy and tokenizers that runs here (slowly: tiny shapes only).

    .venv/bin/python scripts/aarch64/check.py prepare /tmp/a64                # here: models, inputs, x86's outputs
    /tmp/edgespec-aarch64/py scripts/aarch64/check.py verify /tmp/a64 [--bundle B]   # emulated: the same on aarch64

``prepare`` builds MatMulQ4 nodes (zero points or none, float minimums, Q4_K's scale bytes, a bias, SwiGLU) and
DecodeAttention nodes (float32 and float16 caches; windows, score caps, partial and interleaved rotaries; calls of
1-9 rows at several first positions; alternates), runs each on the AVX2 path and the portable one (they must agree),
and writes models, inputs and outputs. ``verify`` builds the library for aarch64 (``CXX``: setup.sh's cross
compiler), runs every case there and compares each output with x86's bitwise, each MatMulQ4 row also alone (one-token
calls compute what wider ones do); with ``--bundle`` (an exact-kernels bundle) greedy speculative decoding equals plain
decoding there. Exit 0 when all of it holds.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def _sessions(path: str, model_bytes: bytes):
    import onnxruntime as ort

    from edgespec.native import library_path

    so = ort.SessionOptions()
    so.register_custom_ops_library(library_path())
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def prepare(out: Path) -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    import test_native as T  # the tests' graph builders

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(43)
    cases = []
    mm = [T._graph(K, N, b, "MatMulQ4", zp, seed=K + N) for K, N, b, zp in
          ((256, 48, 128, True), (96, 37, 32, False), (512, 70, 64, True), (256, 37, 32, "float"))]
    mm += [T._fused_graph(256, 48, 128, seed=2), T._fused_graph(96, 37, 32, False, seed=4, swiglu=False)]
    from edgespec_export.kernels import pack_q4

    b, scale, zp, _ = T._q4k_like(70, 512, seed=7)
    mm.append(T._q4_node_model(512, 70, pack_q4(b, scale, zp, 512, 70, 32)))
    for i, model in enumerate(mm):
        K = model.graph.input[0].type.tensor_type.shape.dim[-1].dim_value
        x = rng.normal(size=(9, K)).astype(np.float32)
        x[2], x[3] = 0.0, x[3] * 1e4
        cases.append({"name": f"matmul{i}", "model": model, "feeds": [{"A": x}], "rows": True})
    att = [(12, 2, 128, -1, 0.0, None, 0), (6, 2, 48, 16, 30.0, None, 0), (4, 2, 64, 1, 0.0, 16, 0),
           (3, 1, 16, 50, 5.0, None, 1)]
    for op in ("DecodeAttention", "DecodeAttentionF16"):
        for j, (H, KVH, D, window, softcap, rot, inter) in enumerate(att):
            L, P = 160, 180
            ck, cv, qkv = T._attention_inputs(H, KVH, D, L, 140, 9, seed=12 + j)
            if op.endswith("F16"):
                ck, cv = ck.astype(np.float16), cv.astype(np.float16)
            kw = dict(window=window, softcap=softcap, rot=rot, interleaved=inter)
            feeds = [{"qkv": qkv[:, :n], "pk": ck, "pv": cv, "seqlens": np.array([past + n - 1], np.int32)}
                     for past in (0, 7, 64, 130) for n in (1, 2, 5, 9)]
            cases.append({"name": f"{op}-{j}", "model": T._attention_graph(op, H, KVH, D, L, P, **kw), "feeds": feeds,
                          "keep": [past + n for past in (0, 7, 64, 130) for n in (1, 2, 5, 9)], "libm": softcap > 0})
            cases.append({"name": f"{op}-{j}-alternates",
                          "model": T._attention_graph(op, H, KVH, D, L, P, positions=True, **kw),
                          "feeds": [{"qkv": qkv[:, :8], "pk": ck, "pv": cv, "seqlens": np.array([47], np.int32),
                                     "pos": np.array([0, 1, 2, 3, 4, 1, 3, 4], np.int64)}], "keep": [48],
                          "libm": softcap > 0})
    index = []
    for c in cases:
        c["model"].ir_version = 8  # (onnxruntime 1.22's, the runtime's oldest: it reads IR versions up to 10)
        outs = {}
        for path in ("avx2", "portable"):
            os.environ["EDGESPEC_Q4_ISA"] = path
            s = _sessions(path, c["model"].SerializeToString())
            outs[path] = [s.run(None, f) for f in c["feeds"]]
        for i, (a, p) in enumerate(zip(outs["avx2"], outs["portable"])):
            for k, (x, y) in enumerate(zip(a, p)):
                n = c.get("keep")
                if k and n:  # (a present cache past the call's rows holds whatever its buffer held)
                    x, y = x[:, :, :n[i]], y[:, :, :n[i]]
                assert np.array_equal(x, y, equal_nan=True), (c["name"], "the paths disagree here")
        (out / f"{c['name']}.onnx").write_bytes(c["model"].SerializeToString())
        arrays = {}
        for i, (f, o) in enumerate(zip(c["feeds"], outs["avx2"])):
            arrays.update({f"in{i}_{k}": v for k, v in f.items()})
            arrays.update({f"out{i}_{k}": v for k, v in enumerate(o)})
        np.savez(out / f"{c['name']}.npz", **arrays)
        index.append({"name": c["name"], "calls": len(c["feeds"]), "feeds": list(c["feeds"][0]),
                      "keep": c.get("keep"), "rows": c.get("rows", False), "libm": c.get("libm", False)})
    (out / "cases.json").write_text(json.dumps(index, indent=1))
    print(f"{len(index)} cases written to {out} (x86's AVX2 and portable paths agree on every one)")
    return 0


def verify(src: Path, bundle: str | None) -> int:
    from edgespec.native import isa

    print(f"machine {platform.machine()}, kernel path {isa()}")
    bad = near = 0
    t0 = time.time()
    for c in json.loads((src / "cases.json").read_text()):
        s = _sessions(c["name"], (src / f"{c['name']}.onnx").read_bytes())
        z = np.load(src / f"{c['name']}.npz")
        for i in range(c["calls"]):
            feeds = {k: z[f"in{i}_{k}"] for k in c["feeds"]}
            got = s.run(None, feeds)
            for k, g in enumerate(got):
                want = z[f"out{i}_{k}"]
                if k and c["keep"]:
                    g, want = g[:, :, :c["keep"][i]], want[:, :, :c["keep"][i]]
                if not np.array_equal(g, want, equal_nan=True):
                    # a score cap's tanh is libm's (std::tanh), whose last bit differs between machines' builds (14
                    # of 20,000 values between this x86-64's glibc and aarch64's): the rows stay alike at every width
                    # on each machine, and near the other's
                    if c["libm"] and np.allclose(g, want, rtol=1e-5, atol=1e-6):
                        near += 1
                        continue
                    bad += 1
                    d = np.abs(g.astype(np.float64) - want.astype(np.float64))
                    print(f"  {c['name']} call {i} output {k}: differs from x86's (max |diff| {np.nanmax(d):.3g})")
            if c["rows"]:  # each row alone: what the wider call computed for it
                x = feeds["A"]
                for r in range(x.shape[0]):
                    if not np.array_equal(s.run(None, {"A": x[r:r + 1]})[0], got[0][r:r + 1]):
                        bad += 1
                        print(f"  {c['name']} row {r} alone differs from the same row in a call of {x.shape[0]}")
        print(f"  {c['name']}: {c['calls']} calls")
    print(f"ops: {'every output bitwise x86' + chr(39) + 's' if not bad else f'{bad} mismatches'}"
          + (f" but {near} with a score cap (libm's tanh), within 1e-5 of x86's" if near else "")
          + f" ({time.time() - t0:.0f} s)")
    if bundle:
        import edgespec

        eng = edgespec.load(bundle, memory=False, threads=1, model_sampling=False)
        prompt = "def fizzbuzz(n):\n    for i in range(1, n + 1):\n        if i % 15 == 0:\n"
        plain = eng.generate(prompt, max_new_tokens=24, drafter="none", ignore_eos=True).token_ids
        for d in [d for d in ("prompt-lookup", "model") if d in eng.decoder.drafters]:
            got = eng.generate(prompt, max_new_tokens=24, drafter=d, ignore_eos=True).token_ids
            ok = got == plain
            bad += not ok
            print(f"bundle {bundle}: greedy with {d} {'equals' if ok else 'DIFFERS FROM'} plain decoding "
                  f"({len(plain)} tokens)")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["prepare", "verify"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--bundle", help="verify: an exact-kernels bundle to decode greedily there too")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    return prepare(a.dir) if a.what == "prepare" else verify(a.dir, a.bundle)


if __name__ == "__main__":
    sys.exit(main())
