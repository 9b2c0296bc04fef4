"""Perplexity of a bundle's target on a text: how well the quantized model predicts it, the measure
llama.cpp's ``llama-perplexity`` reports, for comparing exports (INT4 block sizes, kernels, a GGUF's own
quantization against edgespec's) without torch.

The text's tokens are cut into windows of ``window`` tokens; each window is read from its first
position (``Decoder.score``: every position's logits) and the tokens of its second half are scored, the
first half being their context: positions ``window // 2 + 1`` to ``window - 1``, llama-perplexity's rule
(its ``first = n_ctx / 2``), so that no token is scored with almost nothing before it and the two tools
score the same tokens of the same text; where the model adds a BOS token, it stands first in every window
(llama-perplexity puts it there too). Perplexity = exp(mean negative log-likelihood of the scored tokens).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

from .errors import ConfigError

MIN_WINDOW = 16


@dataclass
class Perplexity:
    perplexity: float
    nll: float  # mean negative log-likelihood (nats) of the scored tokens
    tokens: int  # tokens scored
    windows: int
    window: int
    text_tokens: int  # tokens of the text (the last partial window is left out)
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        """Tokens read (scored or context) per second."""
        return self.windows * self.window / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tokens_per_second"] = round(self.tokens_per_second, 2)
        return d



def _exp(x: float) -> float:
    """e**x, inf past a float's range (a broken export's mean loss of thousands of nats: math.exp's OverflowError
    was the command's traceback; session 49, a review)."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf

def perplexity(engine, ids: Sequence[int], window: int = 512, max_windows: int | None = None,
               progress: Callable[[int, int, float], None] | None = None) -> Perplexity:
    """The perplexity of ``engine``'s target on the token ids ``ids`` (see the module's doc).
    ``progress(done, total, running perplexity)`` after each window."""
    if isinstance(window, bool) or not isinstance(window, int) or window < MIN_WINDOW:
        raise ConfigError(f"the window must be an integer >= {MIN_WINDOW} tokens, got {window!r}")
    if window > engine.max_context:
        most = engine.manifest.max_context  # (the bundle's: a larger --max-context helps only up to it)
        raise ConfigError(f"the window ({window} tokens) is larger than the context ({engine.max_context}); pass a "
                          "smaller window" + (f" or a larger --max-context (up to the bundle's {most})"
                                              if engine.max_context < most and window <= most
                                              else f" (the bundle's context is {most})"))
    if max_windows is not None and (isinstance(max_windows, bool) or not isinstance(max_windows, int)
                                    or max_windows < 1):
        raise ConfigError(f"the number of windows must be an integer >= 1, got {max_windows!r}")
    n = len(ids) // window
    if n == 0:
        raise ConfigError(f"the text has {len(ids)} tokens; a window needs {window} " + (
            f"(pass a window of {len(ids)} tokens or less)" if len(ids) >= MIN_WINDOW
            else f"(the smallest window is {MIN_WINDOW}: a longer text is needed)"))
    if max_windows is not None:
        n = min(n, max_windows)
    first = window // 2
    tok = engine.tokenizer
    bos = tok.bos_token_id if tok.add_bos and tok.bos_token_id is not None else None
    nll, count, t0 = 0.0, 0, time.perf_counter()
    for w in range(n):
        win = [int(t) for t in ids[w * window:(w + 1) * window]]
        if bos is not None:
            win[0] = bos
        lps = engine.decoder.score(win)  # lps[j]: token j + 1's
        for lp in lps[first:]:  # positions first + 1 .. window - 1
            nll -= lp.logprob
            count += 1
        if progress is not None:
            progress(w + 1, n, _exp(nll / count))
    return Perplexity(perplexity=_exp(nll / count), nll=nll / count, tokens=count, windows=n, window=window,
                      text_tokens=len(ids), seconds=time.perf_counter() - t0)
