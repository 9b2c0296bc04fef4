"""The ``mtp`` drafter: a multi-token-prediction assistant (Gemma 4's, ``models.assistant`` of a bundle exported with
the assistant as ``--drafter``; export/mtp.py) drafting from the target's own state.

The assistant has no KV cache and reads no prompt. A draft step feeds it the last token (the graph embeds it with a
copy of the target's table) and a hidden state, at that token's position, and its layers attend the target's KV
buffers of the layers the manifest names (bound once: the very buffers the target writes). The first step's hidden
state is the target's, from the row of the last target call that produced the last token (the decoder hands it over
after every call, ``observe_hidden``); each later step's is the assistant's own ``next_hidden``, at the same
position. So a draft costs its steps only, from the first round of a generation on, and the drafter needs nothing
from earlier rounds but the target's last row.

The target verifies every token: what the assistant drafts never changes the output (greedy: the same tokens as
plain decoding; sampled: q is the assistant's distribution under the request's sampling settings, from which the
draft is drawn, so the rejection rule is exact).
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from .drafters import (CALIB_PRIOR, DRAFT_MIN_CONFIDENCE, Draft, LoadEnv, Offer, _top_prob, calibrated,
                       learn_calibration, register)
from .errors import BundleError
from .kv import TokenBuffer
from .sampling import SamplingParams, distribution

# the graph's fixed names (export/mtp.py)
INPUTS = ("token", "hidden", "row", "position", "length")
OUTPUTS = ("logits", "next_hidden")


class _Counts:
    """The counters the decoder reads of a costly drafter's model (``lm``): calls, tokens run, seconds."""

    def __init__(self):
        self.calls = self.tokens_run = 0
        self.call_seconds = 0.0


@register
class MtpDrafter:
    name = "mtp"
    has_cost = True
    reads_hidden = True  # the decoder hands it the target's hidden state after each call (observe_hidden)

    def __init__(self, session, target, spec, clock=time.perf_counter):
        import onnxruntime as ort

        self.session, self.target, self.spec, self.clock = session, target, spec, clock
        self.lm = _Counts()
        names = {i.name for i in session.get_inputs()}
        kinds = list(spec.sources)
        want = set(INPUTS) | {f"{w}_{k}" for k in kinds for w in ("key", "value")}
        outs = {o.name for o in session.get_outputs()}
        if names != want or outs != set(OUTPUTS):  # (each list named: an output's name was missing from the message)
            raise BundleError(f"the assistant graph's inputs and outputs are not an assistant's (inputs "
                              f"{sorted(names)}, outputs {sorted(outs)}); the bundle is inconsistent")
        self._b = session.io_binding()
        dims = {i.name: i.shape for i in session.get_inputs()}
        for kind in kinds:  # the target's own buffers, which it writes in place: bound once
            layer = spec.sources[kind]
            if layer >= len(target.cache.buffers) // 2:
                raise BundleError(f"the assistant attends target layer {layer}, the target has "
                                  f"{len(target.cache.buffers) // 2}")
            want, got = tuple(target.spec.kv_shape(layer)), list(dims[f"key_{kind}"])
            if len(got) != 4 or (got[1], got[3]) != want:  # (a hand-edited manifest: every draft failed mid-reply)
                shape = f"{got[1]} x {got[3]}" if len(got) == 4 else f"shape {got}"
                raise BundleError(f"the assistant's {kind} layers read caches of {shape}, the target's layer {layer} "
                                  f"has {want[0]} x {want[1]}; the bundle is inconsistent")
            self._b.bind_ortvalue_input(f"key_{kind}", target.cache.buffers[2 * layer][2])
            self._b.bind_ortvalue_input(f"value_{kind}", target.cache.buffers[2 * layer + 1][2])
        self._logits = np.zeros((1, spec.vocab_size), dtype=np.float32)
        self._next = np.zeros((1, spec.target_hidden_size), dtype=np.float32)
        self._b.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(self._logits))
        self._b.bind_ortvalue_output("next_hidden", ort.OrtValue.ortvalue_from_numpy(self._next))
        self._token = np.zeros(1, dtype=np.int64)
        self._position = np.zeros(1, dtype=np.int64)
        self._length = np.zeros(1, dtype=np.int64)
        self._hidden = np.zeros((1, 1, spec.target_hidden_size), dtype=np.float32)
        self._row = np.zeros(1, dtype=np.int64)  # (one row fed on the CPU: the graph reads row 0)
        self._b.bind_cpu_input("row", self._row)
        self._seen: int | None = None  # the target's call count when its hidden state was handed over (None: none)
        # the confidence stop's calibration, as the model drafter's (drafters.ModelDrafter.calibration): lam = the
        # draft tokens the target kept over their summed top probabilities, learned apart for greedy and sampled
        # generations; off (lam 1, nothing learned) in a seeded sampled generation (the round policy sets history)
        self.history = True
        self._calib = {True: [CALIB_PRIOR, CALIB_PRIOR], False: [CALIB_PRIOR, CALIB_PRIOR]}
        self._judge: tuple[bool, list[float]] | None = None

    @classmethod
    def build(cls, env: LoadEnv) -> "MtpDrafter | None":
        spec = env.manifest.assistant
        target = env.target
        if spec is None or target is None or "assistant" not in env.plan.weights:
            return None  # (none, or the plan left it out: use_drafter=False, the profile's drafter policy, a GPU)
        if not target.cache.host:  # (the hidden state is read on the host; the CUDA path is not built yet)
            import warnings

            warnings.warn("the bundle's assistant (mtp) drafts on the CPU only for now: not loaded (the target runs "
                          f"on {target.device})", stacklevel=3)
            return None
        if not target.keeps_hidden():
            raise BundleError("the bundle has an assistant but its target graph gives no hidden states; export it "
                              "again")
        from .onnx_lm import open_session
        from .providers import choose

        session = open_session(spec.path, choose(["cpu"]), role="assistant")
        return cls(session, target, spec)

    def observe_hidden(self, row: int) -> None:
        """The target's last call's row ``row`` produced the last token (negative: from the end of the rows it
        returned): its hidden state is the first draft step's."""
        self._hidden[0, 0] = self.target.hidden_of(row)
        self._seen = self.target.calls

    def calibration(self, greedy: bool) -> float:
        """lam: how far the assistant's top probabilities over- (< 1) or under-state (> 1) what the target keeps."""
        return calibrated(self._calib[greedy], self.history)

    def begin(self, prompt: Sequence[int]) -> None:
        self._judge = None

    def reset(self) -> None:
        self._seen = None
        self._judge = None

    def _ready(self, ctx: TokenBuffer) -> bool:
        # the hidden state is the target's newest (no call since) and the target holds the context before the last token
        return self._seen is not None and self._seen == self.target.calls and self.target.length == len(ctx) - 1

    def offer(self, ctx: TokenBuffer, kmax: int) -> Offer | None:
        if kmax <= 0 or not self._ready(ctx):
            return None
        return Offer(self.name, kmax, prior=(1.5, 0.5), dynamic=True)

    def accept(self, n: int, bonus: int) -> None:
        """The target kept ``n`` draft tokens: the calibration learns from the positions it judged (the kept ones and
        the first rejected); the decoder hands over the row that produced ``bonus`` itself (``observe_hidden``)."""
        if self._judge is not None:
            greedy, confs = self._judge
            learn_calibration(self._calib[greedy], confs, n)
            self._judge = None

    def step(self, token: int, hidden: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray]:
        """One assistant step: (logits [vocab], next hidden [target hidden]), views of its own buffers."""
        b = self._b
        self._token[0], self._position[0], self._length[0] = token, position, position
        b.bind_cpu_input("token", self._token)
        b.bind_cpu_input("position", self._position)
        b.bind_cpu_input("length", self._length)
        b.bind_cpu_input("hidden", hidden)
        t0 = time.perf_counter()
        try:
            self.session.run_with_iobinding(b)
        except Exception as e:  # onnxruntime's own untyped errors, kept in the message
            raise BundleError(f"the assistant failed to run: {str(e).splitlines()[0][:300]}") from e
        self.lm.calls += 1
        self.lm.tokens_run += 1
        self.lm.call_seconds += time.perf_counter() - t0
        return self._logits[0], self._next

    def draft(self, ctx: TokenBuffer, k: int, sp: SamplingParams, rng: np.random.Generator,
              stop: float | None = None, **_) -> Draft:
        """Up to ``k`` tokens, each from the assistant's logits (argmax, or drawn from q). ``stop`` (the round
        policy's threshold): end the draft once the product of its calibrated top probabilities falls below it; None
        (a request's fixed draft length): after a token whose top probability is under ``DRAFT_MIN_CONFIDENCE``, as
        the model drafter. The stop reads the assistant's state alone: exactness never depends on it."""
        self._judge = None
        if k <= 0 or not self._ready(ctx):
            return Draft([], key=self.name)
        t0 = self.clock()
        position = len(ctx) - 1
        token, hidden = int(ctx[-1]), self._hidden
        tokens: list[int] = []
        probs = None if sp.greedy else []
        lam = self.calibration(sp.greedy) if stop is not None else 1.0
        sure, confs = 1.0, []
        for i in range(k):
            logits, nxt = self.step(token, hidden, position)
            if sp.greedy:
                token = int(np.argmax(logits))
            else:
                q = distribution(logits.copy(), sp)  # (the buffer is the next step's)
                token = int(q.sample(rng))
                probs.append(q)
            tokens.append(token)
            confs.append(_top_prob(logits))
            if i < k - 1:
                if stop is not None:
                    sure *= min(1.0, lam * confs[-1])
                    if sure < stop:
                        break
                elif confs[-1] < DRAFT_MIN_CONFIDENCE:
                    break
            hidden = nxt.reshape(1, 1, -1).copy()
        self._judge = (sp.greedy, confs) if stop is not None and self.history else None
        step_s = (self.clock() - t0) / len(tokens)
        return Draft(tokens, probs, key=self.name, step_s=step_s)
