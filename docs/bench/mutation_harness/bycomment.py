"""(session 89) Run each mutant of MUTFILE against the tests its comment names (-k of the names, a file's "::"
prefix dropped), in FILES, through run.py; run from the copy, as run.py.
python bycomment.py MUTFILE RESULTS FILES... [--only IDS]"""
import re, subprocess, sys, runpy
mutfile, results, *files = sys.argv[1:]
only = None
if "--only" in files:
    i = files.index("--only"); only = set(files[i + 1].split(",")); files = files[:i] + files[i + 2:]
text = open(mutfile).read()
muts = runpy.run_path(mutfile)["MUTANTS"]
for mid, *_ in muts:
    if only and mid not in only:
        continue
    m = re.search(rf"^# {mid} (.*)$", text, re.M)
    text_ = re.sub(r"test_[A-Za-z0-9_]+(\.py)?::", "", m.group(1) if m else "")
    names = sorted(set(n.rstrip("_.") for n in re.findall(r"(test_[A-Za-z0-9_]+)(?:\.py)?", text_)))
    if not names:
        print(f"{mid}: no tests named", flush=True)
        with open(results, "a") as f: f.write(f"{mid}: NO-TESTS\n")
        continue
    k = " or ".join(names)
    subprocess.run([sys.executable, "/work/main/docs/bench/mutation_harness/run.py", mutfile, *files, "--only", mid,
                    "--k", k, "--timeout", "300"], env={**__import__("os").environ, "MUT_RESULTS": results})
