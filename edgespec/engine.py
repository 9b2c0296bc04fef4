"""The draft -> verify -> accept loop. Knows nothing about text: token ids in, token ids out."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Iterator, Sequence

import numpy as np

from .drafters import Acceptance, CostModel, Draft, Drafter, ModelDrafter, PromptLookupDrafter
from .errors import BusyError, ConfigError, ContextOverflowError
from .onnx_lm import OnnxLM, _common_prefix
from .sampling import SamplingParams, probs, sample
from .verify import greedy_accept, rejection_sample

DRAFTER_CHOICES = ("model", "prompt-lookup", "auto", "none")


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    drafter: str = "auto"
    draft_tokens: int | None = None  # fixed k; None = adaptive
    max_draft_tokens: int = 8  # bound for the adaptive choice
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed must be in 0..2**63-1, got {self.seed}")
        if self.drafter not in DRAFTER_CHOICES:
            raise ConfigError(f"drafter must be one of {', '.join(DRAFTER_CHOICES)}, got {self.drafter!r}")
        if self.draft_tokens is not None and not 0 <= self.draft_tokens <= 64:
            raise ConfigError(f"draft_tokens must be in 0..64, got {self.draft_tokens}")
        if not 1 <= self.max_draft_tokens <= 64:
            raise ConfigError(f"max_draft_tokens must be in 1..64, got {self.max_draft_tokens}")
        SamplingParams(self.temperature, self.top_k, self.top_p)  # validates

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)


@dataclass
class Step:
    tokens: list[int]
    finish_reason: str | None = None  # 'eos' | 'length' | 'context' | None


@dataclass
class Stats:
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0
    new_tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    target_calls: int = 0
    accepted_by_position: list[int] = field(default_factory=list)
    drafted_by_position: list[int] = field(default_factory=list)
    rounds_by_drafter: dict[str, int] = field(default_factory=dict)
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0
    draft_s: float = 0.0
    target_s: float = 0.0
    total_s: float = 0.0
    finish_reason: str | None = None

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Accepted draft tokens per verify round (plus one emitted token makes the round's yield)."""
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def decode_s(self) -> float:
        return max(self.total_s - self.prefill_ms / 1000.0, 1e-9)

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: tokens after the first over the time after prefill."""
        return max(self.new_tokens - 1, 0) / self.decode_s if self.new_tokens > 1 else 0.0

    @property
    def other_s(self) -> float:
        return max(self.total_s - self.draft_s - self.target_s, 0.0)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            acceptance_rate=round(self.acceptance_rate, 4),
            tokens_per_target_call=round(self.tokens_per_target_call, 4),
            mean_accepted_length=round(self.mean_accepted_length, 4),
            tokens_per_second=round(self.tokens_per_second, 3),
            other_s=round(self.other_s, 6),
            acceptance_by_position=[round(a / d_, 4) if d_ else None for a, d_ in
                                    zip(self.accepted_by_position, self.drafted_by_position)],
        )
        for k in ("prefill_ms", "ttft_ms"):
            d[k] = round(d[k], 3)
        for k in ("draft_s", "target_s", "total_s"):
            d[k] = round(d[k], 6)
        return d


class GenerationLock:
    """One generation at a time. Callers from other threads wait their turn; a call from the thread
    that holds it (a generate() inside a loop over a stream) would wait for itself forever, so it
    is refused with ``BusyError`` instead."""

    def __init__(self):
        self._lock = threading.Lock()
        self._owner: int | None = None

    @contextmanager
    def hold(self, what: str = "generate"):
        me = threading.get_ident()
        if self._owner == me:
            raise BusyError(f"cannot {what} while a generation is running in this thread: finish or close "
                            f"its stream first")
        with self._lock:
            self._owner = me
            try:
                yield
            finally:
                self._owner = None


class Decoder:
    """Speculative generation over a target ``OnnxLM`` and optional drafters.

    ``generate`` is a generator of ``Step``s; one generation runs at a time (a lock serializes
    callers from several threads). The target's cache is kept between generations, so a prompt
    that extends the previous one (a chat turn) only prefills the new tokens.
    """

    def __init__(self, target: OnnxLM, eos_token_ids: Sequence[int] = (), *,
                 model_drafter: ModelDrafter | None = None,
                 prompt_lookup: PromptLookupDrafter | None = None, clock=time.perf_counter):
        self.target = target
        self.clock = clock  # the cost model's time source (tests pass a simulated clock)
        self.eos = frozenset(int(e) for e in eos_token_ids)
        self.drafters: dict[str, Drafter] = {"prompt-lookup": prompt_lookup or PromptLookupDrafter()}
        if model_drafter is not None:
            self.drafters["model"] = model_drafter
            model_drafter.clock = clock
        self.cost = CostModel()
        # acceptance estimates: the model drafter's, and prompt lookup's per matched n-gram length
        # ("prompt-lookup/3" for a 3-token match), since a longer match is a better predictor
        self.acceptance: dict[str, Acceptance] = {"model": Acceptance(prior_accept=1.5, prior_reject=0.5)}
        for size in range(1, self.drafters["prompt-lookup"].max_ngram + 1):
            self.acceptance[f"prompt-lookup/{size}"] = Acceptance(prior_accept=0.5 + 0.5 * size, prior_reject=1.0)
        self.last_stats: Stats | None = None
        self.lock = GenerationLock()
        self._probe_every = 64

    @property
    def vocab(self) -> int:
        return self.target.spec.vocab_size

    # -- policy --------------------------------------------------------------------------------
    def _plan_round(self, cfg: GenerationConfig, context: list[int], kcap: int, idle: int,
                    sp: SamplingParams, rng: np.random.Generator) -> tuple[str, Draft, str]:
        """Choose a drafter and a draft for this round (an empty draft means k = 0). Returns the
        drafter's name, the draft, and the acceptance estimate that judges it ("model", or
        "prompt-lookup/N" for an N-token n-gram match)."""
        if kcap <= 0 or cfg.drafter == "none":
            return "none", Draft([]), "none"
        fixed = cfg.draft_tokens
        want = [cfg.drafter] if cfg.drafter != "auto" else ["prompt-lookup"] + (["model"] if "model" in self.drafters else [])
        kmax = min(kcap, fixed if fixed is not None else cfg.max_draft_tokens)
        if kmax <= 0:
            return "none", Draft([]), "none"
        best_name, best_k, best_rate = "none", 0, self.cost.rate(0.0, 0, False)
        lookup_tokens: list[int] = []
        lookup_key = "prompt-lookup/1"
        for name in want:
            d = self.drafters[name]
            if name == "prompt-lookup":
                lookup_tokens, size = d.lookup_match(context, kmax)
                if not lookup_tokens:
                    continue
                lookup_key = f"prompt-lookup/{size}"
                alpha = self.acceptance[lookup_key].alpha
                cap = len(lookup_tokens)
            else:
                alpha = self.acceptance[name].alpha
                cap = kmax
            if fixed is not None:
                k, r = cap, self.cost.rate(alpha, cap, d.has_cost)
            else:
                k, r = self.cost.best_k(alpha, cap, d.has_cost)
            if k > 0 and (r > best_rate or (fixed is not None and best_k == 0)):
                best_name, best_k, best_rate = name, k, r
        if best_name != "model" and fixed is None and idle >= self._probe_every and "model" in want:
            best_name, best_k = "model", 1  # probe: keep the model's acceptance estimate alive
        if best_k == 0 and getattr(self.target, "min_width", 1) > 1:
            # the target computes at least two positions per call anyway (exactness policy):
            # fill the second with a free prompt-lookup guess instead of padding
            if not lookup_tokens:
                lookup_tokens, size = self.drafters["prompt-lookup"].lookup_match(context, 1)
                lookup_key = f"prompt-lookup/{size}"
            if lookup_tokens:
                best_name, best_k = "prompt-lookup", 1
        if best_k == 0:
            return "none", Draft([]), "none"
        if best_name == "prompt-lookup":
            t0 = time.perf_counter()
            d = self.drafters[best_name]
            draft = Draft(lookup_tokens[:best_k])
            d.stats.rounds += 1
            d.stats.drafted += len(draft.tokens)
            d.stats.seconds += time.perf_counter() - t0
            return best_name, draft, lookup_key
        return best_name, self.drafters[best_name].propose(context, best_k, sp, rng), best_name

    # -- the loop ------------------------------------------------------------------------------
    def generate(self, prompt_ids: Sequence[int], cfg: GenerationConfig | None = None,
                 stats: Stats | None = None) -> Iterator[Step]:
        cfg = cfg or GenerationConfig()
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ConfigError("the prompt is empty")
        if cfg.drafter == "model" and "model" not in self.drafters:
            raise ConfigError("this bundle has no drafter model; use --drafter prompt-lookup, auto or none")
        if len(prompt) >= self.target.max_context:
            raise ContextOverflowError(
                f"the prompt has {len(prompt)} tokens; the context holds {self.target.max_context} "
                f"(prompt plus at least one new token)")
        with self.lock.hold():
            yield from self._generate(prompt, cfg, stats if stats is not None else Stats())

    def _generate(self, prompt: list[int], cfg: GenerationConfig, st: Stats) -> Iterator[Step]:
        self.last_stats = st
        sp = cfg.sampling
        rng = np.random.default_rng(cfg.seed)
        stop = self.eos | frozenset(cfg.stop_token_ids)
        target = self.target
        t_start = self.clock()
        st.prompt_tokens = len(prompt)
        before = target.calls
        st.reused_prompt_tokens = min(_common_prefix(target.tokens, prompt), len(prompt) - 1)
        t_run0 = target.run_seconds
        self.cost.min_width = getattr(target, "min_width", 1)
        last = target.sync(prompt)
        st.target_s += target.run_seconds - t_run0
        st.target_calls += target.calls - before
        first = int(np.argmax(last)) if sp.greedy else sample(probs(last[None, :], sp)[0], rng)
        model = self.drafters.get("model")
        if model is not None and cfg.drafter in ("model", "auto"):
            # the drafter reads the prompt now (part of the time to first token), so that drafting
            # rounds cost drafter steps, not a prompt's prefill
            t_d = self.clock()
            model.prefill(prompt)
            st.draft_s += self.clock() - t_d
        st.prefill_ms = (self.clock() - t_start) * 1000
        st.ttft_ms = st.prefill_ms
        for d in self.drafters.values():
            d.begin(prompt)
        context = prompt + [first]
        st.new_tokens = 1
        reason = "eos" if first in stop else ("length" if cfg.max_new_tokens <= 1 else None)
        if reason is None and len(context) >= target.max_context:
            reason = "context"
        st.total_s = self.clock() - t_start
        yield Step([first], reason)
        idle = 0
        while reason is None:
            remaining = cfg.max_new_tokens - st.new_tokens
            # the target holds context[:-1]; feeding context[-1] and k drafts must fit the window
            kcap = min(remaining - 1, target.max_context - len(context))
            t0 = self.clock()
            name, draft, estimate = self._plan_round(cfg, context, kcap, idle, sp, rng)
            st.draft_s += self.clock() - t0
            k = len(draft.tokens)
            if name == "model":
                step = self.drafters["model"].last_step_s
                if step is not None:
                    self.cost.observe_draft(step)
            t1 = self.clock()
            logits = target.forward([context[-1]] + draft.tokens)
            dt = self.clock() - t1
            st.target_s += dt
            st.target_calls += 1
            self.cost.observe_target(k + 1, dt)
            if sp.greedy:
                n, nxt = greedy_accept(draft.tokens, logits)
            else:
                n, nxt = rejection_sample(draft.tokens, draft.probs, logits[:, : self.vocab], sp, rng)
            target.rewind(k - n)
            idle = 0 if name == "model" else idle + 1  # rounds since the model drafter last drafted
            if k:
                self.acceptance[estimate].update(n, k)
                self.drafters[name].accept(n)
                st.rounds += 1
                st.drafted += k
                st.accepted += n
                st.rounds_by_drafter[name] = st.rounds_by_drafter.get(name, 0) + 1
                while len(st.drafted_by_position) < k:
                    st.drafted_by_position.append(0)
                    st.accepted_by_position.append(0)
                for i in range(k):
                    st.drafted_by_position[i] += 1
                    st.accepted_by_position[i] += 1 if i < n else 0
            else:
                st.rounds_by_drafter["none"] = st.rounds_by_drafter.get("none", 0) + 1
            new = draft.tokens[:n] + [nxt]
            for j, t in enumerate(new):
                if t in stop:
                    new = new[: j + 1]
                    reason = "eos"
                    break
            if len(new) >= remaining:
                new = new[:remaining]
                reason = reason or "length"
            room = target.max_context - len(context)  # the context never grows past the window
            if len(new) >= room:
                new = new[:room]
                reason = reason or "context"
            context.extend(new)
            st.new_tokens += len(new)
            st.total_s = self.clock() - t_start
            yield Step(new, reason)
        st.finish_reason = reason
        st.total_s = self.clock() - t_start

