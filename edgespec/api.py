"""The embedded Python API: ``edgespec.load(bundle) -> Engine``.

    import edgespec
    engine = edgespec.load("bundles/smollm2")
    print(engine.generate("Write a haiku about the sea.", max_new_tokens=40).text)
    for delta in engine.stream("Count to five."):
        print(delta, end="", flush=True)
    chat = engine.chat(system="You are terse.")
    print(chat.send("What is 2+2?").text)

One generation runs at a time per engine; calls from several threads are serialized by a lock,
so sharing an engine between threads is safe (they take turns).
"""
from __future__ import annotations

import dataclasses
import json
import numbers
import operator
import os
import threading
import types
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple, Sequence

import numpy as np

from .decoder import Decoder, GenerationConfig, Stats, TokenLogprob
from .drafters import DRAFTERS, LoadEnv
from .errors import BundleError, ClosedError, ConfigError, ContextOverflowError, EdgespecError, shown
from .manifest import Manifest, load_manifest
from .onnx_lm import OnnxLM
from .prompt_cache import PromptCache
from .providers import choose, with_load_options
from .tokenizer import StreamDecoder, Tokenizer, fim_split

_GEN_KEYS = {f for f in GenerationConfig.__dataclass_fields__}


@dataclass
class Result:
    text: str
    token_ids: list[int]
    stats: dict
    finish_reason: str | None = None
    # with ``tools``: the calls the reply made, OpenAI's shape ({id, type, function: {name, arguments}});
    # ``text`` is then the reply's content outside them
    tool_calls: list[dict] = field(default_factory=list)
    # with ``logprobs=N``: one dict per returned token ({token_id, token, bytes, logprob, offset, top_logprobs},
    # ``Engine.logprob_entry``), else None
    logprobs: list[dict] | None = None
    # a thinking model's reply that began inside a ``<think>`` block its chat template opened (DeepSeek-R1's, a
    # template asked to think): ``text`` then has the block's end and no start, and
    # ``split_reasoning(text, inside=result.reasoning_open)`` takes it apart (session 64)
    reasoning_open: bool = False


class Delta(NamedTuple):
    """What ``Engine.stream_ids`` yields each round: the text decoded (held back where it may begin a stop
    string), the round's token ids, the generation's live stats and, with ``logprobs``, the entries
    (``Engine.logprob_entry``) of the tokens whose text has come out (all of them at the end: they line up
    with ``Engine.returned_ids``)."""
    text: str
    ids: list[int]
    stats: Stats
    logprobs: list[dict] | None = None


def _arguments_checked(f):
    """``f`` with its arguments matched to its signature first: a misspelt keyword (``max_ctx=``), one too many, or
    one missing is a ``ConfigError`` (as ``generate``'s unknown options are), not Python's TypeError."""
    import functools
    import inspect

    sig = inspect.signature(f)

    @functools.wraps(f)
    def checked(*args, **kw):
        try:
            sig.bind(*args, **kw)
        except TypeError as e:
            raise ConfigError(f"{f.__name__}(): {e}") from None
        return f(*args, **kw)

    return checked


@_arguments_checked
def load(bundle: str | os.PathLike, *, profile=None, provider: str | None = None, max_context: int | None = None,
         threads: int | None = None, use_drafter: bool = True, verify: bool = False,
         min_width: int | None = None, memory: bool | str | os.PathLike = True,
         documents: Sequence[str | os.PathLike] = (), drafter_provider: str | None = None,
         cuda_graphs: bool | None = None, prompt_cache_mb: int | None = None,
         prompt_cache_file: str | os.PathLike | None = None, model_sampling: bool = True) -> "Engine":
    """Open a bundle: check it, plan memory (with a profile), open sessions, allocate KV caches.

    ``memory``: the suffix drafter's store of earlier outputs (True: this bundle's store under
    ~/.cache/edgespec/memory; a path: that store file; False: nothing read or stored).
    ``documents``: text files the suffix drafter drafts from (see ``Engine.add_documents``).

    ``profile`` is a profile name, a path to a TOML file, or a ``Profile``; ``provider`` (cpu, cuda,
    tensorrt) overrides the profile's list and is an error if it cannot run. ``verify`` hashes
    every weight file against the manifest. ``min_width`` overrides the target's exactness width
    measured at load (benchmarks: 1 prices the policy; anything else may break exactness).
    ``drafter_provider`` places the drafter model on another provider than the target (e.g. cpu
    while the target runs on cuda; default: the profile's ``drafter_provider``, else the target's):
    only token ids cross between them, and a placement the budget cannot hold is a ``BudgetError``.
    ``cuda_graphs``: on the CUDA EP, replay captured CUDA graphs for calls of up to 16 tokens
    (``edgespec/graphs.py``; None: the profile's ``enable_cuda_graph``, else on).
    ``prompt_cache_mb``: host memory for earlier conversations' KV rows, restored when a prompt shares
    their prefix (``edgespec/prompt_cache.py``; CPU targets; 0: none; None: the profile's
    ``prompt_cache_mb``, else sized by the memory plan). ``prompt_cache_file``: the prompt cache is read
    from this file (if it exists and this engine wrote it: the same bundle, onnxruntime, CPU and kernels;
    another engine's is ignored with a warning) and written back when the engine closes or the process
    exits, so a restarted server keeps its long system prompts and documents computed. Off by default:
    the rows are the conversations' contents. ``model_sampling`` (default True): the sampling the model's authors
    recommend (``Manifest.sampling_defaults``: its generation_config.json where it samples, a GGUF file's
    general.sampling.* keys) is the engine's default for the options a generation leaves out
    (``Engine.sampling_defaults``), as transformers and vLLM take it; False: greedy decoding and no cut or penalty
    unless a generation asks.
    """
    from .placement import requested_providers
    from .planner import plan as make_plan
    from .profiles import resolve_profile
    from .suffix import read_document

    if documents is not None and not isinstance(documents, (str, bytes, os.PathLike, list, tuple)):
        try:  # a generator or a set of paths
            documents = list(documents)
        except TypeError:
            pass  # refused below
    # numpy's booleans as Python's (memory=np.True_ was taken for a path; use_drafter, verify, cuda_graphs refused)
    use_drafter, verify, memory, cuda_graphs, model_sampling = (
        bool(v) if isinstance(v, np.bool_) else v for v in (use_drafter, verify, memory, cuda_graphs, model_sampling))
    if isinstance(max_context, numbers.Integral) and not isinstance(max_context, bool):
        max_context = int(max_context)
    if isinstance(min_width, numbers.Integral) and not isinstance(min_width, bool):
        min_width = int(min_width)
    if isinstance(prompt_cache_mb, numbers.Integral) and not isinstance(prompt_cache_mb, bool):
        prompt_cache_mb = int(prompt_cache_mb)
    _check_load_args(bundle=bundle, profile=profile, provider=provider, max_context=max_context,
                     use_drafter=use_drafter, verify=verify, min_width=min_width, memory=memory, documents=documents,
                     drafter_provider=drafter_provider, cuda_graphs=cuda_graphs, prompt_cache_mb=prompt_cache_mb,
                     prompt_cache_file=prompt_cache_file, model_sampling=model_sampling)
    doc_paths = [documents] if isinstance(documents, (str, os.PathLike)) else list(documents)
    doc_texts = [read_document(p) for p in doc_paths]

    n_threads = _threads(threads)
    manifest = load_manifest(bundle, deep=verify)
    prof = resolve_profile(profile)
    if prompt_cache_mb is not None:
        prof = dataclasses.replace(prof, prompt_cache_mb=prompt_cache_mb)
    requested, d_requested, d_named = requested_providers(manifest, prof, provider, drafter_provider, use_drafter,
                                                          here=True)
    the_plan = make_plan(manifest, prof, max_context=max_context, use_drafter=use_drafter, providers=requested,
                         drafter_providers=d_requested, keep_drafter=bool(drafter_provider))
    for w in the_plan.warnings:  # a context cut to the bundle's, a KV type the graphs do not have
        warnings.warn(w, stacklevel=2)
    choice = choose(requested, prof.provider_options, explicit=bool(provider))
    d_choice = choice if d_requested == requested else choose(d_requested, prof.provider_options, explicit=d_named)

    # what the budget leaves after the KV caches, the runtime and every model's weights is split
    # evenly between the sessions: a session's CUDA arena may hold its weights and its share, and
    # its TensorRT workspace is its share, so the limits of all sessions add up to the budget
    spare = (the_plan.budget - sum(the_plan.kv.values()) - the_plan.runtime - sum(the_plan.weights.values())
             - the_plan.prompt_cache - the_plan.indexes)  # (the suffix drafter's indexes: host memory of the budget)
    share = max(0, spare) // max(1, len(the_plan.weights))

    def options_for(role: str):
        return with_load_options(d_choice if role == "drafter" else choice, bundle_root=manifest.root,
                                 gpu_mem_limit=the_plan.weights.get(role, 0) + share, trt_workspace=share,
                                 cuda_graphs=cuda_graphs)

    if threads is None:  # a profile's count, written for its device, is bounded by this machine's cores
        n_threads = min(prof.threads, _cores())

    def open_model(role: str, min_width: int | None = None) -> OnnxLM:
        # target and drafter take turns on one process-wide thread pool (onnx_lm.shared_thread_pool)
        spec = manifest.target if role == "target" else manifest.drafter
        return OnnxLM(spec, the_plan.context, options_for(role), threads=n_threads,
                      prefill_chunk=the_plan.prefill_chunk, min_width=min_width,
                      allow_cpu_fallback=prof.allow_cpu_fallback, session_options=prof.session_options)

    target = open_model("target", min_width)
    env = LoadEnv(manifest, the_plan, prof, open_model, options={"memory": memory}, target=target)
    drafters = [d for d in (cls.build(env) for cls in DRAFTERS.values()) if d is not None]
    decoder = Decoder(target, manifest.eos_token_ids, drafters=drafters)
    if the_plan.prompt_cache and target.cache.host:  # (after the width probe: its calls are not kept)
        target.prompt_cache = PromptCache(the_plan.prompt_cache)
    persisted = None
    if prompt_cache_file is not None:  # (None back: a file kept as it is, not written)
        persisted = _open_prompt_cache_file(prompt_cache_file, manifest, target, the_plan, prof.session_options)
    tok = Tokenizer.of(manifest)
    if tok.vocab_size > manifest.target.vocab_size and tok.special_past(manifest.target.vocab_size) is None:
        raise BundleError(f"bundle {manifest.root}: the tokenizer has {tok.vocab_size} ids but the target graph's "
                          f"vocabulary has {manifest.target.vocab_size}: not this model's tokenizer")
    engine = Engine(manifest, tok, decoder, the_plan, prof, choice, model_sampling=model_sampling)
    if "model" in decoder.drafters:  # a fill-in-the-middle prompt is read as its head (drafters.fim_head)
        decoder.drafters["model"].fim = tok.fim()
    if persisted is not None:  # written at close, or when the process exits (the finalizer holds no engine)
        path, key, owned = persisted
        engine._prompt_cache_file = path if owned else None  # (reset deletes only a file of this engine's)
        engine._write_prompt_cache = weakref.finalize(engine, _write_prompt_cache, target.prompt_cache, target.cache,
                                                      path, key, decoder.lock)
    if doc_texts:
        from .suffix import add_documents

        add_documents(engine, texts=doc_texts, names=[os.fspath(p) for p in doc_paths])  # (an error names the file)
    return engine


def _open_prompt_cache_file(path, manifest, target, the_plan, session_options) -> tuple:
    """Read ``path`` into the target's prompt cache; (path, key) to write it back with, and whether the file
    is this engine's (absent, or read: not another engine's it ignored). ``ConfigError``
    where there is no prompt cache to keep, ``StoreError`` for a file that is not one edgespec wrote."""
    from pathlib import Path

    from .prompt_cache import engine_key, read_file, remove_stale_temporaries

    pc = target.prompt_cache
    if pc is None:
        why = ("the target runs on a GPU" if not target.cache.host else
               "its size is 0 (prompt_cache_mb, or what the memory plan leaves)")
        raise ConfigError(f"a prompt cache file needs a prompt cache, and this engine has none: {why}")
    from .errors import state_path

    named = os.fspath(path)
    path = state_path(path, ConfigError)  # (absolute, through a link: written at close, removed at reset)
    if path.is_dir() or str(named).endswith(("/", os.sep)):  # ("newdir/" names a directory, not a file)
        raise ConfigError(f"the prompt cache file {named} is a directory; name a file")
    if path.exists() and not path.is_file():  # a device or a pipe: no prompt cache, and /dev/zero never ends
        raise ConfigError(f"the prompt cache file {path} is not a regular file")
    # where it will be written at close (a temporary file beside it, then a rename): said now, not after hours of
    # conversations, which a server's close would then lose
    # (folders missing on the way are made at close: the nearest one there is must take them)
    parent = next((p for p in (path.parent, *path.parent.parents) if p.exists()), Path("."))
    read_only = parent.is_dir() and not _writable_dir(parent)
    # a file made read-only (a kiosk's prepared cache, chmod a-w) is read and kept as it is, as on a read-only image
    # (it was replaced at close, as a 0600 file of this user's; session 92, a review)
    kept = path.is_file() and not (path.stat().st_mode & 0o222 and os.access(path, os.W_OK))
    if read_only and not path.is_file():
        raise ConfigError(f"the prompt cache file {path} cannot be written: {parent} takes no new files "
                          "(no permission, or a read-only file system)")
    unhashed = sorted(rel for rel, meta in manifest.target.files.items() if not meta.get("sha256"))
    if unhashed:  # (the key names the weights by their hashes: two bundles of one size would share it)
        raise ConfigError(f"a prompt cache file needs a bundle whose manifest records its files' sha256, and "
                          f"{unhashed[0]} has none: export the bundle again, or run without --prompt-cache-file")
    key = engine_key(manifest, manifest.target, target.cache, session_options,
                     widths=(target.min_width, target.width_multiple))
    if not read_only:
        remove_stale_temporaries(path)  # (what a write killed midway left)
    from .memory import KeptStoreError

    try:
        _, why = read_file(pc, path, key)  # (StoreError: a file edgespec did not write, left as it is)
    except KeptStoreError as e:  # a newer edgespec's: neither read nor replaced (it was replaced by this version's
        # at close, that edgespec's conversations lost; the memory store keeps such a file too: session 55, a review)
        warnings.warn(f"{e}: it is left as it is, and this engine keeps its conversations in memory only",
                      stacklevel=3)
        return None
    if read_only or kept:  # (a cache made once and shipped on a read-only image: read, never written; session 64)
        warnings.warn(f"the prompt cache {path} is " + ("read" if why is None else f"not read ({why})") +
                      " and will not be saved: " + ("the file is read-only" if kept else f"{parent} takes no new "
                                                    "files (no permission, or a read-only file system)"), stacklevel=3)
        return None
    if why:
        warnings.warn(f"the prompt cache {path} was not read: {why}; this engine replaces it when it closes "
                      f"with conversations to keep", stacklevel=3)
    return path, key, why is None


def _writable_dir(d) -> bool:
    """Whether a file can be made in directory ``d`` (tried: permissions alone say yes to root on a read-only file
    system or on /sys)."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=d, prefix=".edgespec-probe-"):
            return True
    except OSError:
        return False


def _write_prompt_cache(pc, cache, path, key, lock) -> None:
    """At close or exit: the live conversation kept too (unless a generation in another thread is writing
    it: at exit, a daemon thread's), and the file written if anything changed since it was read or
    written; a failure is said, not raised (the replies are already out)."""
    from .prompt_cache import write_file

    with lock.held_if_free() as free:  # (close holds it already)
        try:
            if free:
                pc.save(cache)
            if pc.version != pc.written:
                write_file(pc, path, key)
        except (EdgespecError, MemoryError) as e:
            warnings.warn(str(e) or "out of memory writing the prompt cache", stacklevel=2)


def _a_path(v) -> bool:
    """A str or os.PathLike naming something: "" is taken as the working directory (memory="" wrote the
    replies to ./store.npz, silently)."""
    return isinstance(v, (str, os.PathLike)) and os.fspath(v) not in ("", b"")


def _check_load_args(**kw) -> None:
    """``load``'s arguments of the wrong type are a ``ConfigError`` naming the argument, not a
    ``TypeError`` from deep inside (or a silent truthiness: ``use_drafter="no"`` would mean True)."""
    from .profiles import Profile

    def is_int(v):  # load() made numpy's integers int before (and one past 2**62 is no count of anything here)
        return isinstance(v, int) and not isinstance(v, bool) and v.bit_length() <= 62

    def is_provider(v):  # ("" is refused: it meant "not given", silently)
        return v is None or (isinstance(v, str) and v.strip() != "")

    path = (str, os.PathLike)
    checks = {
        "bundle": (isinstance(kw["bundle"], path), "a path (str or os.PathLike)"),
        "profile": (kw["profile"] is None or isinstance(kw["profile"], (*path, Profile)),
                    "a profile name, a .toml path or a Profile"),
        "provider": (is_provider(kw["provider"]), "a provider name (cpu, cuda, tensorrt) or None"),
        "drafter_provider": (is_provider(kw["drafter_provider"]), "a provider name (cpu, cuda, tensorrt) or None"),
        "max_context": (kw["max_context"] is None or (is_int(kw["max_context"]) and kw["max_context"] > 0),
                        "a positive integer (up to 2**62)"),
        "min_width": (kw["min_width"] is None or (is_int(kw["min_width"]) and kw["min_width"] > 0),
                      "a positive integer (up to 2**62)"),
        "prompt_cache_mb": (kw["prompt_cache_mb"] is None or (is_int(kw["prompt_cache_mb"]) and kw["prompt_cache_mb"] >= 0),
                            "None or a non-negative integer up to 2**62 (MiB; 0: no prompt cache)"),
        "prompt_cache_file": (kw["prompt_cache_file"] is None or _a_path(kw["prompt_cache_file"]),
                              "None or a file's path"),
        "use_drafter": (isinstance(kw["use_drafter"], bool), "True or False"),
        "verify": (isinstance(kw["verify"], bool), "True or False"),
        "model_sampling": (isinstance(kw["model_sampling"], bool), "True or False"),
        "cuda_graphs": (kw["cuda_graphs"] is None or isinstance(kw["cuda_graphs"], bool), "None, True or False"),
        "memory": (kw["memory"] is None or isinstance(kw["memory"], bool) or _a_path(kw["memory"]),
                   "True, False (or None) or a store file's path"),
        "documents": (_a_path(kw["documents"]) or (isinstance(kw["documents"], (list, tuple)) and all(
            _a_path(d) for d in kw["documents"])), "a path or a list of paths"),
    }
    for name, (ok, what) in checks.items():
        if not ok:
            raise ConfigError(f"{name} must be {what}, got {shown(kw[name])}")
    for name in ("bundle", "profile", "prompt_cache_file", "memory", "documents"):  # (the OS refuses them later
        for v in kw[name] if isinstance(kw[name], (list, tuple)) else [kw[name]]:  # with a ValueError)
            if isinstance(v, path) and "\x00" in str(os.fspath(v)):
                raise ConfigError(f"{name}: a path cannot hold a NUL byte, got {os.fspath(v)!r}"[:200])


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _threads(threads) -> int | None:
    """``threads``: None (the profile's), 0 (onnxruntime's default) or 1..this machine's cores."""
    if threads is None:
        return None
    from numbers import Integral

    if not isinstance(threads, Integral) or isinstance(threads, bool) or not 0 <= threads <= _cores():
        raise ConfigError(f"threads must be an integer in 0..{_cores()} (0: onnxruntime's default, one per "
                          f"core; this machine has {_cores()} cores), got {shown(threads)}")
    return int(threads)  # (numpy's integers too, as max_context takes them)


def _texts(inner) -> Iterator[str]:
    """``Engine.stream``'s text deltas from ``stream_ids``' deltas."""
    try:
        for d in inner:
            if d.text:
                yield d.text
    finally:
        inner.close()  # an abandoned stream releases the engine at once, not at garbage collection


def _rendered_strings(message: dict):
    """The strings of a chat message that its template writes into the prompt: its content, its reasoning and its
    tool calls' names and arguments (``Engine.encode``'s size bound counted the content alone: a conversation too
    long by its tool calls' arguments was refused by the template's output limit, not as too long; session 50)."""
    for key in ("content", "reasoning_content"):
        if isinstance(message.get(key), str):
            yield message[key]
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, (list, tuple)) else ():
        f = call.get("function") if isinstance(call, dict) else None
        for key in ("name", "arguments"):
            if isinstance(f, dict) and isinstance(f.get(key), str):
                yield f[key]


class Engine:
    """Text in, text out, over a speculative ``Decoder``. Made by ``edgespec.load``."""

    def __init__(self, manifest: Manifest, tokenizer: Tokenizer, decoder: Decoder, plan, profile, providers,
                 model_sampling: bool = True):
        self.manifest = manifest
        self.tokenizer = tokenizer
        self.decoder = decoder
        self.plan = plan
        self.profile = profile
        self.providers = providers
        # the model's recommended sampling, the defaults of the options a generation leaves out (load's model_sampling)
        self.sampling_defaults = types.MappingProxyType(dict(manifest.sampling_defaults) if model_sampling else {})
        self.defaults = GenerationConfig(drafter=plan.default_drafter, max_draft_tokens=profile.max_draft_tokens,
                                         draft_tokens=profile.draft_tokens, **self.sampling_defaults)
        self._local = threading.local()  # each thread's last generation's stats
        # the token streams made, and the thread that made each (__exit__ closes its thread's)
        self._streams: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._streams_lock = threading.Lock()  # (a server's threads make streams while a with-block ends)
        from .constrain import Grammars

        # structured outputs: llguidance's tokenizer, built from this one at the first request for a format
        from .reasoning import think_tags

        decoder.constraints = Grammars(tokenizer._tok.to_str(), decoder.vocab, manifest.eos_token_ids,
                                       think=think_tags(tokenizer),
                                       text_encode=tokenizer.encode_text_piece,
                                       tokens=tokenizer.vocab_size).constraint
        self._healer = decoder.healer = _LazyHealer(tokenizer, decoder.vocab)
        if "model" not in decoder.drafters:  # why, for the refusal of drafter="model" before any prefill
            if manifest.drafter is None:
                why = "this bundle has no drafter model"
            elif any("drafter" in c for c in plan.cuts):
                why = f"no drafter model is loaded: the memory plan left it out ({'; '.join(plan.cuts)})"
            else:
                why = ("no drafter model is loaded: the engine was opened without it (use_drafter=False, or "
                       "--drafter none/prompt-lookup, or the profile's drafter policy)")
            decoder.unavailable["model"] = why
        if "mtp" not in decoder.drafters:  # (the assistant's drafter: a bundle exported with one, on the CPU)
            decoder.unavailable["mtp"] = (
                "this bundle has no assistant (export a Gemma 4 target with its multi-token-prediction assistant as "
                "--drafter)" if manifest.assistant is None else
                "the bundle's assistant is not loaded: the engine was opened without a drafter model (use_drafter="
                "False, --drafter none/prompt-lookup, or the profile's drafter policy) or its target runs on a GPU "
                "(the assistant drafts on the CPU only for now)")

    @property
    def max_context(self) -> int:
        return self.decoder.target.max_context

    def add_documents(self, paths: Sequence[str | os.PathLike] = (), *, texts: Sequence[str] = ()) -> int:
        """Index text files (``paths``) and strings (``texts``) for the suffix drafter, which then
        drafts quotes of them. Tokenized once; returns the tokens added. ``DocumentError`` for a
        file that is missing, binary, not UTF-8 or too large (nothing is indexed then)."""
        from .suffix import add_documents

        return add_documents(self, paths, texts)

    def memory_stats(self) -> dict:
        """The suffix drafter's store and documents: sequences, tokens, bytes, path."""
        from .suffix import suffix_drafter

        return suffix_drafter(self).stats()

    def clear_memory(self) -> None:
        """Forget (and delete on disk) the earlier outputs the suffix drafter remembers."""
        from .suffix import suffix_drafter

        with self.decoder.held("clear the memory"):
            suffix_drafter(self).clear_memory()

    def reset(self) -> None:
        """Forget the cached conversation and the prompt cache's, and delete the prompt cache file if
        the engine has one (the next prompt is prefilled from scratch). Waits for a generation in another
        thread; refused (``BusyError``) inside one's own unfinished stream."""
        dec = self.decoder
        with dec.held("reset the engine"):  # (the file too: a reset that waited for a close deletes nothing)
            dec.reset_held()
            path = getattr(self, "_prompt_cache_file", None)
            if path is not None:  # forgotten on disk too (written again at close only if conversations follow)
                try:
                    path.unlink(missing_ok=True)
                except OSError as e:
                    warnings.warn(f"cannot delete the prompt cache {path}: {e.strerror or e}", stacklevel=2)
            if getattr(self, "_write_prompt_cache", None) is not None:
                # (another engine's file is left alone: the cleared cache is nothing to write over it)
                pc = dec.target.prompt_cache
                pc.written = pc.version

    def prompt_cache_stats(self) -> dict | None:
        """The prompt cache's entries, tokens, bytes, budget and counters (saves, restores, restored
        tokens, evictions); None where there is none (a GPU target, or a budget of 0)."""
        pc = self.decoder.target.prompt_cache
        return None if pc is None else pc.stats()

    @property
    def last_stats(self) -> Stats | None:
        """The stats of the last generation this thread ran (threads sharing an engine each see
        their own)."""
        return getattr(self._local, "stats", None)

    def config(self, **kw) -> GenerationConfig:
        unknown = set(kw) - _GEN_KEYS - {"stop", "response_format"}
        if unknown:
            raise ConfigError(f"unknown generation option(s): {', '.join(sorted(unknown))}")
        _stops(kw.pop("stop", None))
        if kw.get("drafter") == "none" and kw.get("draft_tokens") is not None:  # (the CLI's rule; session 93)
            raise ConfigError("draft_tokens with drafter 'none': nothing is drafted; give one of them")
        if "response_format" in kw:  # structured outputs: OpenAI's format as an llguidance grammar (constrain.py)
            from .constrain import grammar_for

            kw["grammar"] = grammar_for(kw.pop("response_format"))
        if isinstance(kw.get("prediction"), str):  # predicted output as text: its tokens, special-token text as text
            from .tokenizer import _check_text

            _check_text(kw["prediction"], "the prediction")
            kw["prediction"] = self.tokenizer.encode(kw["prediction"], add_special=False, parse_special=False)
        vals = {k: getattr(self.defaults, k) for k in _GEN_KEYS}
        vals.update({k: v for k, v in kw.items() if v is not None})
        cfg = GenerationConfig(**vals)
        self.decoder.check_drafter(cfg.drafter)  # e.g. no drafter model loaded
        self.decoder.check_ids([t for t, _ in cfg.logit_bias], "logit_bias")
        # (session 64, a review) within the model's rows, an id no token has: the padding rows past the tokenizer's
        # tokens (Qwen2.5's 151,665 of 151,936), which a bias of +100 made the reply ("[PAD151900]" over and over)
        pad = next((t for t, b in cfg.logit_bias if b > 0 and self.tokenizer.is_padding(t)), None)  # (a ban is
        # harmless, and clients ban every id past the tokenizer's so)
        if pad is not None:
            raise ConfigError(f"logit_bias holds token id {pad}, which no token of this model's tokenizer has (a "
                              f"padding row of the model's {self.decoder.vocab})")
        self.decoder.check_prediction(cfg.prediction)
        self.decoder.check_ids(cfg.stop_token_ids, "stop_token_ids")
        return cfg

    @_arguments_checked
    def encode(self, prompt_or_messages: str | Sequence[dict], parse_special: bool = True,
               fit: bool = False, tools=None, suffix: str | None = None, add_generation_prompt: bool = True,
               template_kwargs: dict | None = None) -> list[int]:
        """Prompt ids. A plain prompt's special-token text (``<|im_end|>``) is that token unless
        ``parse_special`` is False; messages' content is always text. With ``fit`` a prompt too long
        for the context by its size alone is refused (``ContextOverflowError``) before it is tokenized.
        ``tools``: a ``tools.ToolRequest`` (``tool_request``), rendered by the chat template, its forced
        start of the reply appended. ``suffix``: the text after the gap a fill-in-the-middle prompt asks
        the model to fill (the plain prompt is the text before it; ``Tokenizer.encode_infill``).
        ``template_kwargs``: more variables for the chat template (``{"enable_thinking": False}`` for Qwen3's;
        messages only)."""
        if isinstance(prompt_or_messages, (list, tuple)) and not prompt_or_messages:
            raise ConfigError("the messages are empty: give at least one {role, content} message")
        for name, v in (("fit", fit), ("add_generation_prompt", add_generation_prompt)):
            if not isinstance(v, (bool, np.bool_)):  # ("no" was taken as true; parse_special's rule)
                raise ConfigError(f"{name} must be true or false, got {shown(v)}")
        if isinstance(prompt_or_messages, str) and tools is not None:
            raise ConfigError("tools need chat messages, not a plain prompt")
        if template_kwargs and not isinstance(prompt_or_messages, (list, tuple)):
            raise ConfigError("chat_template_kwargs need chat messages, not a plain prompt")
        if suffix is not None:
            if not isinstance(prompt_or_messages, str):
                raise ConfigError("a suffix (fill in the middle) needs a plain prompt, the text before the gap, "
                                  "not chat messages")
            self.infill_stops()  # no FIM tokens: refused before tokenizing
        texts = [prompt_or_messages] if isinstance(prompt_or_messages, str) else [
            x for m in prompt_or_messages if isinstance(m, dict) for x in _rendered_strings(m)
        ] if isinstance(prompt_or_messages, (list, tuple)) else []
        if template_kwargs:  # (checked first: an integer too long to write, a list holding itself were a ValueError
            from .template import check_template_kwargs  # here, before the tokenizer's check; session 54)

            template_kwargs = check_template_kwargs(template_kwargs) or None
            texts.append(json.dumps(template_kwargs, ensure_ascii=False))
        if tools is not None and tools.template_tools is not None:  # (tool_choice "none": not rendered)
            texts.append(json.dumps(tools.template_tools, ensure_ascii=False))
        if isinstance(suffix, str):
            texts.append(suffix)
        least = sum(self.tokenizer.min_tokens(t) for t in texts) if fit else 0
        if least > self.max_context:
            raise ContextOverflowError(f"the prompt has at least {least} tokens ({sum(len(t) for t in texts)} "
                                       f"characters); the context holds {self.max_context}")
        if not isinstance(parse_special, (bool, np.bool_)):  # ("no" would be true), as GenerationConfig's ignore_eos
            raise ConfigError(f"parse_special must be true or false, got {shown(parse_special)}")
        if suffix is not None:
            return self.tokenizer.encode_infill(prompt_or_messages, suffix, parse_special)
        if isinstance(prompt_or_messages, str):
            return self.tokenizer.encode(prompt_or_messages, parse_special=parse_special)
        messages = prompt_or_messages
        if isinstance(messages, (list, tuple)) and any(
                isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in messages):
            from .tools import check_tool_messages, template_takes_tools

            if not template_takes_tools(self.manifest.chat_template):
                raise ConfigError("the messages hold tool calls or results, and this bundle's chat template does not "
                                  "take them in the <tool_call> format (Qwen2.5, Hermes)")
            messages = check_tool_messages(messages)
        ids = self.tokenizer.encode_chat(messages, add_generation_prompt,
                                         tools=tools.template_tools if tools is not None else None,
                                         template_kwargs=template_kwargs)
        if tools is not None and tools.prefix:
            ids += self.tokenizer.encode(tools.prefix, add_special=False)
        return ids

    def _get_healer(self):
        return self._healer()

    def heal(self, ids: Sequence[int]) -> tuple[list[int], bytes]:
        """Token healing (healing.py): ``ids`` with the token before the cursor backed off (a plain prompt's
        last token; a fill-in-the-middle prompt's last token of the code before the gap), and its bytes, which
        the reply must spell first (``GenerationConfig.heal``). Nothing heals (``(ids, b"")``) where that
        token is special, the prompt's only token, or part of a character."""
        try:
            if isinstance(ids, (str, bytes)):
                raise TypeError
            ids = [operator.index(t) for t in ids]  # (integers, numpy's too)
        except TypeError:
            raise ConfigError("heal() takes the prompt's token ids (a list of integers): encode a text first") from None
        self.decoder.check_ids(ids, "the prompt")
        f = self.tokenizer.fim()
        split = fim_split(ids, f) if f is not None else None
        pos = split[1] - 1 if split is not None else len(ids) - 1
        if pos < 1 or (split is not None and pos == split[0]):
            return ids, b""
        need = self._get_healer().table[ids[pos]]
        try:
            text = need.decode("utf-8")
        except UnicodeDecodeError:
            return ids, b""
        # the reply's text must begin with exactly these characters, as the reply is decoded: after the prompt's
        # last ids (a SentencePiece token's leading space, which its decoder drops at a text's start, is text there
        # since session 55; decoded alone it was not, and nothing healed on those tokenizers)
        spelled = StreamDecoder(self.tokenizer, self.tokenizer.text_context(ids[:pos])).push([ids[pos]])
        if not need or spelled != text:
            return ids, b""
        return ids[:pos] + ids[pos + 1:], need

    def infill_stops(self) -> tuple[int, ...]:
        """The token ids that end a filled-in middle (``Tokenizer.fim``: end of text, FIM padding, the
        end-of-sequence tokens, ...); ``ConfigError`` where this model has no fill-in-the-middle tokens."""
        return self.tokenizer.require_fim().ends

    def tool_request(self, tools=None, tool_choice=None, parallel_tool_calls: bool = True, *, held: bool = False):
        """Check OpenAI's ``tools``, ``tool_choice`` and ``parallel_tool_calls`` against this bundle's chat
        template (``ConfigError``): a ``tools.ToolRequest``, its grammar planned (``plan``), or None where
        there are no tools. ``held``: the reply is held to a response_format's grammar already, which leaves
        no room for a call (refused where the reply may call)."""
        from .tools import OPEN, tool_request

        req = tool_request(tools, tool_choice, parallel_tool_calls, template=self.manifest.chat_template)
        if req is None or not req.parses:
            return req
        if OPEN in self.tokenizer.special_ids_texts():
            raise ConfigError(f"this bundle's tokenizer has {OPEN} as a special token, which the reply's text "
                              "leaves out: its calls could not be read")
        if held:
            raise ConfigError("response_format cannot be combined with tools the reply may call (its grammar "
                              "leaves no room for a call); send tool_choice 'none' or no response_format")
        req.plan(self.tokenizer)
        return req

    # -- generation ----------------------------------------------------------------------------
    def stream_ids(self, ids: Sequence[int], stop: Sequence[str] = (), **kw) -> Iterator[Delta]:
        """Yield a ``Delta`` (text delta, new token ids, live stats, logprobs) per round; applies stop
        strings. A stop string that
        is a special token's text (``<|endoftext|>``, which the reply's text leaves out) stops at that token;
        a prompt laid out for fill in the middle (``suffix``, or a plain prompt an editor laid out with the
        model's FIM tokens) stops at the tokens that end a middle (``Tokenizer.fim``). A bad option is refused
        by the call itself, not at the first ``next()``; the model runs from the first ``next()``."""
        stop = _stops(stop)
        if not isinstance(ids, (str, bytes)):
            ids = list(ids)  # (an iterator read once)
        if isinstance(ids, (str, bytes)) or not all(isinstance(t, numbers.Integral) and not isinstance(t, bool)
                                                    for t in ids):
            raise ConfigError("stream_ids takes the prompt as token ids (integers); text goes to stream()")
        ids = [int(t) for t in ids]
        self.decoder.check_ids(ids, "the prompt")  # (a negative id would wrap around in the embedding)
        cfg = self.config(**kw)  # (a bad option refused before anything else)
        named, fim_ends = self._stop_ids(ids, stop)
        ends = named | (frozenset() if cfg.ignore_eos else fim_ends)
        if ends:
            cfg = dataclasses.replace(cfg, stop_token_ids=tuple(sorted({*cfg.stop_token_ids, *ends})))
        try:  # token healing: the reply first spells the text backed off the prompt, which is not returned
            healed = cfg.heal.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError("heal must be the bytes of UTF-8 text") from None
        # the decoder's checks (a prompt too long for the context, an empty one, a grammar that does not compile, a
        # prediction too long) made now, by the call (before session 45: at the first next())
        prepared = self.decoder.prepare(ids, cfg)
        # special tokens a stop string names (not the model's own ends): a reply ending there stopped at a stop string
        named -= frozenset() if cfg.ignore_eos else self.decoder.eos
        it = self._deltas(prepared, stop, cfg, healed, named, self.tokenizer.text_context(ids))
        with self._streams_lock:
            self._streams[it] = threading.current_thread()
        return it

    def _deltas(self, prepared: tuple, stop: list[str], cfg: GenerationConfig, skip_text: str,
                named: frozenset = frozenset(), context: tuple = ()) -> Iterator[Delta]:
        """``stream_ids``' generator, once its options are checked (``prepared``: ``Decoder.prepare``'s); the decoder
        is taken at the first ``next()`` (a stream made before ``close`` and read after it is a ``ClosedError``, and
        holds no model), and the thread's ``last_stats`` are its from its first step (a call refused, at the call or
        for a stream this thread holds, leaves the last generation's)."""
        stats = Stats()
        gen = self.decoder.run(prepared, stats)
        stats.healed, stats.text_context = skip_text, context
        skip = len(skip_text)
        dec = StreamDecoder(self.tokenizer, context)  # (the reply's text is what it spells after the prompt's)
        text = ""
        stops = [s for s in stop if s]
        hold = max((len(s) for s in stops), default=1) - 1
        pending = ""
        # with logprobs: each token's entry and the offset of its text in the reply; an entry goes out with
        # the first delta that holds some of its token's text (all at the end), as the ids come back
        want_lp = cfg.logprobs is not None
        entries: list[dict] = []
        sent = 0
        first = True
        stopped_at = False  # the reply ended at a special token a stop string names

        def push(new: str) -> str:  # the text a round decoded, less what healing re-spelled
            nonlocal skip
            if skip:
                cut = min(skip, len(new))
                new, skip = new[cut:], skip - cut
            return new

        try:
            for step in gen:  # (the decoder's lock serializes generations, and refuses one nested in its own stream)
                if first:
                    self._local.stats, first = stats, False
                base = len(dec.ids)
                hit = None
                # token by token where stop strings or logprobs are asked for: a stop is looked for after each
                # token, as plain decoding's one-token rounds look for it, so that a round of several tokens cuts
                # where they cut (nested stops, "ov)hri" and "v)h": the inner one ends first, one token at a time,
                # and the outer one starts first, found in a round that completed both at once); with logprobs,
                # the offset where each token's text starts
                groups = [[t] for t in step.tokens] if (stops or want_lp) else [step.tokens]
                for j, group in enumerate(groups):
                    if want_lp:
                        held = dec.held()
                        at = len(text) + len(pending)
                        new = push(dec.push(group))
                        if held and new.startswith(held):  # (bytes held before it that stayed U+FFFD, no UTF-8:
                            at += len(held)  # its text starts after theirs; its entry went out with theirs before)
                        entries.append(self.logprob_entry(step.logprobs[j], at))
                        pending += new
                    else:
                        pending += push(dec.push(group))
                    if step.finish_reason and j == len(groups) - 1:
                        break  # (the flush below, then the last look for a stop)
                    if stops:
                        hit = _find_stop(text + pending, stops, len(text))
                        if hit is not None:
                            break
                if step.finish_reason and hit is None:
                    pending += push(dec.flush())
                    stats.healed = skip_text[:len(skip_text) - skip]  # (a reply cut before it spelled it all)
                    if stops:
                        hit = _find_stop(text + pending, stops, len(text))
                if stops:
                    if hit is not None:
                        stats.finish_reason = "stop"
                        # (held-back text's ids may be out already; the ids' text begins with what healing re-spelled)
                        kept = self._ids_up_to(dec.ids, hit + len(skip_text), context)
                        yield Delta((text + pending)[len(text):hit], kept[base:], stats,
                                    entries[sent:len(kept)] if want_lp else None)
                        return
                    # hold back a tail that may be the start of a stop string
                    emit = pending[: max(0, len(pending) - hold)] if not step.finish_reason else pending
                else:
                    emit = pending
                pending = pending[len(emit):]
                text += emit
                out = None
                if want_lp:
                    upto = len(entries) if step.finish_reason else sent
                    while upto < len(entries) and entries[upto]["offset"] < len(text):
                        upto += 1
                    out, sent = entries[sent:upto], upto
                ids_out = step.tokens
                if step.finish_reason == "eos" and ids_out and ids_out[-1] in named:
                    # a special token a stop string names (``<|im_start|>``): a stop string's end, left out of the ids
                    # as a stop string's tokens are, and said as 'stop' (it was the model's 'eos', its token kept)
                    ids_out, stopped_at = ids_out[:-1], True
                    if out:
                        out = out[:-1] if out[-1]["token_id"] == step.tokens[-1] else out
                yield Delta(emit, ids_out, stats, out)
            if stopped_at:
                stats.finish_reason = "stop"
        finally:
            gen.close()

    @_arguments_checked
    def score(self, prompt: str | Sequence[int], logprobs: int = 0, parse_special: bool = True) -> tuple[str, list[dict]]:
        """The prompt's own logprobs under the target (a text's log-likelihood; OpenAI's ``echo``): the
        prompt's text as its tokens decode and one entry per token (``logprob_entry``; the first has
        ``logprob`` None and no ``top_logprobs``: nothing comes before it), each with the ``logprobs`` most
        likely tokens at its position. ``prompt``: text (encoded as ``generate`` encodes a plain prompt) or
        token ids. A generation of the same prompt right after it prefills only its last token."""
        if isinstance(prompt, np.ndarray) and prompt.ndim == 1 and prompt.dtype.kind in "iu":  # (as stream_ids)
            prompt = prompt.tolist()
        if isinstance(prompt, str):
            ids = self.encode(prompt, parse_special, fit=True)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, numbers.Integral) and not isinstance(t, bool)
                                                       for t in prompt):
            ids = [int(t) for t in prompt]
        else:
            raise ConfigError(f"the prompt must be text or a list of token ids, got {type(prompt).__name__}")
        lps = self.decoder.score(ids, logprobs)
        dec = self.tokenizer.stream_decoder()
        text, entries = "", []
        for i, t in enumerate(ids):
            e = self.logprob_entry(TokenLogprob(t, 0.0) if i == 0 else lps[i - 1], len(text))
            if i == 0:
                e["logprob"] = None
            entries.append(e)
            text += dec.push([t])
        return text + dec.flush(), entries

    def logprob_entry(self, lp: TokenLogprob, offset: int) -> dict:
        """A token's logprob as the Python API and the server give it: ``token_id``, ``token`` (its text; a
        token that is part of a character: ``bytes:\\xe2\\x80``, OpenAI's spelling), ``bytes`` (its UTF-8 bytes),
        ``logprob``, ``offset`` (where its text starts in the reply) and ``top_logprobs`` (the most likely
        tokens at its position, most likely first: ``token_id``, ``token``, ``bytes``, ``logprob``)."""
        tok = self.tokenizer

        def one(t: int, v: float) -> dict:
            b = tok.token_bytes(t)
            try:
                text = b.decode("utf-8")
            except UnicodeDecodeError:  # part of a character: OpenAI's spelling of its bytes
                text = "bytes:" + "".join(f"\\x{c:02x}" for c in b)
            return {"token_id": t, "token": text, "bytes": list(b), "logprob": v}

        return {**one(lp.token, lp.logprob), "offset": offset, "top_logprobs": [one(t, v) for t, v in lp.top]}

    def _stop_ids(self, ids: Sequence[int], stop: Sequence[str]) -> tuple[frozenset, frozenset]:
        """The token ids a generation after ``ids`` stops at besides the end of sequence: the special tokens
        whose text is a stop string, and the FIM stops after a prompt laid out for fill in the middle (which
        a generation ignoring the end of sequence does not stop at)."""
        named = frozenset()
        if stop:
            specials = self.tokenizer.special_ids_texts()
            named = frozenset(self.tokenizer.token_to_id(t) for t in stop if t in specials)
        f = self.tokenizer.fim()
        fim = frozenset(f.ends) if f is not None and fim_split(ids, f) is not None else frozenset()
        return named, fim

    def returned_ids(self, ids: Sequence[int], text: str, stats: Stats | None) -> list[int]:
        """The ids of a finished reply's ``text``, from every id its stream yielded: after a stop
        string that began in an earlier round, its first tokens were yielded before it was seen."""
        if stats is not None and stats.finish_reason == "stop":
            return self._ids_up_to(ids, len(text) + len(getattr(stats, "healed", "")),
                                   getattr(stats, "text_context", ()))
        return list(ids)

    def _ids_up_to(self, ids: Sequence[int], end: int, context: Sequence[int] = ()) -> list[int]:
        """The shortest head of the reply's ``ids`` whose text (after the prompt's ``context``) reaches character
        ``end``: a stop string's tokens (and what the same round produced after it) are left out of the ids as they
        are of the text. ``stats`` still counts them: they were computed."""
        # from the end: the stop string ends in the last few tokens, so this decodes a few times, not len(ids)
        dec = StreamDecoder(self.tokenizer, context)
        j = len(ids)
        while j > 0 and dec.text_len(ids[:j - 1]) >= end:
            j -= 1
        return list(ids[:j])

    def generate(self, prompt_or_messages: str | Sequence[dict], stop: Sequence[str] = (), *,
                 parse_special: bool = True, tools: Sequence[dict] | None = None, tool_choice=None,
                 parallel_tool_calls: bool = True, suffix: str | None = None, token_healing: bool = False,
                 **kw) -> Result:
        """Generate a reply. Keyword options (one left out: ``self.defaults``, the model's recommended sampling where
        its bundle names one, else greedy decoding): max_new_tokens, temperature, top_k, top_p, min_p, seed,
        drafter (model|prompt-lookup|suffix|prediction|mtp|auto|none), draft_tokens, max_draft_tokens, stop
        (strings), prediction (text or token ids the reply is expected mostly to repeat: drafted from,
        never changing the reply; see prediction.py), parse_special (a plain prompt's special-token text
        is that token; see ``encode``). ``tools``, ``tool_choice``, ``parallel_tool_calls``: OpenAI's
        function calling, for chat templates in the ``<tool_call>`` format (tools.py); the calls come back
        in ``Result.tool_calls`` and ``Result.text`` is the content outside them. ``suffix``: fill in the
        middle (code infilling): the reply is what goes between the prompt and this text, for models
        with FIM tokens (``Tokenizer.fim``; Qwen2.5-Coder, StarCoder, ...; ``ConfigError`` for others).
        ``chat_template_kwargs``: more variables for the chat template (Qwen3's ``enable_thinking``); a thinking
        model's reply keeps its ``<think>`` block in ``text`` (``edgespec.split_reasoning`` takes it apart)."""
        template_kwargs = kw.pop("chat_template_kwargs", None)
        token_healing = bool(token_healing) if isinstance(token_healing, np.bool_) else token_healing
        if not isinstance(token_healing, bool):
            raise ConfigError(f"token_healing must be true or false, got {shown(token_healing)}")
        if suffix is not None or token_healing:
            if tools is not None or tool_choice is not None or parallel_tool_calls is not True:
                raise ConfigError("tools need chat messages, not a fill-in-the-middle prompt" if suffix is not None
                                  else "token healing needs a plain prompt, not tools")
            ids = self._encode_healed(prompt_or_messages, parse_special, suffix, token_healing, kw, template_kwargs)
            return self._collect(self.stream_ids(ids, stop=stop, **kw), ids)
        held = kw.get("grammar") is not None or kw.get("response_format") not in (None, {"type": "text"})
        if tools is not None and kw.get("response_format") is not None:  # a malformed format refused as such first
            from .constrain import grammar_for

            kw["grammar"] = grammar_for(kw.pop("response_format"))  # (as config() makes it: compiled once)
        treq = self.tool_request(tools, tool_choice, parallel_tool_calls, held=held)
        if treq is not None and treq.grammar is not None:  # calls held to a grammar
            kw["grammar"] = treq.grammar
        ids = self.encode(prompt_or_messages, parse_special, fit=True, tools=treq, template_kwargs=template_kwargs)
        if treq is None or not treq.parses:
            return self._collect(self.stream_ids(ids, stop=stop, **kw), ids)
        if kw.get("logprobs") is not None:
            raise ConfigError("logprobs cannot be combined with tools the reply may call (its calls are taken out "
                              "of the text); send tool_choice 'none' or no logprobs")
        tags = self.think_tags()
        result = self._collect(self.stream_ids(ids, stop=_stops(stop) + treq.stops(tags is not None), **kw), ids)
        cut = 0  # a thinking model's block stays as it is: the calls are read from the answer after it
        if tags is not None and not treq.forced:
            from .reasoning import answer_start

            cut = answer_start(result.text, result.reasoning_open)
        answer, calls = treq.parse(result.text[cut:])
        result.text = result.text[:cut] + answer
        result.tool_calls = [c.openai() for c in calls]
        return result

    def _encode_healed(self, prompt, parse_special: bool, suffix: str | None, token_healing, kw: dict,
                       template_kwargs: dict | None = None) -> list[int]:
        """A plain or fill-in-the-middle prompt's ids; with ``token_healing`` the token before the cursor backed
        off and ``kw['heal']`` set to its bytes (``heal``)."""
        token_healing = bool(token_healing) if isinstance(token_healing, np.bool_) else token_healing
        if not isinstance(token_healing, bool):
            raise ConfigError(f"token_healing must be true or false, got {shown(token_healing)}")
        if token_healing and not isinstance(prompt, str):
            raise ConfigError("token healing needs a plain prompt (the text before the cursor), not chat messages")
        ids = self.encode(prompt, parse_special, fit=True, suffix=suffix, template_kwargs=template_kwargs)
        if token_healing:
            ids, kw["heal"] = self.heal(ids)
        return ids

    def stream(self, prompt_or_messages: str | Sequence[dict], stop: Sequence[str] = (), *,
               parse_special: bool = True, suffix: str | None = None, token_healing: bool = False,
               **kw) -> Iterator[str]:
        """Like ``generate`` but yields text deltas as they are decoded (no tools: ``generate`` returns
        their calls; the server streams them). A bad option or a prompt too long is refused by the call
        itself, not at the first ``next()``; the model runs from the first ``next()``."""
        if any(kw.get(k) is not None for k in ("tools", "tool_choice", "parallel_tool_calls")):  # (tools=None: none)
            raise ConfigError("stream() yields text: use generate() for tool calls (edgespec serve streams them)")
        for k in ("tools", "tool_choice", "parallel_tool_calls"):
            kw.pop(k, None)
        template_kwargs = kw.pop("chat_template_kwargs", None)
        ids = self._encode_healed(prompt_or_messages, parse_special, suffix, token_healing, kw, template_kwargs)
        return _texts(self.stream_ids(ids, stop=stop, **kw))

    def _collect(self, it, prompt=None) -> Result:
        """The ``Result`` of a generation's ``Delta``s; ``prompt``: its prompt's ids (or a callable giving them once
        ``it`` has run), which say whether a thinking model's reply began inside its block."""
        parts, ids, stats, lps = [], [], None, None
        for delta, toks, st, lp in it:
            parts.append(delta)
            ids.extend(toks)
            stats = st
            if lp is not None:
                lps = lps if lps is not None else []
                lps.extend(lp)
        ids = self.returned_ids(ids, "".join(parts), stats)
        if lps is not None:  # one entry a returned token (a stop string's tokens are left out of both)
            lps = lps[:len(ids)]
        d = stats.to_dict() if stats else {}
        inside, tags = False, self.think_tags() if prompt is not None else None
        if tags is not None:
            from .reasoning import starts_inside

            inside = starts_inside(prompt() if callable(prompt) else prompt, tags)
        return Result("".join(parts), ids, d, stats.finish_reason if stats else None, logprobs=lps,
                      reasoning_open=inside)

    def think_tags(self) -> tuple[int, int] | None:
        """The ids of ``<think>`` and ``</think>`` where this is a thinking model (reasoning.think_tags), else None."""
        from .reasoning import think_tags

        return think_tags(self.tokenizer)

    @_arguments_checked
    def chat(self, system: str | None = None, template_kwargs: dict | None = None) -> "ChatSession":
        if isinstance(self.decoder, _Closed):  # (a session of a closed engine could never answer)
            raise ClosedError(_CLOSED)
        from .template import check_template_kwargs

        return ChatSession(self, system, template_kwargs=check_template_kwargs(template_kwargs) or None)

    # -- closing -------------------------------------------------------------------------------
    def close(self) -> None:
        """Let go of the models (their onnxruntime sessions, the kernels' weight copies) now, and hand
        the freed memory back to the system; the suffix drafter's memory is written first. Waits for a
        generation in another thread to finish; refused (``BusyError``) inside this thread's own
        unfinished stream. Closing twice does nothing; generating, ``reset``, the memory or the context
        on a closed engine is a ``ClosedError``. ``with edgespec.load(...) as engine:`` closes at the end
        of the block.

        Without it the sessions go when the last reference to the engine does, but the C library's
        allocator keeps much of what they freed: on session 20's machine, the Qwen pair dropped with
        ``del`` left the process at 347-593 MiB, closed at 124-126 MiB (``malloc_trim``), every cycle
        (``scripts/probe_close_memory.py``)."""
        if isinstance(self.decoder, _Closed):
            return
        self._release()
        import gc

        gc.collect()  # (the sessions are gone once _release returns; this takes any cycles with them)
        _trim_heap()

    def _release(self) -> None:
        dec = self.decoder
        with dec.lock.hold("close the engine"):
            write = getattr(self, "_write_prompt_cache", None)
            if write is not None:  # the prompt cache file (load(prompt_cache_file=...)), once
                write()
            for drafter in dec.drafters.values():
                flush = getattr(drafter, "flush", None)
                if flush is not None:  # the suffix drafter: the last generation recorded, the store written
                    flush()
            dec.closed = _CLOSED  # (a stream made before the close and read after it)
            self.decoder = _Closed()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        """The engine closed; a stream this thread left open in the block (a ``break``, an exception, Ctrl-C in its
        loop) is closed first (its generation held the engine: the block's exception became a ``BusyError`` and the
        engine stayed open)."""
        import inspect

        me = threading.current_thread()
        lock = getattr(self.decoder, "lock", None)
        # the stream holding the engine is closed here where this thread made or read it and no other thread is reading
        # it (its last reader this one, or gone); one another thread reads on is waited for, by close(). A stream made
        # by a thread that has ended and read last by one (a pool's task that raised mid-stream, its Future keeping
        # it) is closed too: close() waited for it forever (session 54, a review)
        if lock is not None and lock.streams_left_by(me):
            gone = lock.reader_gone()
            with self._streams_lock:
                streams = [it for it, t in self._streams.items()
                           if t is me or lock.owned_by(me) or (gone and not t.is_alive())]
            for it in streams:
                if inspect.getgeneratorstate(it) == inspect.GEN_SUSPENDED:
                    try:
                        it.close()
                    except ValueError:  # (another thread took it up again this instant: close() waits for it)
                        pass
        self.close()


_CLOSED = "this engine is closed (Engine.close): load the bundle again to generate"


class _LazyHealer:
    """Token healing's index of the vocabulary (``healing.Healer``), built at its first use. Apart from the
    engine: the decoder holds it, and a bound method of the engine there made a reference cycle, which kept a
    dropped engine (its sessions, ~1.7 GB for the Qwen pair) until the garbage collector's next full pass, and
    ran the suffix drafter's last save at whatever point of the program that pass came (before session 45)."""

    def __init__(self, tokenizer: Tokenizer, vocab: int):
        self.tokenizer, self.vocab = tokenizer, vocab
        self.healer = None
        self.lock = threading.Lock()

    def __call__(self):
        with self.lock:
            if self.healer is None:
                from .healing import Healer

                self.healer = Healer.of(self.tokenizer, self.vocab)
            return self.healer


class _Closed:
    """What a closed engine has for a decoder: every use is a ``ClosedError``."""

    def __getattr__(self, name):
        raise ClosedError(_CLOSED)


def _trim_heap() -> None:
    """Give the heap's free memory back to the system where the C library can (glibc's malloc_trim)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows): nothing to do
        pass


def _history(messages, copy: bool = False) -> list:
    """A chat session's history checked: a list (a tuple becomes one; ``copy``: always a new list) of messages,
    each a dict with a role (ConfigError otherwise: a None, a string, a message that was no dict, a role missing
    were an AttributeError, a TypeError or a KeyError at the first turn). Their content is checked as every chat's,
    by ``Engine.encode``."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, (list, tuple)):
        raise ConfigError(f"a chat session's messages must be a list of messages (dicts with a role and a content), "
                          f"got {shown(messages, 100)}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ConfigError(f"a chat session's message {i} must be a dict with a role (a string), got "
                              f"{shown(m, 100)}")
    return list(messages) if copy or not isinstance(messages, list) else messages


@dataclass
class ChatSession:
    """A multi-turn conversation. The KV cache of the conversation so far is reused between turns:
    only the new turn's tokens are prefilled. The oldest turns are dropped when the history no
    longer fits the context (``dropped`` counts them): ``messages`` is what the model sees, ``earlier`` the
    exchanges dropped from it, oldest first (emptied when ``messages`` is given another list: another
    conversation), and ``transcript`` the whole conversation (what the chat's /save writes). One conversation, one thread at a time: the engine may be
    shared by threads, a session's turns from two threads at once interleave its history (a session each)."""

    engine: Engine
    system: str | None = None
    messages: list[dict] = field(default_factory=list)
    dropped: int = 0
    reserve: int = 256  # tokens kept free for the reply
    # more variables for the chat template at every turn (Qwen3's {"enable_thinking": False})
    template_kwargs: dict | None = None
    earlier: list[dict] = field(default_factory=list, init=False, repr=False)  # the exchanges dropped to fit, oldest first

    def __post_init__(self):
        if self.system is not None:  # (a number was taken, and every turn after failed on it)
            from .tokenizer import _check_text

            _check_text(self.system, "the system prompt")
        # a saved history: a list of its own (the caller's list was inserted into and appended to), of messages
        self.messages = _history(self.messages, copy=True)
        if self.system:  # first, before a saved history given with it (it went after that history's last reply)
            head = self.messages[0] if self.messages and isinstance(self.messages[0], dict) else {}
            if head.get("role") != "system":
                self.messages.insert(0, {"role": "system", "content": self.system})
            elif head.get("content") != self.system:
                raise ConfigError("system and the messages' own system message differ: give one of them")

    def __setattr__(self, name, value):
        # another list of messages is another conversation: the exchanges dropped from the old one are not its
        # (a transcript mixed them in; session 55, the diff's review)
        if name == "messages" and value is not self.__dict__.get("messages", value) and self.__dict__.get("earlier"):
            super().__setattr__("earlier", [])
        super().__setattr__(name, value)

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.dropped = 0
        self.earlier = []

    @property
    def transcript(self) -> list[dict]:
        """The whole conversation: the system prompt, the exchanges dropped to fit the context, then the
        messages the model still sees (a new list; since session 55 a chat's /save writes this, where it
        wrote only what the model still saw)."""
        first = 1 if self.messages and self.messages[0].get("role") == "system" else 0
        return self.messages[:first] + list(self.earlier) + self.messages[first:]

    def room(self, max_new: int) -> int:
        """The tokens a turn keeps free for its reply (older exchanges are dropped to keep them)."""
        return min(max_new, self.reserve, self.engine.max_context // 2)

    def _fit(self, max_new: int) -> list[int]:
        """The prompt ids of the history, dropping the oldest exchanges until they fit. On a refusal
        (a message too long on its own) ``_turn`` puts back the history as it was."""
        reserve = self.room(max_new)
        first = 1 if self.messages and self.messages[0].get("role") == "system" else 0
        while True:
            least = sum(self.engine.tokenizer.min_tokens(m["content"]) for m in self.messages
                        if isinstance(m.get("content"), str))
            ids = (self.engine.encode(self.messages, template_kwargs=self.template_kwargs)
                   if least + reserve <= self.engine.max_context else None)
            if ids is not None and len(ids) + reserve <= self.engine.max_context:
                return ids
            if ids is None and len(self.messages) - first <= 1:
                raise ContextOverflowError(f"this message alone has at least {least} tokens; the context "
                                           f"holds {self.engine.max_context}")
            if len(self.messages) - first <= 1:
                raise ContextOverflowError(  # down to the system prompt and this message
                    f"this message alone needs {len(ids)} tokens and {reserve} more for the reply; "
                    f"the context holds {self.engine.max_context}")
            # the oldest exchange: up to the next user message, never the new one (two at a time took the new message
            # with the last reply where a history did not pair up, an assistant's greeting first, and the turn ran
            # on the system prompt alone; session 55, a review)
            last = len(self.messages) - 1
            upto = next((i for i in range(first + 1, last) if self.messages[i].get("role") == "user"), last)
            self.earlier.extend(self.messages[first:upto])
            del self.messages[first:upto]
            self.dropped += 1

    def _turn(self, text: str, stop: Sequence[str], kw: dict) -> Iterator[Delta]:
        """One exchange: add the user's message, yield the engine's ``Delta``s, record the reply."""
        self.messages = _history(self.messages)  # (assigned since: checked as at the start)
        before, dropped_before, earlier_before = list(self.messages), self.dropped, len(self.earlier)
        self.messages.append({"role": "user", "content": text})
        try:
            ids = self._prompt_ids = self._fit(kw.get("max_new_tokens") or self.engine.defaults.max_new_tokens)
        except BaseException:  # ContextOverflowError, or Ctrl-C while encoding: the turn never happened
            self.messages[:], self.dropped = before, dropped_before
            del self.earlier[earlier_before:]
            raise
        reply: list[str] = []
        failed = False
        try:
            for d in self.engine.stream_ids(ids, stop=stop, **kw):
                reply.append(d.text)
                yield d
        except EdgespecError:
            failed = True
            raise
        finally:
            if failed:  # a turn that failed leaves no trace, not even the exchanges dropped to fit it
                self.messages[:], self.dropped = before, dropped_before
                del self.earlier[earlier_before:]
            else:
                # a finished or interrupted reply is kept as far as it got, so the history stays coherent; a thinking
                # model's answer only (its template leaves earlier turns' thinking out of the history, and the
                # block's tags would be text there)
                text = "".join(reply)
                tags = self.engine.think_tags()
                if tags is not None:
                    from .reasoning import split_reasoning, starts_inside

                    text = split_reasoning(text, starts_inside(ids, tags))[1]
                self.messages.append({"role": "assistant", "content": text})

    def stream(self, text: str, stop: Sequence[str] = (), **kw) -> Iterator[str]:
        """Send ``text`` and yield the reply's text deltas. Closing the generator early keeps the
        partial reply in the history and leaves the engine ready for the next turn. A bad option is refused by
        the call itself, as ``Engine.stream`` refuses it (its stop strings too)."""
        from .tokenizer import _check_text

        _check_text(text, "the message")  # (at the call: stream(5) was refused at its first next(), as "message 0")
        self.engine.config(stop=stop, **kw)
        return _texts(self._turn(text, stop, kw))

    def send(self, text: str, stop: Sequence[str] = (), **kw) -> Result:
        from .tokenizer import _check_text

        _check_text(text, "the message")
        self.engine.config(stop=stop, **kw)  # (a bad option refused before the turn: max_new_tokens="5" a TypeError)
        return self.engine._collect(self._turn(text, stop, kw), lambda: self._prompt_ids)


def _stops(stop) -> list[str]:
    """Stop strings: one string or a list of them."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]  # (checked as a list's: one string that is not UTF-8 was taken)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise ConfigError(f"stop must be a string or a list of strings, got {shown(stop)}")
    for s in stop:
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:  # a command-line argument that is not UTF-8, a lone surrogate: never matches
            raise ConfigError(f"stop string {shown(s)} is not valid UTF-8 text") from None
    return list(stop)


def _find_stop(text: str, stops: Sequence[str], start: int) -> int | None:
    best = None
    lo = max(0, start - max(len(s) for s in stops))
    for s in stops:
        i = text.find(s, lo)
        ends = getattr(s, "ends", None)  # a stop string that counts only where it ends something (tools.CallEnd)
        while i != -1 and ends is not None and not ends(text, i):
            i = text.find(s, i + 1)
        if i != -1 and (best is None or i < best):
            best = i
    return best
