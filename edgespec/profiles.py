"""Memory-budget profiles (TOML): loading, checking, listing and resolving them.

A profile says how much memory edgespec may use on a device, which execution providers to try,
and the drafting policy; ``edgespec.planner.plan`` spends its budget on a bundle.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from .errors import ProfileError, ProviderError, parse_reason
from .providers import PROVIDER_NAMES

# The most draft tokens a round may ask for (a request's draft_tokens / max_draft_tokens, a profile's
# max_draft_tokens); drafters.MAX_DRAFT is this (here: profiles are read without numpy).
MAX_DRAFT = 64
# a profile's default drafter (``prediction`` needs a request's text): ``model`` and ``mtp`` load the bundle's model
# drafter or assistant; where it has none (or a GPU runs the target: the assistant is the CPU's), prompt-lookup
PROFILE_DRAFTERS = ("auto", "model", "mtp", "prompt-lookup", "suffix", "none")

MiB = 1 << 20
PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"
_PACKAGED = Path(__file__).resolve().parent / "profiles"
MIN_CONTEXT = 512
_PROFILE_LIMIT = 1 << 20  # bytes


@dataclass(frozen=True)
class Profile:
    name: str
    memory_budget_mb: int  # 0: three quarters of this machine's RAM
    description: str = ""
    source: str = ""
    providers: tuple[str, ...] = ("cpu",)
    provider_options: dict = field(default_factory=dict)
    kv_dtype: str = "auto"
    max_context: int = 4096
    min_context: int = MIN_CONTEXT
    drafter: str = "auto"  # auto | model | mtp | prompt-lookup | suffix | none
    draft_tokens: int | None = None  # fixed k, or None for adaptive
    max_draft_tokens: int = 8
    threads: int = 0  # 0: onnxruntime's default
    prefill_chunk: int = 256
    drafter_provider: str | None = None  # where the drafter model runs (default: the target's providers)
    allow_cpu_fallback: bool = False  # a GPU session may run nodes its provider does not take on the CPU
    # onnxruntime session config entries for every session (add_session_config_entry), e.g.
    # "session.use_device_allocator_for_initializers" = "1" (the GPU run measured no change from it
    # with the profiles' kSameAsRequested arena: docs/gpu.md)
    session_options: dict = field(default_factory=dict)
    # host memory for the prompt cache (edgespec.prompt_cache: earlier sequences' KV rows, restored when a
    # prompt shares their prefix; CPU caches only): None sizes it from the plan (planner.prompt_cache_bytes),
    # 0 keeps none
    prompt_cache_mb: int | None = None

    @property
    def budget_bytes(self) -> int:
        if self.memory_budget_mb:
            return self.memory_budget_mb * MiB
        return int(_physical_memory() * 0.75)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


# The CPU profiles' bound on a draft (the default profile's too; the cost model picks k up to it). On
# session 13's AMX Xeon a verify call of 15 tokens costs 1.75x a one-token call, 24 tokens 2.25x, 31
# 2.82x (docs/bench/width_s13.md; up to 15 rows fill one AMX tile, up to 31 two), and verbatim repeats
# (the suffix drafter's recall, 64-token replies) decoded at 133 / 165 / 185 / 215 tok/s under a bound
# of 8 / 14 / 22 / 30. Until session 13 the default profile kept the dataclass's 8, so every bench
# without --profile ran at 8 (docs/bench/sessions.md, session 13).
CPU_MAX_DRAFT_TOKENS = 30

DEFAULT_PROFILE = Profile(name="default", memory_budget_mb=0, description="this machine, CPU, 3/4 of its RAM",
                          max_draft_tokens=CPU_MAX_DRAFT_TOKENS)


# provider options edgespec itself reads (to fill in or cap from the memory plan): sizes in bytes
_BYTE_OPTIONS = ("gpu_mem_limit", "trt_max_workspace_size")


MAX_MIB = 1 << 30  # a pebibyte
MAX_TOKENS = 1 << 24  # 16M tokens of context (the largest models take 1M)


def _check(name: str, data: dict, where: str) -> Profile:
    known = {f.name for f in fields(Profile)} - {"name"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {', '.join(unknown)}")
    if "memory_budget_mb" not in data:
        raise ProfileError(f"{where}: memory_budget_mb is required")
    vals = dict(data)

    def need(key, ok, what):
        if key in vals and not ok(vals[key]):
            raise ProfileError(f"{where}: {key} = {vals[key]!r} is not {what}")

    is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    # (upper bounds far past any machine or model: a typo'd huge number is refused here, not as an absurd plan)
    need("memory_budget_mb", lambda v: is_int(v) and 0 <= v <= MAX_MIB, f"an integer in 0..{MAX_MIB} (MiB)")
    # (a context of 1 token holds a prompt's token and no reply: a min_context of 1 let the planner cut to it, a plan
    # that ran nothing; session 55, a review)
    for k in ("max_context", "min_context"):
        need(k, lambda v: is_int(v) and 2 <= v <= MAX_TOKENS, f"an integer in 2..{MAX_TOKENS}")
    need("prefill_chunk", lambda v: is_int(v) and 0 < v <= MAX_TOKENS, f"an integer in 1..{MAX_TOKENS}")
    need("max_draft_tokens", lambda v: is_int(v) and 1 <= v <= MAX_DRAFT, f"an integer in 1..{MAX_DRAFT}")
    need("threads", lambda v: is_int(v) and v >= 0, "a non-negative integer")
    need("prompt_cache_mb", lambda v: is_int(v) and 0 <= v <= MAX_MIB,
         f"an integer in 0..{MAX_MIB} (MiB; 0: no prompt cache)")
    need("draft_tokens", lambda v: is_int(v) and 0 <= v <= MAX_DRAFT, f"an integer in 0..{MAX_DRAFT}")
    need("kv_dtype", lambda v: v in ("auto", "float16", "float32", "int8"), "auto, float16, float32 or int8")
    need("drafter", lambda v: v in PROFILE_DRAFTERS, f"{', '.join(PROFILE_DRAFTERS[:-1])} or {PROFILE_DRAFTERS[-1]}")
    need("providers", lambda v: isinstance(v, list) and v and all(p in PROVIDER_NAMES for p in v),
         f"a non-empty list of {', '.join(PROVIDER_NAMES)}")
    need("provider_options", lambda v: isinstance(v, dict) and all(isinstance(x, dict) for x in v.values()),
         "a table of tables")
    for prov, opts in vals.get("provider_options", {}).items():
        if prov not in PROVIDER_NAMES:
            raise ProfileError(f"{where}: provider_options.{prov} is not a provider ({', '.join(PROVIDER_NAMES)})")
        if prov == "cpu" and opts:  # onnxruntime's CPU provider would ignore them silently
            raise ProfileError(f"{where}: provider_options.cpu.{sorted(opts)[0]}: the CPU provider takes no options "
                               "(its thread count is the profile's 'threads')")
        for k, v in opts.items():
            if not isinstance(v, (str, int, float, bool)):
                raise ProfileError(f"{where}: provider_options.{prov}.{k} = {v!r} is not a string, number or boolean")
            if k in _BYTE_OPTIONS and not (is_int(v) and v > 0):
                raise ProfileError(f"{where}: provider_options.{prov}.{k} = {v!r} is not a positive integer (bytes)")
    need("session_options", lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and 0 < len(k) <= 1024 and isinstance(x, (str, int, float, bool)) for k, x in v.items()),
        "a table of onnxruntime session config entries (keys of 1-1024 characters; strings, numbers or booleans)")
    for k in ("description", "source"):
        need(k, lambda v: isinstance(v, str), "a string")
    need("drafter_provider", lambda v: v in PROVIDER_NAMES, f"one of {', '.join(PROVIDER_NAMES)}")
    need("allow_cpu_fallback", lambda v: isinstance(v, bool), "true or false")
    if "providers" in vals:
        vals["providers"] = tuple(vals["providers"])
    if "min_context" not in vals and "max_context" in vals:
        vals["min_context"] = min(MIN_CONTEXT, vals["max_context"])
    if vals.get("min_context", MIN_CONTEXT) > vals.get("max_context", 4096):
        raise ProfileError(f"{where}: min_context ({vals['min_context']}) is larger than max_context "
                           f"({vals.get('max_context', 4096)})")
    return Profile(name=name, **vals)


def load_profile(path: str | os.PathLike) -> Profile:
    p = Path(path)
    try:
        with open(p, "rb") as f:  # bounded: a path to /dev/zero or a huge file is no profile
            raw = f.read(_PROFILE_LIMIT + 1)
        if len(raw) > _PROFILE_LIMIT:
            raise ProfileError(f"{p}: larger than {_PROFILE_LIMIT >> 10} KiB, not a profile")
        data = tomllib.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ProfileError(f"{p}: not valid TOML (nested too deeply)") from None
    except FileNotFoundError:
        raise ProfileError(f"no such profile file: {p}") from None
    except UnicodeDecodeError:
        raise ProfileError(f"{p}: not a text (UTF-8) file") from None
    except OSError as e:  # a directory, no permission, ...
        raise ProfileError(f"cannot read profile {p}: {e.strerror or e}") from None
    except ValueError as e:  # TOMLDecodeError, or an integer of more digits than Python converts
        raise ProfileError(f"{p}: not valid TOML ({parse_reason(e)})") from None
    return _check(p.stem, data, str(p))


def profile_dirs() -> list[Path]:
    return [d for d in (PROFILES_DIR, _PACKAGED) if d.is_dir()]


def list_profiles() -> list[Profile]:
    """The profiles of the profile folders, the first of a name kept; a file that is no profile is left out
    with a warning (one edited wrong must not hide the others, nor answer a mistyped name for them)."""
    import logging

    seen: dict[str, Profile | None] = {}
    for d in profile_dirs():
        for f in sorted(d.glob("*.toml")):
            if f.stem not in seen:
                try:
                    seen[f.stem] = load_profile(f)
                except ProfileError as e:
                    seen[f.stem] = None
                    logging.getLogger("edgespec").warning("left out: %s", e)
    return [p for p in seen.values() if p is not None]


def _short_name(name):
    """A provider's short name (``cuda`` for ``CUDAExecutionProvider``); anything else as it is, for the check."""
    from .providers import short_name

    try:
        return short_name(name)
    except (ProviderError, AttributeError):  # (not a provider: _check names it)
        return name


def resolve_profile(profile: "Profile | str | os.PathLike | None") -> Profile:
    if profile is None:
        return DEFAULT_PROFILE
    if isinstance(profile, Profile):  # (made in Python: checked as a file's values are)
        values = {k: v for k, v in asdict(profile).items() if k != "name" and v is not None}
        if isinstance(values.get("providers"), (list, tuple)):  # (onnxruntime's names too, as choose() takes them)
            values["providers"] = [_short_name(p) for p in values["providers"]]
        if isinstance(values.get("drafter_provider"), str):
            values["drafter_provider"] = _short_name(values["drafter_provider"])
        if values.get("min_context") == MIN_CONTEXT:  # the default floor follows a smaller max_context, as in a file
            del values["min_context"]
        _check(profile.name, values, f"profile {profile.name!r}")
        return profile
    s = str(profile)
    if s.endswith(".toml") or os.sep in s:
        return load_profile(os.path.expanduser(s))  # (~/x.toml: a shell leaves it unexpanded in --profile=~/x.toml)
    for d in profile_dirs():
        f = d / f"{s}.toml"
        if f.is_file():
            return load_profile(f)
    if s == DEFAULT_PROFILE.name:  # (the one without a file, as plan names it: --profile default undoes EDGESPEC_PROFILE)
        return DEFAULT_PROFILE
    names = ", ".join(sorted({f.stem for d in profile_dirs() for f in d.glob("*.toml")} | {DEFAULT_PROFILE.name}))
    raise ProfileError(f"unknown profile {s!r}; known: {names or 'none'} (or give a .toml path)")
