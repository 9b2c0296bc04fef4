"""``edgespec bench``: the memory/latency profiling report.

Every prompt runs once per drafter, interleaved (prompt by prompt, drafter by drafter), with the
caches reset before each run, so autoregressive and speculative figures come from the same
minutes of the same machine. Greedy runs are checked token for token against the
autoregressive run (``exact``). Writes report.json, report.md and PNG plots (with matplotlib).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .drafters import drafter_choices
from .profiles import MAX_DRAFT
from .errors import ConfigError, ContextOverflowError, parse_reason
from .integrity import write_whole
from .measure import file_rss, high_water_rss, rss_now

DEFAULT_PROMPTS = Path(__file__).parent / "data" / "prompts.jsonl"


def read_prompts(path: str | os.PathLike | None = None, limit: int | None = None,
                 categories: Sequence[str] | None = None, per_category: int | None = None) -> list[dict]:
    """Read Spec-Bench's question.jsonl format: question_id, category, turns (list of strings).
    ``per_category`` keeps the first N prompts of each category, ``limit`` the first N in all."""
    for what, v in (("--limit", limit), ("--per-category", per_category)):
        if v is not None and v < 1:
            raise ConfigError(f"{what} must be at least 1, got {v}")
    p = Path(path) if path else DEFAULT_PROMPTS
    if not p.is_file():
        raise ConfigError(f"the prompt file {p} is a directory" if p.is_dir() else f"the prompt file {p} is not a "
                          f"regular file (a device or a pipe)" if p.exists() else f"no such prompt file: {p}")
    out, seen = [], set()
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}): "
                          "a JSON lines file is expected") from None
    except OSError as e:
        raise ConfigError(f"cannot read {p}: {e.strerror or e}") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            q = json.loads(line)
        except (ValueError, RecursionError) as e:  # (not JSON; an integer too long to convert; nested too deeply)
            raise ConfigError(f"{p}:{n}: not JSON ({parse_reason(e)})") from None
        if not isinstance(q, dict) or not isinstance(q.get("turns"), list) or not q["turns"] \
                or not all(isinstance(t, str) for t in q["turns"]):
            raise ConfigError(f"{p}:{n}: needs 'turns', a non-empty list of strings")
        # (an empty turn passed, and stopped the bench at it, every prompt after it not run; session 56, a review)
        empty = next((i for i, t in enumerate(q["turns"]) if not t.strip()), None)
        if empty is not None:
            raise ConfigError(f"{p}:{n}: turn {empty + 1} is empty")
        # (a JSON escape's lone surrogate: in a later turn it stopped the bench there, every run before it lost; in a
        # category or an id, the report could not be written after the whole run)
        for what, t in [*((f"turn {i + 1}", t) for i, t in enumerate(q["turns"])),
                        *((k, q[k]) for k in ("category", "question_id") if isinstance(q.get(k), str))]:
            try:
                t.encode("utf-8")
            except UnicodeEncodeError:
                raise ConfigError(f"{p}:{n}: {what} holds an unpaired UTF-16 surrogate (a broken "
                                  "\\uD800-\\uDFFF escape)") from None
        q.setdefault("category", "default")
        q.setdefault("question_id", str(n))
        if isinstance(q["question_id"], bool) or not isinstance(q["question_id"], (str, int)):
            raise ConfigError(f"{p}:{n}: 'question_id' must be a string or an integer, got "
                              f"{type(q['question_id']).__name__}")
        q["question_id"] = str(q["question_id"])  # (Spec-Bench's and MT-Bench's are integers: 81)
        if not isinstance(q["category"], str):
            raise ConfigError(f"{p}:{n}: 'category' must be a string, got {type(q['category']).__name__}")
        seen.add(q["category"])
        if categories and q["category"] not in categories:
            continue
        if per_category and sum(1 for o in out if o["category"] == q["category"]) >= per_category:
            continue
        out.append(q)
    unknown = sorted(set(categories or ()) - seen)
    if unknown:
        raise ConfigError(f"{p}: no category {', '.join(map(repr, unknown))}; it has {', '.join(sorted(seen))}")
    if limit:
        out = out[:limit]
    if not out:
        raise ConfigError(f"{p}: no prompts")
    return out


class MemorySampler:
    """Samples this process's resident memory every ``interval`` seconds in a thread."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.samples.append((time.perf_counter() - self._t0, rss_now()))
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


MODEL_DRAFTING = ("model_calls", "model_tokens", "model_call_s")


def open_for_bench(bundle, drafters: Sequence[str], prompts: str | os.PathLike, limit: int, *,
                   threads: int | None = None, max_context: int | None = None):
    """(engine, prompts) for a script's side-by-side runs: the first ``limit`` prompts of ``prompts``
    (``read_prompts``), the engine loaded without memory, each drafter checked (``ConfigError`` for one that is
    not loaded), one short warm-up generation run."""
    from .api import load

    qs = read_prompts(prompts, limit=limit)
    eng = load(bundle, threads=threads, memory=False, max_context=max_context, model_sampling=False)
    for d in drafters:
        eng.config(drafter=d)
    eng.generate("Hello", max_new_tokens=8, drafter="none")  # warm-up
    return eng, qs


def model_drafting(d: dict) -> dict | None:
    """A run's model-drafter figures (``Stats.model_*``, names without the prefix), None where it made
    no call."""
    if not d["model_calls"]:
        return None
    return {k[len("model_"):]: (round(v, 6) if isinstance(v, float) else v) for k, v in d.items()}


@dataclass
class Run:
    question_id: str
    category: str
    turn: int
    drafter: str
    new_tokens: int
    ttft_ms: float
    decode_s: float
    tokens_per_second: float
    tpot_ms: float
    drafted: int
    accepted: int
    rounds: int
    target_calls: int
    draft_s: float
    target_s: float
    other_s: float
    accepted_by_position: list[int]
    drafted_by_position: list[int]
    exact: bool | None
    # of draft_s, the model drafter's calls (Stats.model_*: calls, tokens, seconds), where it drafted
    model_drafting: dict | None = None


@dataclass
class Report:
    bundle: str
    device: dict
    settings: dict
    runs: list[Run] = field(default_factory=list)
    memory: dict = field(default_factory=dict)
    plan: dict = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)  # prompts (or later turns) the context could not hold
    stopped: str | None = None  # why the bench ended before its last prompt (Ctrl-C, an error): the runs are those done

    def summary(self) -> dict:
        """Per category and drafter: tokens/s (total tokens / total decode time), speedup against
        'none' in the same run, acceptance rate, mean accepted length, TTFT, TPOT, exactness."""
        out: dict[str, dict[str, dict]] = {}
        cats = sorted({r.category for r in self.runs}) + ["all"]
        drafters = list(dict.fromkeys(r.drafter for r in self.runs))
        for c in cats:
            rows = [r for r in self.runs if c == "all" or r.category == c]
            out[c] = {}
            for d in drafters:
                rs = [r for r in rows if r.drafter == d]
                if not rs:
                    continue
                toks = sum(max(r.new_tokens - 1, 0) for r in rs)
                secs = sum(r.decode_s for r in rs)
                drafted, acc, rounds = (sum(r.drafted for r in rs), sum(r.accepted for r in rs),
                                        sum(r.rounds for r in rs))
                out[c][d] = {
                    "tokens_per_second": round(toks / secs, 3) if secs else 0.0,
                    "acceptance_rate": round(acc / drafted, 4) if drafted else None,
                    "mean_accepted_length": round(acc / rounds, 3) if rounds else None,
                    "tokens_per_target_call": round(sum(r.new_tokens for r in rs) / max(1, sum(r.target_calls for r in rs)), 3),
                    "ttft_ms": round(sum(r.ttft_ms for r in rs) / len(rs), 2),
                    "tpot_ms": round(1000 * secs / toks, 2) if toks else None,
                    "draft_s": round(sum(r.draft_s for r in rs), 4), "target_s": round(sum(r.target_s for r in rs), 4),
                    "other_s": round(sum(r.other_s for r in rs), 4),
                    # (None where no run was judged: sampled, or a runner that is its own reference; `none`, greedy,
                    # is the reference itself)
                    "exact": (True if d == "none" and not _sampled(self.settings)
                              else None if all(r.exact is None for r in rs) else all(r.exact is not False for r in rs)),
                    "runs": len(rs),
                }
            base = out[c].get("none", {}).get("tokens_per_second")
            for d, v in out[c].items():
                v["speedup"] = round(v["tokens_per_second"] / base, 3) if base else None
        return out

    def to_json(self) -> dict:
        from dataclasses import asdict

        return {"bundle": self.bundle, "device": self.device, "settings": self.settings, "plan": self.plan,
                "summary": self.summary(), "memory": self.memory, "runs": [asdict(r) for r in self.runs],
                "left_out": list(self.left_out), "stopped": self.stopped}

    def markdown(self) -> str:
        s = self.summary()
        drafters = list(dict.fromkeys(r.drafter for r in self.runs))
        # a runner never judged (its own reference: llama.cpp's autoregressive run) shows –, not a tick it always had
        unjudged = {d for d in drafters if d != "none" and all(r.exact is None for r in self.runs if r.drafter == d)}
        lines = [f"# edgespec bench: {self.bundle}", "",
                 f"{self.device.get('cpu', '')} · {self.device.get('providers', '')} · "
                 f"max_new_tokens {self.settings['max_new_tokens']} · {_mode(self.settings)} · "
                 f"{_threads(self.settings.get('threads'))}{_profile(self.settings)}{len(self.runs)} runs", "",
                 "| category | drafter | tok/s | speedup | acceptance | accepted/round | tokens/call | TTFT ms | TPOT ms | exact |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        for c, per in s.items():
            for d in drafters:
                v = per.get(d)
                if not v:
                    continue
                f = lambda x, p=2: "–" if x is None else f"{x:.{p}f}"  # noqa: E731
                lines.append(f"| {c} | {d} | {f(v['tokens_per_second'], 1)} | {f(v['speedup'])}× | "
                             f"{f(v['acceptance_rate'])} | {f(v['mean_accepted_length'])} | "
                             f"{f(v['tokens_per_target_call'])} | {f(v['ttft_ms'], 0)} | {f(v['tpot_ms'], 1)} | "
                             f"{'–' if _sampled(self.settings) or d in unjudged or v['exact'] is None else '✓' if v['exact'] else '✗'} |")
        lines += ["", "tok/s: new tokens after the first over decode time; speedup: against `none` (edgespec's exact "
                      "autoregressive decoding) in this run; exact: the same tokens as `none` (genai's and llama.cpp's rows: as their own autoregressive run, `genai-ar` or `llama-ar`)."]
        if self.left_out:
            lines += ["", f"Left out (longer than the context): {', '.join(self.left_out)}."]
        if self.stopped:
            lines += ["", f"**Stopped early** ({self.stopped}): these are the runs done before it."]
        m = self.memory
        if m:
            shared = m.get("in_process_runners")
            whose = (f" (the process's: {', '.join(shared)} loaded into it too, so above edgespec's own)"
                     if shared else "")
            lines += ["", f"Peak resident memory {m['peak_bytes'] / 2**20:.0f} MiB{whose}"
                          f"{file_part(m.get('file_bytes'))}; plan {m['planned_bytes'] / 2**20:.0f} MiB; "
                          f"budget {m['budget_bytes'] / 2**20:.0f} MiB."]
        return "\n".join(lines) + "\n"


def file_part(file_bytes: int | None) -> str:
    """What of the resident memory is mapped from files (clean pages the kernel can take back), for a report."""
    if file_bytes is None:
        return ""
    return f" (at the end {file_bytes / 2**20:.0f} MiB of it mapped from files: clean pages, reclaimable)"


def _threads(n) -> str:
    """The thread count a report's runs used, for its header (none where an older report did not say)."""
    if n is None:
        return ""
    return f"{n} threads · " if n else "threads: onnxruntime's default (one per core) · "


def _profile(settings: dict) -> str:
    return f"profile {settings['profile']} · " if settings.get("profile") else ""


def _sampled(settings: dict) -> bool:
    """Whether a run's sampling options sample (``SamplingParams.greedy`` says: temperature 0, or top_p 0, the most
    likely token alone, are greedy decoding, judged exact against plain decoding)."""
    from .sampling import SamplingParams

    top_p = settings.get("top_p")
    return not SamplingParams(settings.get("temperature") or 0.0, top_p=1.0 if top_p is None else top_p).greedy


def _mode(settings: dict) -> str:
    t = settings.get("temperature") or 0.0
    rp = settings.get("repetition_penalty") or 1.0
    penalty = [f"repetition penalty {rp}"] if rp != 1.0 else []
    if not _sampled(settings):
        return "greedy" + (f" ({penalty[0]})" if penalty else "")
    parts = [f"temperature {t}", f"top-p {settings.get('top_p', 1.0)}"]
    parts += [f"{name} {settings[k]}" for k, name in (("top_k", "top-k"), ("min_p", "min-p")) if settings.get(k)]
    return f"sampled ({', '.join(parts + penalty)}: exactness not checked)"


def _device(engine) -> dict:
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "providers": engine.providers.primary}


External = Callable[[list[int], int], dict]
"""Another generator run beside edgespec's in the same bench (e.g. onnxruntime-genai, see
scripts/bench_spec.py): called with (prompt ids, max_new_tokens), it returns a dict with
``token_ids``, ``decode_s``, ``ttft_ms`` and optionally ``drafted``, ``accepted``, ``rounds``,
``target_calls`` and ``reference`` (the runner, run before it, whose tokens it must equal to be
exact; default edgespec's ``none``)."""


def parse_drafters(drafters: Sequence[str], draft_tokens: int | None = None) -> dict[str, int | None]:
    """Each --drafters entry and its draft length: "model" (k from ``draft_tokens``, or adaptive),
    "model:4" (k fixed at 4) or "auto@8" (adaptive, at most 8 a round: an A/B of the draft bound in
    one run). Raises ConfigError naming the first entry that is none of these."""
    twice = sorted({d for d in drafters if d != "none" and list(drafters).count(d) > 1})
    if twice:  # (it ran twice a prompt, the second run starting from what the first learned, one row for both)
        raise ConfigError(f"--drafters names {', '.join(map(repr, twice))} twice")
    return {d: _parse_drafter(d, draft_tokens)[1] for d in drafters}


def _parse_drafter(d: str, draft_tokens: int | None = None) -> tuple[str, int | None, int | None]:
    """(drafter name, fixed k or None, draft bound or None: the engine's)."""
    name, sep, k = d.partition(":")
    bound = None
    if not sep:
        name, at, b = d.partition("@")
        if at:
            if not b.isdecimal() or not b.isascii() or not 1 <= int(b) <= MAX_DRAFT or name == "none":
                name = ""  # refused below
            else:
                bound = int(b)
    if name not in drafter_choices() or (sep and (not (k.isdecimal() and k.isascii()) or name == "none"
                                                  or not 1 <= int(k) <= MAX_DRAFT)):
        raise ConfigError(f"unknown drafter {d!r} in --drafters ({', '.join(drafter_choices())}; "
                          f"a fixed draft length as model:4, a bound as auto@8, 1..{MAX_DRAFT})")
    if name == "prediction":
        raise ConfigError("--drafters prediction: the prediction drafter drafts from a request's prediction, which "
                          "the bench's prompts have none of (scripts/bench_prediction.py measures it)")
    return name, int(k) if k else (None if bound or name == "none" else draft_tokens), bound


class RunnerStates:
    """What an engine learns across generations (its round policy; the model drafter's confidence calibration), kept
    apart per runner: ``enter(name)`` puts the runner's own in place (at first, a copy of the engine's after the
    warm-up), ``leave(name)`` keeps what its run taught. Drafters and the target are shared, not copied."""

    def __init__(self, engine, names):
        import copy

        dec = engine.decoder
        self.dec = dec
        self.model = dec.drafters.get("model")
        memo = {id(d): d for d in dec.drafters.values()}
        memo[id(dec.target)] = dec.target
        self.saved = {n: (copy.deepcopy(dec.policy, dict(memo)),
                          copy.deepcopy(getattr(self.model, "_calib", None))) for n in names}
        self.found = (dec.policy, getattr(self.model, "_calib", None))

    def restore(self) -> None:
        """The engine's own state back, as the bench found it."""
        self.dec.policy = self.found[0]
        if self.model is not None and self.found[1] is not None:
            self.model._calib = self.found[1]

    def enter(self, name: str) -> None:
        policy, calib = self.saved[name]
        self.dec.policy = policy
        if self.model is not None and calib is not None:
            self.model._calib = calib

    def leave(self, name: str) -> None:
        self.saved[name] = (self.dec.policy, getattr(self.model, "_calib", None))


def run_bench(engine, prompts: list[dict], drafters: Sequence[str], *, max_new_tokens: int = 128,
              temperature: float = 0.0, top_p: float = 1.0, min_p: float = 0.0,
              top_k: int = 0, repetition_penalty: float = 1.0, draft_tokens: int | None = None,
              external: dict[str, External] | None = None,
              in_process: Sequence[str] = (), log=lambda s: print(s, file=sys.stderr, flush=True),
              seed: int | None = None, between: Callable[[], None] | None = None) -> Report:
    """Every runner on every prompt (turn by turn), one engine, each runner from its own state. ``in_process``: the
    external runners that load their models into this process (the report's peak memory is then not edgespec's
    alone). Ctrl-C or an error mid-run (a prompt's, an external runner's) propagates with the runs done so far as the
    exception's ``report`` (``Report.stopped`` says why). Every sampling option is passed, whatever the model
    recommends (``Engine.sampling_defaults``): a run's "greedy" is plain greedy decoding, as the anchors' are.
    ``seed``: every sampled generation seeded so (reproducible: the round policy prices rounds at its priors).
    ``between()``: called after each of edgespec's runs, warm-ups too (the CLI's check for a signal whose exception a
    finalizer dropped); what it raises stops the bench as Ctrl-C does."""
    sampling = {"temperature": temperature, "top_p": top_p, "min_p": min_p, "top_k": top_k,
                "repetition_penalty": repetition_penalty}
    if seed is not None:
        sampling["seed"] = seed
    parse_drafters(drafters)
    parsed = {d: _parse_drafter(d, draft_tokens) for d in drafters}
    external = dict(external or {})
    order = ["none"] + [d for d in drafters if d != "none"]
    from . import onnx_lm

    # the process-wide pool's size where edgespec made it (the first engine's count holds for the process), else
    # what the target asked for
    pool = onnx_lm._shared_pool
    threads = pool if pool is not None and pool >= 0 else getattr(engine.decoder.target, "threads", None)
    rep = Report(str(engine.manifest.root), _device(engine),
                 {"max_new_tokens": max_new_tokens, **sampling,
                  "drafters": order + list(external), "draft_tokens": draft_tokens,
                  "prompts": len(prompts), "threads": threads, "profile": getattr(engine.profile, "name", None),
                  "max_draft_tokens": engine.defaults.max_draft_tokens}, plan=engine.plan.to_dict())
    tok = engine.tokenizer
    has_template = bool(engine.manifest.chat_template)
    # a prompt the context cannot hold is left out, named, before anything runs (it stopped the bench at that
    # prompt, every run done before it lost); a later turn that outgrows it (with the replies before it) ends its
    # prompt there, the turns before it kept
    room = engine.decoder.target.max_context
    fits = []
    for q in prompts:
        first = [{"role": "user", "content": q["turns"][0]}]
        n = len(tok.encode_chat(first) if has_template else tok.encode(q["turns"][0]))
        if n >= room:
            log(f"  left out {q['question_id']}: its prompt has {n} tokens; the context holds {room}")
            rep.left_out.append(q["question_id"])
        else:
            fits.append(q)
    if not fits:  # (a report of no runs, exit 0, said nothing was measured)
        raise ContextOverflowError(f"no prompt fits the context of {room} tokens: nothing to measure (left out: "
                                   f"{', '.join(rep.left_out)})"[:300])
    prompts = fits
    # each runner learns from its own runs only (session 45, a review): one engine runs every runner on a prompt in
    # turn, and its round policy (acceptance per drafter and key, recent reply lengths, costs) and the model
    # drafter's confidence calibration carried what the earlier runners learned on that very prompt into the later
    # ones: `auto`, run last, started each prompt knowing its reply's length and acceptance. Each starts from the
    # engine's state as the bench found it (before the warm-ups below)
    states = RunnerStates(engine, order)
    # the suffix drafter's memory (`--memory`) likewise: a runner's reply, recorded at its end, was recalled by the
    # next runner on that prompt as a perfect repeat (`auto` after `suffix`: 4.09x where alone 1.07x; a review). One
    # reference reply a turn (`none`'s) is remembered once every runner has run it, as scripts/bench_traffic.py does
    sfx = engine.decoder.drafters.get("suffix")
    recording = sfx.recording if sfx is not None else None
    if sfx is not None:
        sfx.recording = False
    mem = MemorySampler()
    try:
        # warm-up: the first calls of a session allocate and pick kernels, each width's and each model's (the
        # drafter's): a warm-up of plain decoding alone left them to the first runner that drafts, timed there (the
        # first runner listed in --drafters lost up to 3-6x on its first prompt; session 56, a review). Every
        # runner once, sampling as the bench does, on the engine's own state, which the runners' copies above do
        # not see
        for d in order:
            name, k, bound = parsed.get(d, ("none", None, None))
            engine.reset()
            list(engine.stream_ids(tok.encode("Hello, world. Hello, world."), max_new_tokens=8, drafter=name,
                                   draft_tokens=k, max_draft_tokens=bound, **sampling))
            if between is not None:
                between()
        with mem:
            _bench_prompts(engine, prompts, order, parsed, external, rep, states, sfx, log,
                           max_new_tokens=max_new_tokens, sampling=sampling, between=between)
    except BaseException as e:  # Ctrl-C, an error of a prompt's, an external runner's crash
        rep.stopped = ("interrupted" if isinstance(e, KeyboardInterrupt) else
                       "terminated" if type(e).__name__ == "Terminated" else  # (the CLI's SIGTERM or SIGHUP)
                       f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
        e.report = rep  # (the caller writes what was measured: a run of hours is not lost at its last prompt)
        raise
    finally:
        states.restore()
        if sfx is not None:
            sfx.recording = recording
        rep.memory = {"peak_bytes": high_water_rss(), "file_bytes": file_rss(), "planned_bytes": engine.plan.total,
                      "budget_bytes": engine.plan.budget, "samples": [(round(t, 3), b) for t, b in mem.samples[::4]]}
        if in_process:
            rep.memory["in_process_runners"] = list(in_process)
    return rep


def _bench_prompts(engine, prompts, order, parsed, external, rep, states, sfx, log, *, max_new_tokens,
                   sampling, between=None) -> None:
    """run_bench's runs, appended to ``rep.runs`` as they finish."""
    tok = engine.tokenizer
    has_template = bool(engine.manifest.chat_template)
    room = engine.decoder.target.max_context
    for qi, q in enumerate(prompts):
        history: list[dict] = []
        for ti, turn in enumerate(q["turns"]):
            history.append({"role": "user", "content": turn})
            ids = tok.encode_chat(history) if has_template else tok.encode(turn)
            if len(ids) >= room:
                log(f"  {q['question_id']} turn {ti + 1} left out: its prompt has {len(ids)} tokens; the context "
                    f"holds {room}")
                rep.left_out.append(f"{q['question_id']} turn {ti + 1}")
                break
            ref = None
            reply_ids: list[int] = []
            for d in order:
                engine.reset()
                states.enter(d)
                out: list[int] = []
                st = None
                name, k, bound = parsed.get(d, ("none", None, None))
                for _, toks, st, _ in engine.stream_ids(ids, max_new_tokens=max_new_tokens, **sampling, drafter=name,
                                                     draft_tokens=k, max_draft_tokens=bound):
                    out.extend(toks)
                states.leave(d)
                if d == "none":
                    ref, reply_ids = out, out
                exact = None if d == "none" or _sampled(sampling) else out == ref
                rep.runs.append(Run(q["question_id"], q["category"], ti, d, st.new_tokens, st.ttft_ms, st.decode_s,
                                    st.tokens_per_second,
                                    1000 * st.decode_s / max(1, st.new_tokens - 1), st.drafted, st.accepted,
                                    st.rounds, st.target_calls, st.draft_s, st.target_s, st.other_s,
                                    list(st.accepted_by_position), list(st.drafted_by_position), exact,
                                    model_drafting({k: getattr(st, k) for k in MODEL_DRAFTING})))
                log(f"  [{qi + 1}/{len(prompts)}] {q['question_id']} turn {ti + 1} {d:13s} "
                    f"{st.tokens_per_second:6.1f} tok/s  acc {st.acceptance_rate:.2f}"
                    + ("" if exact in (None, True) else "  MISMATCH vs autoregressive"))
                if between is not None:
                    between()
            outputs = {"none": ref}
            for name, fn in external.items():
                x = fn(list(ids), max_new_tokens)
                out, secs = list(x["token_ids"]), float(x["decode_s"])
                outputs[name] = out
                n = len(out)
                # (a runner that is its own reference, llama.cpp's autoregressive run, is judged against nothing:
                # its tick was always there; its Q4_K_M tokens are not edgespec's INT4 ones)
                exact = None if x.get("reference") == name else out == outputs.get(x.get("reference", "none"), ref)
                tps = (n - 1) / secs if secs > 0 and n > 1 else 0.0
                rep.runs.append(Run(q["question_id"], q["category"], ti, name, n, float(x.get("ttft_ms", 0.0)),
                                    secs, tps, 1000 * secs / max(1, n - 1), int(x.get("drafted", 0)),
                                    int(x.get("accepted", 0)), int(x.get("rounds", 0)),
                                    int(x.get("target_calls", n)), 0.0, secs, 0.0, [], [], exact))
                acc = x.get("accepted", 0) / x["drafted"] if x.get("drafted") else 0.0
                log(f"  [{qi + 1}/{len(prompts)}] {q['question_id']} turn {ti + 1} {name:13s} "
                    f"{tps:6.1f} tok/s  acc {acc:.2f}" + ("" if exact in (None, True) else "  differs from its reference"))
            if sfx is not None and ref is not None:
                sfx.remember(ref, prompt=ids)
            history.append({"role": "assistant", "content": tok.decode(reply_ids)})


REPORT_FILES = ("report.json", "report.md", "tokens_per_second.png", "acceptance_by_position.png", "time_split.png",
                "memory.png")


def check_report_files(out_dir: str | os.PathLike) -> None:
    """Refuse, before a bench runs, a report file name in ``out_dir`` that a file cannot be written to (a folder
    there: the whole run went, then its report was lost to an error naming a temporary file; session 55)."""
    from .errors import ConfigError

    for name in REPORT_FILES:
        path = Path(out_dir) / name
        if os.path.lexists(path) and not path.is_file():
            raise ConfigError(f"cannot write the report to {path}: it is "
                              + ("a folder" if path.is_dir() else "no regular file"))
    # a report.json or report.md a bench did not write (a folder of one's own notes) is not replaced (session 64, a
    # review: both were, as an interrupted run's partial report)
    js, md = Path(out_dir) / "report.json", Path(out_dir) / "report.md"
    foreign = js if js.is_file() and not _bench_report(js) else md if md.is_file() and not _bench_markdown(md) \
        else None
    if foreign is not None:
        raise ConfigError(f"{foreign} is not a report of edgespec bench; it is not replaced: give another --out "
                          "folder")
    # nor a plot's name in a folder with no report of a bench's (session 92, a review: a user's memory.png there was
    # overwritten by the plot, or deleted as a stale plot with --no-plots)
    plots = _foreign_plots(Path(out_dir))
    if plots:
        raise ConfigError(f"{Path(out_dir) / plots[0]} is no plot of edgespec bench (no report of one beside it); it "
                          "is not replaced: give another --out folder")


def _foreign_plots(out: Path) -> list[str]:
    """The plot names of ``REPORT_FILES`` in ``out`` that no bench wrote: all there are where ``out`` holds no report
    of a bench's (``report.json`` or an interrupted run's ``report.partial.json``), else none."""
    if _bench_report(out / "report.json") is not None or _bench_report(out / "report.partial.json") is not None:
        return []
    return [n for n in REPORT_FILES if n.endswith(".png") and os.path.lexists(out / n)]


def _bench_markdown(path: Path) -> bool:
    """Whether ``path`` begins as a bench's markdown report does (``Report.markdown``: "# edgespec bench")."""
    try:
        with open(path, "rb") as f:
            return f.read(17) == b"# edgespec bench:"
    except OSError:
        return False


def _bench_report(path: Path) -> dict | None:
    """The report a bench wrote to ``path`` (its JSON: an object with a list of runs), else None."""
    try:
        if not path.is_file() or path.stat().st_size > 256 << 20:
            return None
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return d if isinstance(d, dict) and isinstance(d.get("runs"), list) else None


def _complete_report(path: Path, more_than: int | None = None) -> bool:
    """Whether ``path`` holds a bench's report that ran to its end (no ``stopped``), or with ``more_than``, one
    that stopped after more runs than that."""
    d = _bench_report(path)
    if d is None:
        return False
    return not d.get("stopped") or (more_than is not None and len(d["runs"]) > more_than)


def write_partial_report(rep: Report | None, out_dir: str | os.PathLike) -> None:
    """The runs of a bench that stopped early (``rep.stopped``), written to ``out_dir`` where there are any (no plots);
    said on stderr. A failure to write is said, not raised: the error that stopped the bench is the one to tell."""
    if rep is None or not rep.runs:
        return
    # beside a whole report in the same folder, not over it (an interrupted rerun replaced a full run's report with
    # its few runs; session 55, a review), nor over a stopped one of more runs (session 56): report.partial.*
    partial = _complete_report(Path(out_dir) / "report.json", more_than=len(rep.runs))
    try:
        files = write_report(rep, out_dir, plots=False, stem="report.partial" if partial else "report")
        said = f"wrote the {len(rep.runs)} runs done (stopped early: {rep.stopped}) to " + ", ".join(map(str, files))
    except (OSError, ValueError) as e:
        said = f"warning: the {len(rep.runs)} runs done were not written: {e}"
    try:  # (after SIGHUP the terminal is gone: its EIO must not replace the error that stopped the bench)
        print(said, file=sys.stderr)
    except (OSError, ValueError):
        pass


def write_report(rep: Report, out_dir: str | os.PathLike, plots: bool = True, stem: str = "report") -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    theirs = set(_foreign_plots(out)) if stem == "report" else set()  # (before this report is beside them)
    files = [out / f"{stem}.json", out / f"{stem}.md"]
    write_whole(files[0], json.dumps(rep.to_json(), indent=1))
    write_whole(files[1], rep.markdown())
    if plots:
        files += _plots(rep, out, skip=theirs)
    if theirs:  # (the command line refused such a folder before the bench: check_report_files)
        print(f"note: {', '.join(sorted(theirs))} in {out} are no plots of edgespec bench: left as they are"
              + (", not plotted" if plots else ""), file=sys.stderr)
    if stem == "report":  # (an earlier run's plots beside this report were another run's: another bundle, other
        made = {f.name for f in files}  # drafters; session 56, a review)
        for name in REPORT_FILES:
            if name.endswith(".png") and name not in made and name not in theirs:
                (out / name).unlink(missing_ok=True)
        if not rep.stopped and _bench_report(out / "report.partial.json") is not None:  # (an earlier interrupted
            # run's, beside a whole report now: stale; session 64, a review; a stopped run's keeps another's)
            for name in ("report.partial.json", "report.partial.md"):
                (out / name).unlink(missing_ok=True)
    return files


def _plots(rep: Report, out: Path, skip: set[str] = frozenset()) -> list[Path]:
    """The report's plots written to ``out``, but for the names in ``skip`` (files there that are not a bench's)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; no plots (pip install matplotlib)", file=sys.stderr)
        return []
    s = rep.summary()
    cats = [c for c in s if c != "all"]
    drafters = list(dict.fromkeys(r.drafter for r in rep.runs))
    files = []

    def save(fig, path: Path) -> None:
        if path.name in skip:
            plt.close(fig)
        else:
            files.append(_save_figure(fig, path))

    fig, ax = plt.subplots(figsize=(9, 4))
    w = 0.8 / max(1, len(drafters))
    for i, d in enumerate(drafters):
        ax.bar([x + i * w for x in range(len(cats))], [s[c].get(d, {}).get("tokens_per_second", 0) for c in cats],
               w, label=d)
    ax.set_xticks([x + w * (len(drafters) - 1) / 2 for x in range(len(cats))], cats, rotation=20)
    ax.set_ylabel("tokens/s")
    ax.set_title("Decode speed by category and drafter")
    ax.legend()
    save(fig, out / "tokens_per_second.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for d in drafters:
        acc = [0] * 64
        dr = [0] * 64
        for r in rep.runs:
            if r.drafter == d:
                for i, (a, n) in enumerate(zip(r.accepted_by_position, r.drafted_by_position)):
                    acc[i] += a
                    dr[i] += n
        pts = [(i + 1, acc[i] / dr[i]) for i in range(64) if dr[i]]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=d)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance")
    ax.set_ylim(0, 1.05)
    ax.set_title("Acceptance by draft position")
    if ax.get_legend_handles_labels()[0]:  # (no runner drafted: matplotlib's warning about an empty legend, said
        ax.legend()                        # to the user, who cannot act on it)
    save(fig, out / "acceptance_by_position.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    parts = ("draft_s", "target_s", "other_s")
    bottoms = [0.0] * len(drafters)
    for p in parts:
        vals = [s["all"].get(d, {}).get(p, 0) for d in drafters]
        ax.bar(drafters, vals, bottom=bottoms, label=p.replace("_s", ""))
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set_ylabel("seconds (all prompts)")
    ax.set_title("Time split: drafter / target / other")
    ax.legend()
    save(fig, out / "time_split.png")

    m = rep.memory
    if m.get("samples"):
        fig, ax = plt.subplots(figsize=(7, 3.5))
        t, b = zip(*m["samples"])
        ax.plot(t, [x / 2**20 for x in b], label="resident memory")
        ax.axhline(m["planned_bytes"] / 2**20, color="tab:orange", ls="--", label="plan")
        ax.axhline(m["budget_bytes"] / 2**20, color="tab:red", ls=":", label="budget")
        ax.set_xlabel("seconds")
        ax.set_ylabel("MiB")
        ax.set_title("Memory over time")
        ax.legend()
        save(fig, out / "memory.png")
    return files


def _save_figure(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
