"""Reasoning models' thinking (Qwen3, SmolLM3, DeepSeek-R1's distills, ...): the reply's ``<think> ... </think>``
block apart from its answer, as llama.cpp's server and vLLM's reasoning parsers give it (``reasoning_content``).

A model thinks where its vocabulary has ``<think>`` and ``</think>`` as tokens of their own (``think_tags``). A reply
either opens the block itself or starts inside it, where the chat template wrote ``<think>`` into the generation
prompt (``starts_inside``). ``ReasoningSplitter`` splits text as it streams, holding back only what may still turn
out to be a tag or the whitespace around one, so the streamed pieces join to exactly what ``split_reasoning`` gives
for the whole text. What comes after the block is the answer (tool calls are parsed from it, not from the
thinking); a reply cut inside the block is all reasoning, its answer empty. The tokens are unchanged: this only
says which part of the text is which.
"""
from __future__ import annotations

from typing import Sequence

OPEN, CLOSE = "<think>", "</think>"


def think_tags(tokenizer) -> tuple[int, int] | None:
    """The ids of ``<think>`` and ``</think>`` where the tokenizer has each as one token that decoding keeps (a
    special token's text is left out of the reply, and a split without its tags would be wrong), else None."""
    ids = []
    special = tokenizer.special_ids()
    for tag in (OPEN, CLOSE):
        got = tokenizer.token_to_id(tag)
        if got is None or int(got) in special:
            return None
        ids.append(int(got))
    return ids[0], ids[1]


def answer_start(text: str, inside: bool = False) -> int:
    """Where a whole reply's answer begins: just past its block's ``</think>``; 0 where it has no block; the text's
    end where the block is not closed (a reply cut while thinking)."""
    if not inside:
        s = text.lstrip()
        if not s.startswith(OPEN):
            return 0
    at = text.find(CLOSE)
    return len(text) if at < 0 else at + len(CLOSE)


def starts_inside(prompt_ids: Sequence[int], tags: tuple[int, int] | None) -> bool:
    """Whether a reply to ``prompt_ids`` begins inside a thinking block: the prompt's last ``<think>`` comes after
    its last ``</think>`` (the template opened the block for the model)."""
    if tags is None:
        return False
    last = {t: -1 for t in tags}
    for i, t in enumerate(prompt_ids):
        if t in last:
            last[t] = i
    return last[tags[0]] > last[tags[1]]


def reasoning_tokens(ids: Sequence[int], tags: tuple[int, int], inside: bool = False) -> int:
    """How many of a reply's tokens ``ids`` are its thinking: up to its ``</think>`` included where the reply starts
    inside a block or opens one (its first token ``<think>``), all of them where the block is not closed; else 0."""
    if not ids or not (inside or ids[0] == tags[0]):
        return 0
    for i, t in enumerate(ids):
        if t == tags[1]:
            return i + 1
    return len(ids)


def _held(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """Text in, ``("reasoning" | "content", text)`` pieces out (``feed`` as the reply streams, ``finish`` at its
    end). The block's tags and the whitespace just inside them and just after ``</think>`` are left out."""

    def __init__(self, inside: bool = False):
        self.state = "reasoning-start" if inside else "start"
        self.opened = inside  # the reply is (or was) in a block
        self.buf = ""  # text not yet given out
        self.reasoning: list[str] = []
        self.content: list[str] = []

    def feed(self, text: str) -> list[tuple[str, str]]:
        self.buf += text
        out: list[tuple[str, str]] = []
        while True:
            before = (self.state, len(self.buf))
            self._step(out, final=False)
            if (self.state, len(self.buf)) == before:
                return self._kept(out)

    def finish(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        while self.buf:
            before = (self.state, len(self.buf))
            self._step(out, final=True)
            if (self.state, len(self.buf)) == before:
                break
        return self._kept(out)

    def _kept(self, out):
        for kind, t in out:
            (self.reasoning if kind == "reasoning" else self.content).append(t)
        return out

    def _step(self, out: list, final: bool) -> None:
        b = self.buf
        if self.state == "start":  # does the reply open a block? (leading whitespace, then <think>)
            s = b.lstrip()
            if s.startswith(OPEN):
                self.buf, self.state, self.opened = s[len(OPEN):], "reasoning-start", True
            elif (OPEN.startswith(s) and not final) or (not s and not final):
                return  # (still undecided)
            else:
                self.state = "content"
        elif self.state == "reasoning-start":  # whitespace after <think> left out
            s = b.lstrip()
            if s or final:
                self.buf, self.state = s, "reasoning"
            else:
                self.buf = ""
        elif self.state == "reasoning":
            at = b.find(CLOSE)
            if at >= 0:
                if b[:at].rstrip():
                    out.append(("reasoning", b[:at].rstrip()))
                self.buf, self.state = b[at + len(CLOSE):], "after"
                return
            if final:
                if b.rstrip():
                    out.append(("reasoning", b.rstrip()))
                self.buf = ""
                return
            keep = _held(b, CLOSE)
            body = b[:len(b) - keep]
            tail = len(body) - len(body.rstrip())  # trailing whitespace: given out once more reasoning follows
            give = body[:len(body) - tail]
            if give:
                out.append(("reasoning", give))
                self.buf = b[len(give):]
        elif self.state == "after":  # whitespace after </think> left out
            s = b.lstrip()
            self.buf = s
            if s:
                self.state = "content"
        elif self.state == "content":
            if b:
                out.append(("content", b))
                self.buf = ""

    @property
    def closed(self) -> bool:
        """The reply's block opened and closed (its answer may follow)."""
        return self.opened and self.state in ("after", "content")

    @property
    def text_reasoning(self) -> str | None:
        """The reasoning given out so far (None: the reply had no block)."""
        return "".join(self.reasoning) if self.opened else None


def split_whole(text: str, inside: bool = False) -> ReasoningSplitter:
    """A splitter fed a whole reply (its ``text_reasoning``, ``content`` and ``closed`` read after)."""
    sp = ReasoningSplitter(inside)
    sp.feed(text)
    sp.finish()
    return sp


def split_reasoning(text: str, inside: bool = False) -> tuple[str | None, str]:
    """(the thinking, the answer) of a whole reply; the thinking None where the reply has no block."""
    if not isinstance(text, str) or not isinstance(inside, bool):
        from .errors import ConfigError

        raise ConfigError(f"split_reasoning takes a reply's text (a string) and inside (True or False), got "
                          f"{type(text).__name__} and {type(inside).__name__}")
    sp = split_whole(text, inside)
    return sp.text_reasoning, "".join(sp.content)
