"""Mutation harness: python run.py MUTFILE TESTS... [--only IDS] [--k EXPR]
MUTFILE defines MUTANTS = [(id, relpath, old, new), ...]; old must occur exactly once.
Run from the clone root (/tmp/mut). Results appended to /tmp/mutw/results.txt"""
import subprocess, sys, os, time, runpy, argparse
ap = argparse.ArgumentParser()
ap.add_argument("mutfile"); ap.add_argument("tests", nargs="+")
ap.add_argument("--only", default=""); ap.add_argument("--k", default=""); ap.add_argument("--timeout", default="120")
a = ap.parse_args()
muts = runpy.run_path(a.mutfile)["MUTANTS"]
only = set(a.only.split(",")) if a.only else None
env = dict(os.environ, PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1")
for mid, path, old, new in muts:
    if only and mid not in only:
        continue
    src = open(path).read()
    n = src.count(old)
    if n != 1:
        print(f"{mid}: BAD old occurs {n} times", flush=True); continue
    open(path, "w").write(src.replace(old, new))
    t = time.time()
    try:
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--timeout", a.timeout, *a.tests]
        if a.k: cmd += ["-k", a.k]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    finally:
        open(path, "w").write(src)
    tail = [l for l in r.stdout.splitlines() if l.strip()][-1:] 
    status = "CAUGHT" if r.returncode == 1 else ("SURVIVED" if r.returncode == 0 else f"rc={r.returncode}")
    first_fail = next((l for l in r.stdout.splitlines() if l.startswith("FAILED tests") or l.startswith("ERROR tests")), "")
    line = f"{mid}: {status} {time.time()-t:.0f}s {tail[0] if tail else ''} {first_fail[:150]}"
    print(line, flush=True)
    with open(os.environ.get("MUT_RESULTS", "/tmp/mutw/results.txt"), "a") as f: f.write(line + "\n")
