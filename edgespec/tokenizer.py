"""Tokenizer, chat template and streaming detokenization (``tokenizers`` + sandboxed jinja2)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable, Sequence

from .errors import BundleError, ConfigError


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
        self._template = None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(i)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos_token_id is not None and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    # -- chat -------------------------------------------------------------------------------
    def render_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """Render messages through the model's chat template in a sandboxed jinja2 environment."""
        if not self.chat_template:
            raise ConfigError("this bundle has no chat template; use a plain prompt")
        if self._template is None:
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(msg):
                raise TemplateError(msg)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
            env.globals["raise_exception"] = raise_exception
            env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
                x, indent=indent, ensure_ascii=ensure_ascii)
            try:
                self._template = env.from_string(self.chat_template)
            except TemplateError as e:
                raise BundleError(f"the bundle's chat template does not parse: {e}") from None
        from jinja2.exceptions import TemplateError

        bos = self.id_to_token(self.bos_token_id) if self.bos_token_id is not None else ""
        eos = self.id_to_token(self.eos_token_ids[0]) if self.eos_token_ids else ""
        try:
            return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                         bos_token=bos or "", eos_token=eos or "")
        except TemplateError as e:
            raise ConfigError(f"chat template: {e}") from None

    def encode_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> list[int]:
        text = self.render_chat(messages, add_generation_prompt)
        # The template writes bos itself where the model wants it.
        return self._tok.encode(text, add_special_tokens=False).ids

    def stream_decoder(self) -> "StreamDecoder":
        return StreamDecoder(self)


class StreamDecoder:
    """Turns a growing list of token ids into text deltas.

    A token can end in the middle of a multi-byte UTF-8 character; its text then ends in U+FFFD.
    Such text is held back until a later token completes the character. Text is decoded from a
    short window of recent tokens, so the cost per token does not grow with the reply.
    """

    def __init__(self, tok: Tokenizer):
        self._tok = tok
        self.ids: list[int] = []
        self._prefix = 0  # window start
        self._read = 0  # tokens whose text has been emitted

    def push(self, new_ids: Iterable[int]) -> str:
        self.ids.extend(new_ids)
        prefix_text = self._tok.decode(self.ids[self._prefix:self._read])
        full = self._tok.decode(self.ids[self._prefix:])
        if len(full) > len(prefix_text) and not full.endswith("\ufffd"):
            delta = full[len(prefix_text):]
            self._prefix = self._read
            self._read = len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        prefix_text = self._tok.decode(self.ids[self._prefix:self._read])
        full = self._tok.decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return full[len(prefix_text):]
