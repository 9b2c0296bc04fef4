"""Tokenizer, chat template and streaming detokenization (``tokenizers`` + sandboxed jinja2)."""
from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .errors import BundleError, ConfigError, shown


def special_ids_past(tk, n: int) -> int | None:
    """How many ids the ``tokenizers.Tokenizer`` ``tk`` has from ``n`` on (a model's vocabulary size), where every
    one of them is an added special token (Gemma 3 1B's and 270M's tokenizer: Gemma 3's one, whose
    ``<image_soft_token>`` sits at 262,144, past their vocabulary; their models never write it, and a prompt that
    holds it is refused as any id outside the vocabulary); None where one of them is not (a token the model would
    need a row for)."""
    total = tk.get_vocab_size(with_added_tokens=True)
    if total <= n:
        return 0
    if max(tk.get_vocab(with_added_tokens=False).values(), default=-1) >= n:
        return None
    added = tk.get_added_tokens_decoder()
    past = range(n, total)
    return len(past) if all(i in added and added[i].special for i in past) else None


def tokenizer_fingerprint(tokenizer_json: str | Path | dict) -> tuple[str, int]:
    """sha256 of what decides token ids (model vocab, merges, added tokens) and the vocabulary size.

    Fields that do not change ids (padding, truncation, chat templates) are left out, so two
    packagings of the same tokenizer hash alike and two different vocabularies never do.
    """
    if isinstance(tokenizer_json, dict):
        data = tokenizer_json
    else:
        data = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
    model = data.get("model") or {}
    vocab = model.get("vocab") or {}
    added = sorted((t["id"], t["content"]) for t in data.get("added_tokens") or [])
    canon = {
        "type": model.get("type"),
        "vocab": sorted(vocab.items()) if isinstance(vocab, dict) else vocab,
        "merges": model.get("merges") or [],
        "added": added,
        "pre_tokenizer": data.get("pre_tokenizer"),
        "normalizer": data.get("normalizer"),
    }
    blob = json.dumps(canon, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()
    ids = [i for i, _ in added] + (list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab))))
    size = (max(ids) + 1) if ids else 0
    return hashlib.sha256(blob).hexdigest(), size


# fill-in-the-middle (code infilling): the control tokens by family, (prefix, suffix, middle), in the order
# prefix-suffix-middle the models were trained on: <prefix> PREFIX <suffix> SUFFIX <middle> -> the middle
FIM_FAMILIES = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, CodeGemma
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, StarCoder2, SantaCoder
    ("<fim-prefix>", "<fim-suffix>", "<fim-middle>"),
    ("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>", "<\uff5cfim\u2581end\uff5c>"),  # DeepSeek-Coder
)
# tokens that end a middle where the vocabulary has them (beside the model's end-of-sequence tokens and the
# FIM control tokens themselves): end of text, FIM padding, repository-level markup, end of turn
FIM_ENDS = ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|file_separator|>", "<fim_pad>",
            "<file_sep>", "<repo_name>", "<fim-pad>", "<|EOT|>", "<\uff5cend\u2581of\u2581sentence\uff5c>")


@dataclass(frozen=True)
class Fim:
    """A tokenizer's fill-in-the-middle tokens: the three control tokens and those that end a middle."""
    prefix: int
    suffix: int
    middle: int
    ends: tuple[int, ...]


def fim_split(prompt: Sequence[int], fim: Fim) -> tuple[int, int] | None:
    """Where a prompt laid out for fill in the middle (``<prefix> code before <suffix> code after <middle>``,
    a bos before it or not) puts its prefix and suffix tokens: (index of <prefix>, index of <suffix>); None
    for a prompt laid out otherwise."""
    lead = 1 if len(prompt) > 1 and prompt[0] != fim.prefix else 0
    if len(prompt) < lead + 3 or prompt[lead] != fim.prefix or prompt[-1] != fim.middle:
        return None
    for i in range(lead + 1, len(prompt) - 1):
        if prompt[i] == fim.suffix:
            return lead, i
    return None


class Tokenizer:
    """Wraps a ``tokenizers.Tokenizer`` with the bundle's bos/eos conventions and chat template."""

    def __init__(self, directory: str | Path, *, add_bos: bool = False, bos_token_id: int | None = None,
                 eos_token_ids: Sequence[int] = (), chat_template: str | None = None):
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(directory) / "tokenizer.json"
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises plain Exception on parse errors
            raise BundleError(f"cannot read {path}: {e}") from None
        self.add_bos = add_bos
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.chat_template = chat_template
        self.directory = Path(directory)
        self._eos_text: str | None = None
        self._template = None
        self._text_tok = None
        # (encode_text_piece: where a leading "▁" is added, the ids of the sentinel it cuts after; [] where not)
        self._prepends: list[int] | None = None
        self._stretch_tok = None
        self._stand_ins: tuple[str, str] = ("", "")
        self._specials: tuple[str, ...] | None = None
        self._max_token_bytes: int | None = None
        self._special_ids: frozenset[int] | None = None
        self._added: dict[int, str] | None = None
        self._fim: Fim | None | bool = False  # (False: not looked up yet)
        self._lock = threading.Lock()

    @classmethod
    def of(cls, manifest) -> "Tokenizer":
        """A bundle's tokenizer, with its manifest's bos/eos conventions and chat template."""
        return cls(manifest.tokenizer_dir, add_bos=manifest.add_bos, bos_token_id=manifest.bos_token_id,
                   eos_token_ids=manifest.eos_token_ids, chat_template=manifest.chat_template)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def special_past(self, n: int) -> int | None:
        """``special_ids_past`` of this tokenizer: its ids from ``n`` on when all are special tokens, else None."""
        return special_ids_past(self._tok, n)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def is_padding(self, i: int) -> bool:
        """Whether id ``i`` is no token of the model's: none at that id (a Hugging Face tokenizer under a head
        with more rows), or llama.cpp's converter's filler ``[PAD<i>]`` (a GGUF's vocabulary padded to the
        head's rows: Qwen2.5's 151,665 tokens to 151,936)."""
        t = self._tok.id_to_token(int(i))
        return t is None or t == f"[PAD{int(i)}]"

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(i)

    def token_bytes(self, i: int) -> bytes:
        """The UTF-8 bytes token ``i`` stands for (logprobs' ``bytes``): a special or added token's text; on
        byte-level tokenizers (GPT-2's byte alphabet) its bytes, which may be part of a character; on
        SentencePiece-style ones ``<0xNN>`` is that byte and ``▁`` a space; else its decoded text."""
        i = int(i)
        if self._added is None:
            self._added = {k: t.content for k, t in self._tok.get_added_tokens_decoder().items()}
        if i in self._added:
            return self._added[i].encode("utf-8")
        t = self._tok.id_to_token(i)
        if t is None:
            return b""
        if type(self._tok.decoder).__name__ == "ByteLevel" and all(c in _BYTE_OF for c in t):
            return bytes(_BYTE_OF[c] for c in t)
        b = _fallback_byte(t)
        if b is not None:
            return bytes([b])
        if "\u2581" in t:
            return t.replace("\u2581", " ").encode("utf-8")
        return self._tok.decode([i], skip_special_tokens=False).encode("utf-8")

    def ends_mid_character(self, ids: Sequence[int]) -> bool | None:
        """Whether the bytes of ``ids`` end inside a UTF-8 character (its first bytes only): True or False where the
        bytes of their last tokens are known (byte-level tokenizers, GPT-2's byte alphabet: Qwen, Llama 3,
        SmolLM2, ...; SentencePiece-style ones' ``<0xNN>`` byte tokens: Llama 2, Mistral, Gemma), None else."""
        n = self._unfinished_bytes(ids)
        return None if n is None else n > 0

    def finished_text(self, ids: Sequence[int], start: int = 0) -> str:
        """``decode(ids[start:])`` less a character whose first bytes only the last tokens gave (the decoder's
        U+FFFD for it): on byte-level tokenizers the one U+FFFD it ends with; on SentencePiece-style ones the
        byte tokens of that character left out (their ``ByteFallback`` turns a run of byte tokens that is no
        whole UTF-8 into a U+FFFD a byte, the run's whole characters too)."""
        n = self._unfinished_bytes(ids)
        if not n:
            return self.decode(ids[start:])
        if type(self._tok.decoder).__name__ == "ByteLevel":
            text = self.decode(ids[start:])
            return text[:-1] if text.endswith("\ufffd") else text
        special, j, seen = self.special_ids(), len(ids), 0
        while j > start and seen < n:  # (each of the character's bytes a token of its own)
            j -= 1
            seen += int(ids[j]) not in special
        return self.decode(ids[start:j])

    def _unfinished_bytes(self, ids: Sequence[int]) -> int | None:
        """How many bytes at the end of ``ids``' bytes begin a UTF-8 character they do not finish (0: none); None where
        the bytes of a token are not known."""
        byte_level = type(self._tok.decoder).__name__ == "ByteLevel"
        special = self.special_ids()
        tail = b""
        for i in reversed(ids):
            if int(i) in special:  # decode leaves them out
                continue
            t = self._tok.id_to_token(int(i))
            if t is None:
                return None
            if byte_level:
                if not all(c in _BYTE_OF for c in t):
                    return None
                tail = bytes(_BYTE_OF[c] for c in t) + tail
            elif (b := _fallback_byte(t)) is not None:  # a byte-fallback token: that byte
                tail = bytes([b]) + tail
            else:  # a piece of text (whole characters): the tail's bytes begin after it
                break
            if len(tail) >= 4:  # a character is at most 4 bytes
                break
        return _incomplete_utf8(tail)

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``; with ``parse_special`` False the text of a special token
        (``<|im_end|>``) is encoded as the characters it is, not as that token."""
        _check_text(text, "the prompt")
        tok = self._tok if parse_special else self._text_tokenizer()
        ids = tok.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos_token_id is not None and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id] + ids
        return ids

    def fim(self) -> Fim | None:
        """This vocabulary's fill-in-the-middle tokens (``FIM_FAMILIES``), or None where it has none."""
        if self._fim is False:  # (assigned once, whole: threads that look at once all see the answer)
            added = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items()}
            found = None
            for names in FIM_FAMILIES:
                ids = [added.get(n) for n in names]
                if None not in ids:
                    ends = {added[n] for n in FIM_ENDS if n in added} | set(ids) | set(self.eos_token_ids)
                    found = Fim(*ids, ends=tuple(sorted(ends)))
                    break
            self._fim = found
        return self._fim

    def require_fim(self) -> Fim:
        """``fim()``, or ``ConfigError`` where the vocabulary has no FIM tokens."""
        f = self.fim()
        if f is None:
            raise ConfigError("this model has no fill-in-the-middle tokens (<|fim_prefix|>, <fim_prefix>, ...): "
                              "a suffix needs a code model trained to fill in the middle")
        return f

    def encode_infill(self, prefix: str, suffix: str, parse_special: bool = True) -> list[int]:
        """The ids of a fill-in-the-middle prompt: the code before the gap and after it, in the order
        prefix-suffix-middle, each text encoded on its own (as ``encode``: with ``parse_special`` False
        a special token's text in them is text). ``ConfigError`` where the vocabulary has no FIM tokens."""
        _check_text(prefix, "the prompt")
        _check_text(suffix, "the suffix")
        f = self.require_fim()
        return ([self.bos_token_id] if self.add_bos and self.bos_token_id is not None else []) + [f.prefix] \
            + self.encode(prefix, add_special=False, parse_special=parse_special) + [f.suffix] \
            + self.encode(suffix, add_special=False, parse_special=parse_special) + [f.middle]

    def _text_tokenizer(self):
        """A second ``tokenizers.Tokenizer`` that reads every added token's text as text: the special
        tokens' and the others', such as Qwen2.5's ``<tool_call>`` markup (a flag that is not toggled on
        the shared one, so threads encoding at once never see it flip)."""
        with self._lock:
            if self._text_tok is None:
                self._text_tok = self._text_copy(lambda a: True)
            return self._text_tok

    def encode_text_piece(self, text: str) -> list[int]:
        """``text`` as the ids of text within a longer one (every added token's text read as text): a
        SentencePiece-style tokenizer's leading "▁" (Metaspace's prepend, the legacy Prepend normalizer: Llama 2,
        Mistral, Phi-3) is not added, as a grammar's forced text, spelled mid-reply, needs (llguidance's fixed
        text: constrain.Grammars)."""
        tok = self._text_tokenizer()
        if self._prepends is None:
            first = tok.encode("a", add_special_tokens=False).tokens
            # (a byte no merge takes, whose ids the text is cut after: encoded once)
            self._prepends = tok.encode("\x02", add_special_tokens=False).ids if first and first[0].startswith(
                "\u2581") else []
        mark = self._prepends
        if not mark:
            return tok.encode(text, add_special_tokens=False).ids
        ids = tok.encode("\x02" + text, add_special_tokens=False).ids
        return ids[len(mark):] if ids[:len(mark)] == mark else tok.encode(text, add_special_tokens=False).ids

    def _text_copy(self, as_text):
        """A copy of the tokenizer that reads the text of each added token ``as_text(entry)`` picks (its JSON entry)
        as text (``encode_special_tokens`` reads special tokens' text as text: those are made special)."""
        from tokenizers import Tokenizer as HFTokenizer

        data = json.loads(self._tok.to_str())
        for a in data.get("added_tokens") or []:
            a["special"] = a["special"] or as_text(a)
        t = HFTokenizer.from_str(json.dumps(data))
        t.encode_special_tokens = True
        return t

    def special_ids_texts(self) -> set[str]:
        """The texts of the special tokens (those decoding leaves out of the reply's text)."""
        return {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special and t.content}

    def special_ids(self) -> frozenset[int]:
        """The ids of special added tokens (decoding leaves their text out of a reply)."""
        if self._special_ids is None:
            self._special_ids = frozenset(i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)
        return self._special_ids

    @property
    def special_texts(self) -> tuple[str, ...]:
        """The texts that stay text in message content, tools and calls: every added token's (special
        ones, and markup such as ``<tool_call>``, which a message or a tool's result must not open)."""
        if self._specials is None:
            self._specials = tuple(t.content for t in self._tok.get_added_tokens_decoder().values()
                                   if t.content and _markup(t.special, t.content))
        return self._specials

    def min_tokens(self, text: str) -> int:
        """A lower bound of the tokens ``text`` encodes to, without tokenizing it: its UTF-8 bytes
        over the longest token's bytes."""
        if self._max_token_bytes is None:
            self._max_token_bytes = max((len(t.encode("utf-8", "replace")) for t in self._tok.get_vocab()), default=1)
        return len(text.encode("utf-8", "surrogatepass")) // max(1, self._max_token_bytes)

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        ids = list(ids)
        try:
            return self._tok.decode(ids, skip_special_tokens=skip_special)
        except (OverflowError, TypeError):  # (a negative id, one past 2**32, or not an integer)
            raise ConfigError(f"token ids must be integers from 0 to 2**32 - 1, got "
                              f"{next((i for i in ids if not isinstance(i, int) or not 0 <= i < 2**32), ids)!r}"[:200]
                              ) from None

    # -- chat -------------------------------------------------------------------------------
    def render_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                    tools: Sequence[dict] | None = None, template_kwargs: dict | None = None) -> str:
        """Render messages (and ``tools``, OpenAI's function definitions, for templates that take them:
        tools.py) through the model's chat template (sandboxed, with limits: template.py); ``template_kwargs``:
        more variables for it (``template.check_template_kwargs``: Qwen3's ``enable_thinking``)."""
        if not self.chat_template:
            raise ConfigError("this bundle has no chat template; use a plain prompt")
        if self._template is None:
            from .template import ChatTemplate

            self._template = ChatTemplate(self.chat_template)
        bos = self.id_to_token(self.bos_token_id) if self.bos_token_id is not None else ""
        eos = self._template_eos()
        from .template import check_template_kwargs

        # tools and documents are defined (none where not given), as transformers renders them: a template that asks
        # ``tools is defined`` (Hermes-style ones) writes its tool section with ``null`` there too
        extra = {**check_template_kwargs(template_kwargs), "tools": list(tools) if tools else None, "documents": None}
        text = self._template.render(messages=check_messages(messages), add_generation_prompt=add_generation_prompt,
                                     bos_token=bos or "", eos_token=eos or "", **extra)
        _check_text(text, "the chat the template wrote")  # (what no check of the messages' own reaches: one error)
        return text

    def _template_eos(self) -> str:
        """The template's ``eos_token``: the tokenizer's own (its tokenizer_config.json's, as transformers gives it;
        a bundle may end at several ids, Qwen2.5's <|endoftext|> and <|im_end|>, of which the smallest was taken: a
        template writing ``eos_token`` after each turn wrote <|endoftext|>); else the bundle's first end id's text."""
        if self._eos_text is None:
            text = None
            try:
                cfg = json.loads((self.directory / "tokenizer_config.json").read_text(encoding="utf-8"))
                e = cfg.get("eos_token") if isinstance(cfg, dict) else None
                e = e.get("content") if isinstance(e, dict) else e
                if isinstance(e, str):
                    text = e
            except (OSError, ValueError, RecursionError):  # (no file, not JSON, nested too deeply: the end id's)
                pass
            if text is None:
                text = (self.id_to_token(self.eos_token_ids[0]) or "") if self.eos_token_ids else ""
            self._eos_text = text
        return self._eos_text

    def encode_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                    tools: Sequence[dict] | None = None, template_kwargs: dict | None = None) -> list[int]:
        """The ids of ``messages`` (and ``tools``) through the chat template. Message content, tools and
        tool calls are text: a special token's text typed into them stays text; only the template's own
        markup yields special tokens (and, in an assistant's content, a thinking block's tags, which the model
        wrote as those tokens and its template reads: Qwen3's leaves earlier turns' thinking out)."""
        messages = check_messages(messages)
        specials = self.special_texts
        if template_kwargs and any(s in x for x in _strings([template_kwargs]) for s in specials):
            raise ConfigError("chat_template_kwargs hold a special token's text; the template's variables are text "
                              "written into its markup, where it would be that token")
        structured = [m["tool_calls"] for m in messages if m.get("tool_calls")] + ([list(tools)] if tools else [])
        in_content = any(s in m["content"] or s in (m.get("reasoning_content") or "")
                         for m in messages for s in specials)
        in_structured = any(s in x for x in _strings(structured) for s in specials)
        if not in_content and not in_structured:
            # the template writes bos itself where the model wants it
            return self._tok.encode(self.render_chat(messages, add_generation_prompt, tools, template_kwargs),
                                    add_special_tokens=False).ids
        # each special token's text in the texts becomes a placeholder of its own (the template's own string work,
        # trim, split, startswith, acts on the rest as on the text), the template renders, and the result is split
        # at the tokens the template wrote; each stretch between two of them, its placeholders back to their text,
        # is encoded whole, every added token's text in it as text, as the tokenizer encodes a stretch after an added
        # token (a piece encoded on its own merged nothing across its ends, and SentencePiece-style tokenizers
        # began each piece with a space)
        from .reasoning import CLOSE, OPEN, think_tags

        # the placeholders carry a tag of this call's own: a text cannot hold one by chance (a fixed form was read
        # back from what a user typed: a KeyError, or another text put in its place)
        texts: dict[str, str] = {"": secrets.token_hex(8)}
        markup = (OPEN, CLOSE) if think_tags(self) is not None else ()
        in_reply = [s for s in specials if s not in markup]
        marked = []
        for m in messages:
            m = dict(m)
            if in_content:
                m["content"] = _mark(m["content"], in_reply if m.get("role") == "assistant" else specials, texts)
                if isinstance(m.get("reasoning_content"), str):  # (an assistant's thinking, given back)
                    m["reasoning_content"] = _mark(m["reasoning_content"], specials, texts)
            if m.get("tool_calls") and in_structured:
                m["tool_calls"] = _mark(m["tool_calls"], specials, texts)
            marked.append(m)
        if tools and in_structured:
            tools = _mark(list(tools), specials, texts)
        text = self.render_chat(marked, add_generation_prompt, tools, template_kwargs)
        if len(texts) == 1:  # (only think tags in an assistant's content: markup)
            return self._tok.encode(text, add_special_tokens=False).ids
        placeholder = re.compile("\ue002" + texts[""] + "-[0-9]+\ue003")

        def stretch(a: int, b: int, before) -> list[int]:  # (its placeholders back to their texts)
            return self._stretch_ids(placeholder.sub(lambda m: texts[m.group(0)], text[a:b]), before)

        enc = self._tok.encode(text, add_special_tokens=False)
        added = self._tok.get_added_tokens_decoder()
        ids: list[int] = []
        at, before = 0, None
        offsets = enc.offsets
        for k, (i, (a, b)) in enumerate(zip(enc.ids, offsets)):
            t = added.get(i)
            if t is not None and _markup(t.special, t.content):  # a token the template wrote (not one of spaces)
                # the spaces it strips (lstrip/rstrip) are its own where trimmed offsets leave them out (up to the
                # tokens beside it: an added token of spaces before it is matched first)
                low = max(at, offsets[k - 1][1] if k else 0)
                high = offsets[k + 1][0] if k + 1 < len(offsets) else len(text)
                while t.lstrip and a > low and _stripped(text[a - 1]):
                    a -= 1
                while t.rstrip and b < high and _stripped(text[b]):
                    b += 1
                if a > at:
                    ids += stretch(at, a, before)
                ids.append(i)
                at, before = b, t
        if at < len(text):
            ids += stretch(at, len(text), before)
        return ids

    def _stretch_ids(self, piece: str, before) -> list[int]:
        """The ids of ``piece``, a stretch of a rendered chat after the added token ``before`` (None: at the text's
        start), every added token's text in it read as text: encoded after a stand-in for that token, normalized
        as it is (a normalizer's prefix space goes before a normalized token, not after it), and cut after it."""
        tok, ids = self._stretch_tokenizer()
        if before is None:
            return tok.encode(piece, add_special_tokens=False).ids
        stand_in = ids[bool(before.normalized)]
        got = tok.encode(self._stand_ins[bool(before.normalized)] + piece, add_special_tokens=False).ids
        return got[got.index(stand_in) + 1:]

    def _stretch_tokenizer(self):
        """``_text_tokenizer``'s copy with two added tokens more (``_stand_ins``: texts of random private-use
        characters no text holds by chance), not normalized and normalized, which stand before a stretch as the
        template's token stood; (the tokenizer, their two ids)."""
        with self._lock:
            if self._stretch_tok is None:
                from tokenizers import AddedToken

                t = self._text_copy(lambda a: _markup(a["special"], a["content"]))  # (whitespace tokens stay tokens)
                nonce = secrets.token_hex(8)
                self._stand_ins = tuple(f"\ue004{nonce}{k}\ue005" for k in "rn")
                t.add_tokens([AddedToken(self._stand_ins[0], special=False, normalized=False),
                              AddedToken(self._stand_ins[1], special=False, normalized=True)])
                self._stretch_tok = (t, tuple(t.token_to_id(x) for x in self._stand_ins))
            return self._stretch_tok

    def stream_decoder(self, context: Sequence[int] = ()) -> "StreamDecoder":
        """A decoder of a reply's ids into text deltas; ``context``: the prompt's ids (``text_context``)."""
        return StreamDecoder(self, self.text_context(context))

    def text_context(self, prompt_ids: Sequence[int]) -> tuple[int, ...]:
        """The last few ids of a prompt that its reply is decoded after (``TEXT_CONTEXT``), so that the reply's text is
        what the prompt's and the reply's ids spell together less the prompt's: a SentencePiece-style decoder
        (Llama 2, Mistral, Phi-3: Metaspace, then Strip) takes a text's first space off, and a reply decoded alone lost
        its first word's space ("The capital is" + "Paris."; session 55, a review). () where the tail ends in a
        character it only begins (ids that cut one: its text would be the reply's)."""
        tail = tuple(int(t) for t in list(prompt_ids)[-TEXT_CONTEXT:])
        return tail if tail and not self.decode(tail).endswith("\ufffd") else ()


def _strings(obj):
    """Every string in a JSON-like value, keys included."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _strings(v)


def _markup(special: bool, content: str) -> bool:
    """Whether an added token is markup, whose text in a message stays text: a special one, or one of more than
    whitespace (one of whitespace only, Gemma's "\n\n", is a piece of text: it opens and closes nothing)."""
    return bool(special or content.strip())


def _stripped(c: str) -> bool:
    """Whether an added token's lstrip/rstrip takes character ``c``: Rust's whitespace (Python's str.isspace also
    counts the separators U+001C..U+001F)."""
    return c.isspace() and c not in "\x1c\x1d\x1e\x1f"


def _mark(obj, specials: Sequence[str], texts: dict):
    """``obj`` with each special token's text in its strings replaced by a placeholder of its own
    (``texts`` maps it back; ``texts[""]``: the call's tag, in every placeholder): a tool's description or a call's
    argument holding ``<|im_end|>``."""
    if isinstance(obj, str):
        pattern = "(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")"
        out = []
        for j, piece in enumerate(re.split(pattern, obj)):
            if j % 2:
                key = f"\ue002{texts.get('', '')}-{len(texts)}\ue003"
                texts[key] = piece
                piece = key
            out.append(piece)
        return "".join(out)
    if isinstance(obj, dict):
        return {_mark(k, specials, texts): _mark(v, specials, texts) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_mark(v, specials, texts) for v in obj]
    return obj


def _check_text(text, what: str) -> None:
    if not isinstance(text, str):
        raise ConfigError(f"{what} must be a string, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(f"{what} is not valid UTF-8 text (undecodable byte at character {e.start})") from None


def check_messages(messages) -> list[dict]:
    """Chat messages as the template gets them: a list of objects with a string 'role' (a name)
    and string 'content' (text); ``ConfigError`` otherwise."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ConfigError(f"messages must be a list of {{role, content}} objects, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ConfigError(f"message {i} must be an object with 'role' and 'content', got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]{0,31}", role):
            raise ConfigError(f"message {i}: role must be a name (letters, digits, _ or -), got {shown(role)}")
        _check_text(m.get("content"), f"message {i}'s content")
        if m.get("reasoning_content") is not None:  # (an assistant's thinking, for templates that render it)
            _check_text(m["reasoning_content"], f"message {i}'s reasoning_content")
        out.append(m)
    return out


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte (the inverse of its ``bytes_to_unicode``)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_OF = _byte_alphabet()


def _fallback_byte(token: str) -> int | None:
    """The byte a SentencePiece-style byte-fallback token stands for (``<0xE4>``: 0xE4); None for another token."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


def _incomplete_utf8(data: bytes) -> int:
    """How many bytes at the end of ``data`` are a UTF-8 character's lead byte and fewer continuation bytes than it
    needs (0: none; true as a bool where some are)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 == 0x80:  # a continuation byte: look further back for the lead
            continue
        need = 2 if 0xC0 <= b < 0xE0 else 3 if 0xE0 <= b < 0xF0 else 4 if 0xF0 <= b < 0xF8 else 1
        return back if back < need else 0
    return 0


TEXT_CONTEXT = 4  # the prompt's ids a reply is decoded after (Tokenizer.text_context)


class StreamDecoder:
    """Turns a growing list of token ids into text deltas.

    A token can end in the middle of a multi-byte UTF-8 character; its text then ends in U+FFFD.
    Such text is held back until a later token completes the character (and dropped if none does). Text is decoded from a
    short window of recent tokens, so the cost per token does not grow with the reply.
    """

    def __init__(self, tok: Tokenizer, context: Sequence[int] = ()):
        self._tok = tok
        self.ids: list[int] = []  # the reply's
        # the prompt's last ids (Tokenizer.text_context), decoded before the reply's and not emitted: offsets count them
        self._ctx = list(context)
        self._prefix = 0  # window start
        self._read = len(self._ctx)  # tokens whose text has been emitted (or is the prompt's)
        self._ctx_len: int | None = None  # the context's text's length (text_len)

    def _span(self, a: int, b: int | None = None) -> list[int]:
        """Ids ``a`` to ``b`` (the end: None) of the context followed by the reply."""
        c = len(self._ctx)
        b = c + len(self.ids) if b is None else b
        return self.ids[a - c:b - c] if a >= c else self._ctx[a:] + self.ids[:b - c]

    def push(self, new_ids: Iterable[int]) -> str:
        self.ids.extend(new_ids)
        prefix_text = self._tok.decode(self._span(self._prefix, self._read))
        full = self._tok.decode(self._span(self._prefix))
        if len(full) > len(prefix_text) and not full.endswith("\ufffd"):
            delta = full[len(prefix_text):]
            self._prefix = self._read
            self._read = len(self._ctx) + len(self.ids)
            return delta
        return ""

    def held(self) -> str:
        """The text of the tokens pushed but not emitted yet (ending in U+FFFD: a character they only began, or bytes
        that are no UTF-8, which a later push emits as U+FFFD before its own text)."""
        if self._read == len(self._ctx) + len(self.ids):
            return ""
        return self._tok.decode(self._span(self._prefix))[len(self._tok.decode(self._span(self._prefix, self._read))):]

    def flush(self) -> str:
        """The text held back, at the end of a generation. A character whose bytes the last tokens
        only began (a reply cut by its token limit) is left out rather than sent as U+FFFD (on
        byte-level tokenizers, whose token bytes are known): the text holds only characters the model
        completed. A U+FFFD the model wrote whole, or bytes that are no UTF-8, stay as they are."""
        prefix_text = self._tok.decode(self._span(self._prefix, self._read))
        full = self._tok.finished_text(self._span(0), self._prefix)  # (an unfinished last character left out)
        self._prefix = self._read = len(self._ctx) + len(self.ids)
        return full[len(prefix_text):]

    def text_len(self, ids: Sequence[int]) -> int:
        """The length of the text the reply's first ids ``ids`` have given (after this decoder's context): a character
        their last tokens only began is not out yet."""
        if not self._ctx:
            return len(self._tok.finished_text(ids))
        if self._ctx_len is None:  # (the context's text, decoded once: _ids_up_to asks a few times)
            self._ctx_len = len(self._tok.decode(self._ctx))
        return len(self._tok.finished_text(self._ctx + list(ids))) - self._ctx_len
