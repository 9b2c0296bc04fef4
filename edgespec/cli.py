"""The ``edgespec`` command line. Library errors become one-line messages and exit codes here only."""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import sys

import click

from .cli_memory import engine_options, load_params, memory, memory_opts, model_wanted
from .cli_placement import drafter_provider_opt, placement_options
from .decoder import MAX_LOGPROBS, GenerationConfig
from .drafters import drafter_choices
from .errors import EdgespecError, ProviderError, parse_reason
from .manifest import sampling_text
from .cli_info import report_lines
from .cli_export import NonEmptyPath
from .providers import PROVIDER_NAMES

MiB = 1 << 20


class Terminated(SystemExit):
    """SIGTERM or SIGHUP (a closed terminal) during a command that holds an engine: raised, so that the engine closes
    as at the end of its input (a prompt cache file written), where the signal's default ended the process at once."""


_HUNG_UP: list[int] = []  # the signal the running command's handler raised Terminated for (_ends_on_hangup)


def raise_if_hung_up() -> None:
    """``Terminated`` again where the handler's was dropped: Python runs a signal handler wherever the main thread is,
    and inside a finalizer (a ``__del__``, a weakref callback) the exception is printed as "Exception ignored in" and
    lost, and the command went on to its end (session 91; the export's twin is edgespec_export.output's). Read at
    each token of a reply in ``generate`` and ``chat`` and before chat's next line, at each window of
    ``perplexity``, before the prefill and at each token of ``plan --measure`` and after each run of ``bench``
    (session 92)."""
    if _HUNG_UP:
        raise Terminated(128 + _HUNG_UP[0])


def _ends_on_hangup(fn):
    """``fn`` (a command) with SIGTERM and SIGHUP raising ``Terminated`` (exit 128 + the signal) while it runs."""
    import functools
    import signal
    import threading

    @functools.wraps(fn)
    def run(*args, **kw):
        sigs = [getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)]
        if threading.current_thread() is not threading.main_thread():
            return fn(*args, **kw)

        def handler(signum, frame):
            _HUNG_UP[:] = [signum]
            raise Terminated(128 + signum)

        old = {}
        for sig in sigs:
            if signal.getsignal(sig) == signal.SIG_DFL:  # (one set already, nohup's SIG_IGN: left as it is)
                old[sig] = signal.signal(sig, handler)
        try:
            return fn(*args, **kw)
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)
            if old:  # (what this command's handler set: the next command's starts clear)
                _HUNG_UP.clear()

    return run


class _Group(click.Group):
    """Every failure of a command as one ``error:`` line on stderr and an exit code: edgespec's
    typed errors (their codes), usage errors (2), Ctrl-C (130), SIGTERM or SIGHUP during an export (143, 129), and
    what the system refuses that a user can act on (a full disk, a read-only or missing directory,
    no permission, a stdout that cannot be written: 1; a closed pipe quietly). Anything else is a
    bug and keeps its traceback; ``EDGESPEC_DEBUG=1`` keeps every traceback."""

    def make_context(self, info_name, args, parent=None, **extra):
        """The top-level --help and --version print while the arguments are parsed, before ``invoke``: a stdout
        that cannot be written (a full disk, a closed pipe) is one line (quiet for the pipe) there too."""
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except OSError as e:
            if os.environ.get("EDGESPEC_DEBUG") or e.errno not in _ACTIONABLE | {errno.EPIPE}:
                raise
            if e.errno != errno.EPIPE:
                try:
                    sys.stderr.write(f"error: cannot write the output: {e.strerror or e}\n")
                except (OSError, ValueError):
                    pass
            try:  # (what stdout still holds would fail again at exit)
                sys.stdout = open(os.devnull, "w")
            except OSError:
                pass
            sys.exit(1)

    def invoke(self, ctx):
        import warnings

        ctx.meta["edgespec.typed"] = [*getattr(ctx, "_protected_args", ()), *ctx.args]  # (for _fail's messages)
        exporting = sys.modules.get("edgespec_export.output")
        if exporting is not None:  # (a command of its own: an earlier one's SIGTERM in this process is not this one's)
            exporting.terminated = False
        shown, stdout = warnings.showwarning, sys.stdout
        warnings.showwarning = _one_line_warning
        sys.stdout = _Stdout(stdout)  # its write errors say they are stdout's
        logger = logging.getLogger("edgespec")
        notices = None if logger.handlers else _LogLine()  # the runtime's notices as warnings are: "warning: ..."
        if notices is not None:
            logger.addHandler(notices)
        try:
            out = super().invoke(ctx)
            sys.stdout.flush()  # a full disk under a redirected stdout is met here, not at exit
            return out
        except EdgespecError as e:
            if code := _sigterm():  # (an export's SIGTERM that a library's code turned into an error edgespec wraps)
                _fail(ctx, "terminated", code)
            from .errors import ProfileError

            if isinstance(e, ProfileError) and "edgespec.profile_env" in ctx.meta:  # (a profile the user did not type)
                _fail(ctx, f"{e} (the profile $EDGESPEC_PROFILE names)", e.exit_code)
            _fail(ctx, str(e), e.exit_code)
        except _NO_ARGS_HELP:
            raise  # `edgespec memory` alone: its help, as click shows it (click before 8.2 exits without an error)
        except click.UsageError as e:
            # (an option's missing value is raised without the subcommand's context: the group's names it)
            path = (e.ctx.command_path.split(" ", 1) if e.ctx is not None
                    else ["", ctx.invoked_subcommand] if ctx.invoked_subcommand else [])
            where = " ".join(["edgespec", *path[1:]])  # under a test runner the group is not named edgespec
            _fail(ctx, f"{e.format_message().splitlines()[0]} (see '{where} --help')", 2)
        except (KeyboardInterrupt, click.exceptions.Abort):
            _fail(ctx, "interrupted", 130)
        except SystemExit as e:
            if type(e).__name__ != "Terminated":  # export's SIGTERM or SIGHUP (edgespec_export.output.Terminated)
                raise
            _fail(ctx, "terminated", e.code if isinstance(e.code, int) else 143)
        except OSError as e:
            if os.environ.get("EDGESPEC_DEBUG"):
                raise
            if code := _sigterm():
                _fail(ctx, "terminated", code)
            if getattr(e, "edgespec_stdout", False):
                if e.errno == errno.EPIPE:  # `edgespec generate ... | head`: the reader has gone
                    _fail(ctx, "", 1, quiet=True)
                _fail(ctx, f"cannot write the output: {e.strerror or e}", 1)
            if not (e.errno in _ACTIONABLE or _is_copy_error(e)):
                raise
            _fail(ctx, _os_message(e), 1)
        except Exception as e:  # a library's own error for a full disk (safetensors, protobuf, ...)
            if os.environ.get("EDGESPEC_DEBUG"):
                raise
            if _interrupted(e):
                # Ctrl-C inside an import: onnxruntime's module made it "ImportError: initialization failed", a
                # traceback (session 54, a review)
                _fail(ctx, "interrupted", 130)
            if code := _sigterm():
                # SIGTERM during an export or a rewrite, its Terminated raised inside numpy's or onnxruntime's code
                # and come out as their error (session 64, a review: two tracebacks in ~30 timed runs)
                _fail(ctx, "terminated", code)
            if isinstance(e, RuntimeError) and str(e).startswith("Symlink loop from "):  # (Path.resolve() before
                # Python 3.13, where a path no check names meets a link that leads back to itself)
                _fail(ctx, f"a symbolic link leads back to itself (a loop): {str(e)[len('Symlink loop from '):]}", 1)
            if "No space left on device" not in str(e):
                raise
            _fail(ctx, f"no space left on device ({type(e).__name__}: {str(e).splitlines()[0][:200]})", 1)
        finally:
            warnings.showwarning = shown
            if notices is not None:
                logger.removeHandler(notices)
            if isinstance(sys.stdout, _Stdout):
                sys.stdout = sys.stdout.stream


def _sigterm() -> int:
    """The exit status of a SIGTERM or SIGHUP that came during this command's export or rewrite (128 + the signal,
    ``edgespec_export.output.terminated`` and ``signum``); 0 where none did."""
    out = sys.modules.get("edgespec_export.output")
    if out is None or not getattr(out, "terminated", False):
        return 0
    return 128 + getattr(out, "signum", 15)


def _interrupted(e: BaseException) -> bool:
    """Whether ``e`` came of a Ctrl-C: a KeyboardInterrupt among its causes and contexts."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


class _Stdout:
    """sys.stdout while a command runs: the same stream, its OSErrors marked ``edgespec_stdout``."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        try:
            return self._open().write(text)
        except OSError as e:
            e.edgespec_stdout = True
            raise
        except UnicodeEncodeError:  # an encoding without the text's characters (PYTHONIOENCODING=latin-1, a
            # Windows redirect's cp1252): they are written as "?", where they were a traceback
            enc = getattr(self.stream, "encoding", None) or "utf-8"
            return self.write(text.encode(enc, "replace").decode(enc))

    def flush(self):
        if self.stream is None:
            return None
        try:
            return self.stream.flush()
        except OSError as e:
            e.edgespec_stdout = True
            raise

    def isatty(self):
        return self.stream is not None and self.stream.isatty()

    def _open(self):
        """The stream; an OSError marked as stdout's where it is closed (`>&-`: Python's sys.stdout is None)."""
        if self.stream is None:
            e = OSError(errno.EBADF, "stdout is closed")
            e.edgespec_stdout = True
            raise e
        return self.stream

    def __getattr__(self, name):
        return getattr(self._open(), name)


_NO_ARGS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())  # (click 8.2 on; before, an Exit)

# what the system refuses that the user can fix: no space or quota, read-only, permissions, I/O, a
# missing or wrong path, an existing file, a cross-device move
_ACTIONABLE = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.ENOENT,
               errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.EXDEV, errno.ENAMETOOLONG, errno.EMFILE, errno.ELOOP}


def _is_copy_error(e: OSError) -> bool:
    import shutil

    return isinstance(e, shutil.Error) and bool(e.args) and isinstance(e.args[0], list) and bool(e.args[0])


class _LogLine(logging.Handler):
    """The ``edgespec`` logger's records (placement notices, a server's errors) on stderr as ``warning: ...`` or
    ``error: ...`` lines, as the warnings are (Python's last-resort handler printed them bare); a server's
    traceback, where one is logged, follows its line."""

    def __init__(self):
        super().__init__(logging.WARNING)

    def emit(self, record):
        try:
            click.echo(f"{record.levelname.lower()}: {self.format(record)}", err=True)
        except Exception:  # noqa: BLE001 -- logging must not raise
            self.handleError(record)


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    """A warning as one ``warning:`` line on stderr, without Python's source location."""
    text = str(message).splitlines()[0] if str(message) else category.__name__
    click.echo(f"warning: {text}", err=True)


def _os_message(e: OSError) -> str:
    if _is_copy_error(e):
        import re

        src, dst, why = e.args[0][0]  # copytree collects one entry per file: the first says why
        m = re.match(r"\[Errno \d+\] ([^:]+)", str(why))
        why, more = m.group(1) if m else why, len(e.args[0]) - 1
        return f"cannot copy {src} to {dst}: {why}" + (f" (and {more} more files)" if more else "")
    what = e.strerror or str(e)
    return f"{what}: {e.filename}" if e.filename is not None else what


_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # (where str.splitlines() breaks a line)


def _escaped_names(ctx, message: str) -> str:
    """``message`` with each name the user gave (an argument, an option's value, an ``EDGESPEC_*`` variable) that
    holds a line break written with the break escaped (``\\n``): the message is one line, its first, and a path such
    as ``$'a\\nb'`` cut there lost the rest of itself (session 93; a library's multi-line text, which some errors
    wrap, still ends at its first line). A name is matched by its parts between slashes that hold a break, as a
    resolved path holds them too."""
    typed = [*ctx.meta.get("edgespec.typed", ()), *(v for k, v in os.environ.items() if k.startswith("EDGESPEC_"))]
    parts = {part for arg in typed for value in str(arg).split("=", 1)[-1:] + [str(arg)]
             for part in re.split(r"[/\\]", value) if any(c in part for c in _BREAKS)}
    for part in sorted(parts, key=len, reverse=True):
        message = message.replace(part, part.translate({ord(c): repr(c)[1:-1] for c in _BREAKS}))
    return message


def _fail(ctx, message: str, code: int, quiet: bool = False):
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # stdout itself is what failed: drop what it still holds, or exit repeats the error
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
    if not quiet:
        try:
            message = _escaped_names(ctx, message)
            click.echo(f"error: {message.splitlines()[0] if message else 'failed'}", err=True)
        except (OSError, ValueError):  # (no stderr to say it on: a terminal closed under a chat, SIGHUP)
            pass
    ctx.exit(code)


@click.group(cls=_Group)
@click.version_option(package_name="edgespec")
def main():
    """edgespec: fast, lossless speculative decoding for quantized LLMs on small machines."""


# -- generate -------------------------------------------------------------------------------
def _engine(bundle, profile, provider, max_context, threads, use_drafter=True, prompt_cache_mb=None):
    from .api import load

    ctx = click.get_current_context(silent=True)
    sampling = {"model_sampling": ctx.meta["edgespec_model_sampling"]} \
        if ctx is not None and "edgespec_model_sampling" in ctx.meta else {}
    return load(bundle, profile=profile, provider=provider, max_context=max_context, threads=threads,
                use_drafter=use_drafter, **engine_options(),  # --documents, --no-memory
                **sampling,  # --no-model-sampling
                **{"prompt_cache_mb": prompt_cache_mb, **prompt_cache_options()},  # --prompt-cache-mb/-file
                **placement_options())  # --drafter-provider


def _profile_source(ctx, param, value):
    """--profile's value; one from $EDGESPEC_PROFILE is marked so, for its error to say where it came from."""
    if value is not None and ctx.get_parameter_source(param.name) == click.core.ParameterSource.ENVIRONMENT:
        ctx.meta["edgespec.profile_env"] = value
    return value


_profile_opt = click.option("--profile", default=None, envvar="EDGESPEC_PROFILE", callback=_profile_source,
                            help="Memory profile name or .toml path (env EDGESPEC_PROFILE).")
_provider_opt = click.option("--provider", type=click.Choice(PROVIDER_NAMES), default=None,
                             help="Execution provider (overrides the profile; an error if it cannot run).")

def _finite_option(ctx, param, value):
    """A float option's value, refused (a usage error) where it is NaN: click's FloatRange lets NaN through."""
    import math

    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"must be a finite number, got {value}", ctx=ctx, param=param)
    return value


def _store_penalty(ctx, param, value):
    ctx.meta.setdefault("edgespec_penalties", {})[param.name] = value
    return value


def _penalty_opts(f):
    """--presence-penalty --frequency-penalty --repetition-penalty --logit-bias ID=BIAS (penalties.py), read
    by ``penalty_options``; shared by generate and chat."""
    for opt in reversed((
        click.option("--presence-penalty", type=float, default=0.0, expose_value=False, callback=_store_penalty,
                     help="Lower the logit of every token the reply holds by this (-2..2)."),
        click.option("--frequency-penalty", type=float, default=0.0, expose_value=False, callback=_store_penalty,
                     help="Lower each token's logit by this times its count in the reply (-2..2)."),
        click.option("--repetition-penalty", type=float, default=None, expose_value=False, callback=_store_penalty,
                     help="Divide the logits of tokens in the prompt or reply by this (multiply where a logit is "
                          "negative; 1 = off; default: the model's recommended, else off)."),
        click.option("--logit-bias", multiple=True, metavar="ID=BIAS", expose_value=False, callback=_store_penalty,
                     help="Add BIAS (-100..100) to token ID's logit (repeatable)."),
    )):
        f = opt(f)
    return f


def penalty_options() -> dict:
    """``GenerationConfig`` keywords from the running command's penalty options (validated: ConfigError)."""
    from .errors import ConfigError

    ctx = click.get_current_context(silent=True)
    p = ctx.meta.get("edgespec_penalties", {}) if ctx is not None else {}
    out = {k: p[k] for k in ("presence_penalty", "frequency_penalty", "repetition_penalty") if p.get(k) is not None}
    bias = []
    for item in p.get("logit_bias") or ():
        tok, _, val = item.partition("=")  # (no "=": val is "", which float refuses)
        try:
            bias.append((int(tok), float(val)))
        except ValueError:
            raise ConfigError(f"--logit-bias takes ID=BIAS (a token id and a number), got {item!r}") from None
    if bias:
        out["logit_bias"] = tuple(bias)
    GenerationConfig(**out)  # refused before the model loads
    return out


_model_sampling_opt = click.option(
    "--model-sampling/--no-model-sampling", default=True, show_default=True, expose_value=False,
    callback=lambda ctx, param, value: ctx.meta.__setitem__("edgespec_model_sampling", value),
    help="Take the sampling options left out from the model's recommendation (its generation_config.json or GGUF "
         "keys, the bundle's sampling_defaults: `edgespec info` shows them); off: none of them (generate and chat: "
         "greedy decoding; serve: OpenAI's temperature 1), no cut, no penalty.")


def _budget_text(n: int) -> str:
    """A prompt cache's budget in bytes as the banner shows it: MiB, or KiB under one (a tiny model's cache; "0 MiB"
    read as no cache at all)."""
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{max(1, round(n / 2**10))} KiB"


def _check_drafted(drafter, draft_tokens) -> None:
    """``--draft-tokens`` beside ``--drafter none`` refused, in generate, chat and serve alike (serve's requests may
    still name both: the server's rule, server.py)."""
    from .errors import ConfigError

    if drafter == "none" and draft_tokens is not None:
        raise ConfigError("--draft-tokens with --drafter none: nothing is drafted; give one of them")


def _check_options(**options) -> None:
    """Refuse a command's generation options (ConfigError) before the model loads; None is an option left out (the
    engine's default, the model's recommendation included). --drafter is a click.Choice; its pairings with
    --draft-tokens, --prediction and --documents are checked by the command."""
    GenerationConfig(**{k: v for k, v in options.items() if v is not None})


def _sampling_opts(f):
    """--temperature --top-k --top-p --min-p --seed --no-model-sampling, shared by generate and chat: the options
    left out are the model's recommended sampling (the bundle's sampling_defaults), else greedy decoding."""
    for opt in reversed((
        click.option("--temperature", type=float, default=None,
                     help="0 is greedy (default: the model's recommended, else 0)."),
        click.option("--top-k", type=int, default=None, help="0 is off (default: the model's recommended, else 0)."),
        click.option("--top-p", type=float, default=None, help="(default: the model's recommended, else 1)"),
        click.option("--min-p", type=float, default=None,
                     help="Keep the tokens at least this many times as likely as the likeliest (after temperature, "
                          "top-k and top-p; 0 is off; default: the model's recommended, else 0)."),
        click.option("--seed", type=int, default=None),
        _model_sampling_opt,
    )):
        f = opt(f)
    return f


def _prompt_cache_opts(f):
    """Adds --prompt-cache-mb and --prompt-cache-file to a command; ``prompt_cache_options()`` reads them
    back for ``load``."""
    wrapper = load_params(f, "prompt_cache_mb", "prompt_cache_file")
    wrapper = click.option(
        "--prompt-cache-file", type=NonEmptyPath(dir_okay=False, what="a file"), default=None,
        help="Keep the prompt cache in this file between runs: read at start (if this bundle, onnxruntime and CPU "
             "wrote it), written at exit. Off by default: it holds the conversations' contents.")(wrapper)
    return click.option(
        "--prompt-cache-mb", type=click.IntRange(min=0), default=None,
        help="Memory for conversations set aside (their KV rows, restored when a prompt continues one; CPU only; "
             "0: none; default: the profile's, else up to four full contexts of what the plan leaves).")(wrapper)


def prompt_cache_options() -> dict:
    """``load`` keywords from the running command's --prompt-cache-mb and --prompt-cache-file."""
    ctx = click.get_current_context(silent=True)
    params = ctx.params if ctx is not None else {}
    return {k: params[k] for k in ("prompt_cache_mb", "prompt_cache_file") if params.get(k) is not None}


def _engine_options(prediction: bool = True):
    """--drafter --draft-tokens --max-context --threads --profile --provider, shared by generate, chat and serve
    (``prediction``: --drafter takes 'prediction', which drafts from a predicted output: generate's --prediction;
    chat and serve have none to give it)."""
    def deco(f):
        return _add_engine_opts(f, [d for d in drafter_choices() if prediction or d != "prediction"])
    return deco


def _add_engine_opts(f, choices):
    for opt in reversed((
        click.option("--drafter", type=click.Choice(choices), default=None,
                     help="Drafting policy (default: the profile's, auto)."),
        click.option("--draft-tokens", type=int, default=None, help="Fixed draft length k (default adaptive)."),
        click.option("--max-context", type=int, default=None),
        click.option("--threads", type=int, default=None),
        _profile_opt,
        _provider_opt,
        drafter_provider_opt,
    )):
        f = opt(f)
    return f


def _thinks(m) -> bool:
    """Whether the bundle's tokenizer has <think> and </think> as tokens of their own that decoding keeps."""
    try:
        from .reasoning import think_tags
        from .tokenizer import Tokenizer

        return think_tags(Tokenizer.of(m)) is not None
    except Exception:  # noqa: BLE001 - info describes a bundle; a tokenizer it cannot read is said elsewhere
        return False


def _template_kwargs(ctx, param, value):
    """--chat-template-kwargs: a JSON object of variables for the chat template, checked before the model loads."""
    if value is None:
        return None
    from .errors import ConfigError
    from .template import check_template_kwargs

    try:
        kw = json.loads(value)
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"--chat-template-kwargs is not JSON: {parse_reason(e)}") from None
    return check_template_kwargs(kw, "--chat-template-kwargs") or None


_template_kwargs_opt = click.option(
    "--chat-template-kwargs", "template_kwargs", default=None, metavar="JSON", callback=_template_kwargs,
    help="Variables for the chat template, a JSON object: '{\"enable_thinking\": false}' turns Qwen3's thinking off.")


@main.command()
@click.argument("bundle", envvar="EDGESPEC_BUNDLE", type=NonEmptyPath())
@click.option("-p", "--prompt", required=True, help="Prompt text ('-' reads stdin).")
@click.option("--chat/--raw", "as_chat", default=False, help="Wrap the prompt in the chat template (default: --raw, the prompt as it is).")
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@_sampling_opts
@_penalty_opts
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@_engine_options()
@_prompt_cache_opts
@memory_opts()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with text, token_ids and stats.")
@click.option("--no-parse-special", is_flag=True,
              help="Read special-token text in a raw prompt (<|im_end|>) as text, not as the token (--chat always does).")
@click.option("--prediction", "prediction_file", type=NonEmptyPath(dir_okay=False, what="a file"), default=None,
              help="A text file the reply is expected mostly to repeat (the file an edit rewrites): drafted from, "
                   "the reply unchanged by it.")
@click.option("--json-schema", "schema_file", type=NonEmptyPath(dir_okay=False, what="a file"), default=None,
              help="Hold the reply to this JSON Schema (a file holding the schema, or a whole response_format "
                   "object of type json_schema; structured outputs, needs llguidance).")
@click.option("--json-object", is_flag=True, help="Hold the reply to a JSON object (structured outputs).")
@click.option("--suffix", default=None,
              help="Fill in the middle: the text after the gap (the prompt is the text before it); for code models "
                   "with FIM tokens (Qwen2.5-Coder, StarCoder, ...).")
@click.option("--token-healing", is_flag=True,
              help="Back off the prompt's last token (with --suffix: the last before the gap) and hold the reply to "
                   "spelling it first: a prompt that ends inside a word or its indentation (an editor's cursor).")
@click.option("--logprobs", type=int, default=None, metavar="N",
              help="With --json: each token's log-probability under the target, with the N most likely tokens "
                   f"at its position (0..{MAX_LOGPROBS}).")
@_template_kwargs_opt
@_ends_on_hangup
def generate(bundle, prompt, as_chat, max_new_tokens, temperature, top_k, top_p, min_p, seed, stop, drafter,
             draft_tokens, max_context, threads, profile, provider, as_json, no_parse_special, prediction_file,
             schema_file, json_object, suffix, logprobs, token_healing, template_kwargs):
    """Generate a continuation of PROMPT with the model in BUNDLE (or, with --suffix, the text between
    PROMPT and the suffix)."""
    from .errors import ConfigError
    from .suffix import read_document

    if suffix is not None and as_chat:
        raise ConfigError("--suffix fills in the middle of a raw prompt: it cannot be used with --chat")
    if token_healing and as_chat:
        raise ConfigError("--token-healing backs off a raw prompt's last token: it cannot be used with --chat")
    if template_kwargs and not as_chat:
        raise ConfigError("--chat-template-kwargs are variables of the chat template: they need --chat")
    if token_healing and (schema_file is not None or json_object):
        raise ConfigError("--token-healing cannot be combined with --json-schema or --json-object")
    if logprobs is not None and not as_json:
        raise ConfigError("--logprobs is printed with --json (one JSON object with the text, the tokens and their "
                          "logprobs)")
    penalties = penalty_options()
    _check_options(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                   seed=seed, draft_tokens=draft_tokens, logprobs=logprobs, **penalties)
    _check_drafted(drafter, draft_tokens)  # (before the model loads)
    if drafter == "prediction" and prediction_file is None:
        raise ConfigError("--drafter prediction drafts from a predicted output: give it with --prediction FILE")
    if drafter == "none" and prediction_file is not None:
        raise ConfigError("--prediction with --drafter none: a prediction is only drafted from; give one of them")
    if drafter not in (None, "auto", "suffix") and click.get_current_context().params.get("documents"):
        raise ConfigError(f"--documents with --drafter {drafter}: documents are drafted from by the suffix drafter "
                          "only (--drafter suffix or auto); give one of them")

    prediction = None if prediction_file is None else read_document(
        prediction_file, what="prediction file", error=ConfigError)  # before the model loads
    response_format = None
    if schema_file is not None and json_object:
        raise ConfigError("--json-schema and --json-object: give one of them")
    if schema_file is not None:
        text = read_document(schema_file, what="JSON schema file", error=ConfigError)
        try:
            schema = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ConfigError(f"the JSON schema file {schema_file} is not JSON: {parse_reason(e)}") from None
        if isinstance(schema, dict) and schema.get("type") == "json_schema":  # a whole response_format (the
            response_format = schema  # README's and OpenAI's shape): no JSON Schema has that type
        elif isinstance(schema, dict) and schema.get("type") == "json_object":
            raise ConfigError(f"{schema_file} holds a json_object response_format: use --json-object for it")
        else:
            response_format = {"type": "json_schema", "json_schema": {"name": "schema", "schema": schema}}
    elif json_object:
        response_format = {"type": "json_object"}
    if response_format is not None:
        from .constrain import grammar_for

        grammar_for(response_format)  # a bad schema refused before the model loads
    if prompt == "-":
        prompt = _read_stdin()
    from .api import _stops
    from .tokenizer import _check_text

    _check_text(prompt, "the prompt")  # (a command line that is not UTF-8, and a bad --stop, before the model loads)
    if suffix is not None:
        _check_text(suffix, "the suffix")
    _stops(list(stop) if stop else None)
    eng = _engine(bundle, profile, provider, max_context, threads, use_drafter=model_wanted(drafter))
    src = [{"role": "user", "content": prompt}] if as_chat else prompt
    kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
              seed=seed, drafter=drafter, draft_tokens=draft_tokens, parse_special=not no_parse_special,
              prediction=prediction, suffix=suffix, logprobs=logprobs, **penalties)
    if token_healing:
        kw["token_healing"] = True
    if template_kwargs:
        kw["chat_template_kwargs"] = template_kwargs
    if response_format is not None:
        kw["response_format"] = response_format
    if as_json:
        r = eng.generate(src, stop=stop, **kw)
        out = {"text": r.text, "token_ids": r.token_ids, "finish_reason": r.finish_reason, "stats": r.stats}
        if r.logprobs is not None:  # (JSON has no infinities: -inf is OpenAI's -9999.0, NaN null)
            from .server_protocol import json_logprob

            out["logprobs"] = [{**e, "logprob": json_logprob(e["logprob"]),
                                "top_logprobs": [{**t, "logprob": json_logprob(t["logprob"])}
                                                 for t in e["top_logprobs"]]} for e in r.logprobs]
        _echo_json(out)
        eng.close()  # (a prompt cache file written now)
        return
    from .chat import terminal_safe

    tty = sys.stdout is not None and sys.stdout.isatty()  # (a reply's escape sequences shown, not acted on, there)
    wrote = False
    try:
        for delta in eng.stream(src, stop=stop, **kw):
            # (color=True: click strips what reads as an ANSI sequence from text that goes to no terminal; a piped
            # reply is the reply as decoded, as --json's text and chat's are: session 99, a mutation test)
            click.echo(terminal_safe(delta) if tty else delta, nl=False, color=True)
            wrote = wrote or bool(delta)
            raise_if_hung_up()
    except BaseException:  # Ctrl-C, SIGTERM, an error mid-reply: the partial reply's line ends before "error: ..."
        if wrote:
            try:
                click.echo()
            except (OSError, ValueError):  # (stdout is what failed)
                pass
        raise
    click.echo()
    st = eng.last_stats
    if st and st.finish_reason == "context":
        click.echo(f"note: the reply stopped because the context ({eng.max_context} tokens) is full", err=True)
    if st:
        click.echo(f"[{st.new_tokens} token{'s' * (st.new_tokens != 1)}, {st.tokens_per_second:.1f} tok/s, prefill {st.prefill_ms:.0f} ms, "
                   f"acceptance {st.acceptance_rate:.2f}, {st.tokens_per_target_call:.2f} tokens/target call]", err=True)
    eng.close()


def _documents_note(drafter, switch: str) -> None:
    """A note (stderr) where --documents stand beside a default drafter that does not read them: ``chat`` and ``serve``
    take them all the same (``switch``: how a turn or a request gets a drafter that does; ``generate`` refuses)."""
    if drafter not in (None, "auto", "suffix") and click.get_current_context().params.get("documents"):
        click.echo(f"note: --documents are drafted from by the suffix drafter only; --drafter {drafter} does not read "
                   f"them ({switch} does)", err=True)


STDIN_LIMIT = 64 << 20  # bytes of a prompt read from stdin


def _read_stdin(what: str = "prompt") -> str:
    """The ``what`` piped in (a prompt; perplexity's text, its file ``-``): UTF-8 text of at most STDIN_LIMIT bytes."""
    from .errors import ConfigError, ContextOverflowError

    if sys.stdin is None:  # (`<&-`)
        raise ConfigError(f"no {what} on stdin: it is closed")
    data = sys.stdin.buffer.read(STDIN_LIMIT + 1)
    if len(data) > STDIN_LIMIT:
        raise ContextOverflowError(f"the {what} on stdin is larger than {STDIN_LIMIT >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"the {what} on stdin is not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})") \
            from None


def _isatty(stream) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):  # (a closed stream)
        return False


@main.command("perplexity")
@click.argument("bundle", type=NonEmptyPath())  # (no EDGESPEC_BUNDLE: FILES follow it, a file would be taken for it)
@click.argument("files", nargs=-1, required=True, type=NonEmptyPath(what="a file"))
@click.option("--window", type=int, default=None,
              help="Tokens a window; the second half of each is scored (llama-perplexity's rule). [default: 512, or "
                   "the context where that is smaller]")
@click.option("--max-windows", type=int, default=None, help="Score at most this many windows.")
@click.option("--max-context", type=int, default=None)
@click.option("--threads", type=int, default=None)
@_profile_opt
@_provider_opt
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_ends_on_hangup
def perplexity_cmd(bundle, files, window, max_windows, max_context, threads, profile, provider, as_json):
    """The target's perplexity on the text of FILES (UTF-8, joined by blank lines): how well the quantized
    model predicts it, to compare exports."""
    from . import errors
    from .api import load
    from .errors import ConfigError
    from .perplexity import MIN_WINDOW, perplexity
    from .suffix import read_document

    given = window is not None
    if not given:  # llama-perplexity's 512, within a smaller context (a small bundle's, --max-context's)
        window = 512 if max_context is None or max_context <= 0 else max(MIN_WINDOW, min(512, max_context))
    if window < MIN_WINDOW:  # checked before the model loads, as the files are
        raise ConfigError(f"--window must be >= {MIN_WINDOW} tokens, got {window}")
    if window.bit_length() > 62:  # (load() named max_context, which the window stands for there)
        raise ConfigError(f"--window {errors.shown(window)} is no context: give one of at most the bundle's context")
    if max_windows is not None and max_windows < 1:
        raise ConfigError(f"--max-windows must be >= 1, got {max_windows}")
    if max_context is not None and 0 < max_context < window:  # (perplexity's own words, before the model loads)
        raise ConfigError(f"the window ({window} tokens) is larger than the context ({max_context}); pass "
                          + (f"--window {max_context} or less, or " if max_context >= MIN_WINDOW else "")
                          + f"a --max-context of at least {window}")
    if sum(f == "-" for f in files) > 1:
        raise ConfigError("'-' (the standard input) is named more than once")
    text = "\n\n".join(_read_stdin("text") if f == "-" else read_document(f, what="text file", error=ConfigError)
                         for f in files)
    import warnings

    with warnings.catch_warnings():  # (a bundle whose context is below the window: said below, as one error)
        if max_context is None:
            warnings.filterwarnings("ignore", message="asked for a context of")
        eng = load(bundle, profile=profile, provider=provider, max_context=window if max_context is None
                   else max_context, threads=threads, use_drafter=False, memory=False, prompt_cache_mb=0)
    if not given and eng.max_context < window and eng.max_context >= MIN_WINDOW:
        window = eng.max_context  # (the default window, within the context the bundle runs with here)
    if max_context is None and eng.max_context < window:
        ctx_tokens = eng.max_context
        eng.close()
        raise ConfigError(f"--window {window} is larger than the context this bundle runs with here ({ctx_tokens} tokens); "
                          f"give --window {ctx_tokens} or less")
    ids = eng.tokenizer.encode(text, parse_special=False)

    shown = []

    live = _isatty(sys.stderr)  # (a log gets a line a window's tenth, not one line of \r-joined figures)

    def progress(done, total, ppl):
        raise_if_hung_up()  # (a window a second or more: a long text's run of minutes ends at the next one)
        if as_json:
            return
        if live:
            click.echo(f"\r[{done}/{total}] perplexity {ppl:.4f}", nl=False, err=True)
            shown[:] = [True]
        elif done == total or done % -(-total // 10) == 0:
            click.echo(f"[{done}/{total}] perplexity {ppl:.4f}", err=True)

    try:
        r = perplexity(eng, ids, window, max_windows, progress)
    finally:
        if shown:  # the progress line ended, so that what follows (an error, Ctrl-C's) starts a line of its own
            click.echo("", err=True)
    if as_json:
        _echo_json({"bundle": str(bundle), **r.to_dict()})  # (a broken export's inf perplexity: null, not Infinity)
    else:
        click.echo(f"perplexity {r.perplexity:.4f} over {r.tokens} tokens ({r.windows} window{'s' * (r.windows != 1)} of {r.window}, "
                   f"the second half of each scored; the text has {r.text_tokens} tokens), "
                   f"{r.seconds:.1f} s ({r.tokens_per_second:.0f} tokens/s read)")
    eng.close()


# -- chat -----------------------------------------------------------------------------------
@main.command()
@click.argument("bundle", envvar="EDGESPEC_BUNDLE", type=NonEmptyPath())
@click.option("--system", default=None, help="System prompt.")
@click.option("--max-new-tokens", type=int, default=512, show_default=True, help="Longest reply.")
@_sampling_opts
@_penalty_opts
@_engine_options(prediction=False)
@_prompt_cache_opts
@memory_opts()
@click.option("--stats", "show_stats", is_flag=True, help="Print statistics after each reply (stderr).")
@_template_kwargs_opt
@click.pass_context
@_ends_on_hangup
def chat(ctx, bundle, system, max_new_tokens, temperature, top_k, top_p, min_p, seed, drafter, draft_tokens,
         max_context, threads, profile, provider, show_stats, template_kwargs):
    """Chat with the model in BUNDLE (its chat template; /help lists the commands, Ctrl-D leaves).

    Replies stream as they are decoded; Ctrl-C stops a reply and keeps the conversation. The
    conversation's KV cache is reused between turns. Piped input is read line by line (a line of at
    most 64 MiB; a longer one is refused and skipped); piped input that met an error exits 1.
    """
    from .chat import run_chat

    _check_drafted(drafter, draft_tokens)  # (before the model loads)
    _documents_note(drafter, "/set drafter suffix or auto")
    penalties = penalty_options()
    _check_options(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                   seed=seed, draft_tokens=draft_tokens, **penalties)
    eng = _engine(bundle, profile, provider, max_context, threads, use_drafter=model_wanted(drafter))
    options = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                   seed=seed, drafter=drafter, draft_tokens=draft_tokens, **penalties)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="replace")  # a terminal that cannot show a character gets '?'
    if hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="surrogateescape")  # a line that is not UTF-8 is refused, not fatal
    try:
        code = run_chat(eng, system=system, options=options, show_stats=show_stats, line_limit=STDIN_LIMIT,
                        template_kwargs=template_kwargs, between=raise_if_hung_up)
    finally:
        eng.close()  # (a prompt cache file written now, its warnings as every other)
    ctx.exit(code)


# -- serve ----------------------------------------------------------------------------------
class _OneLineUsage(click.Command):
    """Usage errors (a bad number, an unknown option) as one ``error:`` line, like every other error."""

    def make_context(self, info_name, args, parent=None, **extra):
        from .errors import ConfigError

        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as e:
            raise ConfigError(f"{e.format_message()} (see 'edgespec {info_name} --help')") from None


def _loaded(load):
    """The engine ``serve`` loads on its device thread (a future). A Ctrl-C while it loads ends the process at once
    with the one line (exit 130), not through the interpreter's exit: that, under a thread still inside onnxruntime's
    session construction, can abort ("terminate called without an active exception", exit 134; a review of session
    75, seen with a scratch script; a GPU's load takes seconds). The wait is timed, a tenth of a second at a time:
    a wait without a timeout is one lock acquire, which a signal handled on another thread does not end: a SIGINT to
    the loading thread left the main one asleep until the load ended (session 77, tested with ``pthread_kill``)."""
    try:
        while True:
            try:
                return load.result(timeout=0.1)
            except TimeoutError:  # (concurrent.futures' is this one)
                if load.done():  # (the load's own TimeoutError)
                    raise
    except KeyboardInterrupt:
        if load.done():
            raise
        try:
            click.echo("error: interrupted", err=True)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os._exit(130)


@main.command(cls=_OneLineUsage)
@click.argument("bundle", envvar="EDGESPEC_BUNDLE", type=NonEmptyPath())
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; any other than 127.0.0.1/::1 exposes the server beyond this machine.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port (0 picks a free one; the address is printed once the server listens).")
@click.option("--queue", "queue_size", type=click.IntRange(min=0), default=16, show_default=True,
              help="Requests that may wait while one generates; more are refused with 429.")
@click.option("--temperature", type=click.FloatRange(0, 2), default=None, callback=_finite_option,
              help="For requests that send none (default: the model's recommended, else OpenAI's 1); 0 makes greedy "
                   "decoding the default.")
@click.option("--top-p", type=float, default=None, help="For requests that send none (default: the model's "
              "recommended, else 1); likewise --top-k (0: off), --min-p (0: off), --repetition-penalty (1: off).")
@click.option("--top-k", type=int, default=None)
@click.option("--min-p", type=float, default=None)
@click.option("--repetition-penalty", type=float, default=None)
@_model_sampling_opt
@click.option("--allow-origin", "allow_origins", multiple=True, metavar="ORIGIN",
              help="An origin (http://localhost:3000, chrome-extension://ID, tauri://localhost, null) whose pages "
                   "may call the server from a browser or webview (CORS; others sending an Origin get 403); repeat "
                   "for more, '*' for any. Default: none.")
@click.option("--api-key", envvar="EDGESPEC_API_KEY", default=None, show_envvar=True,
              help="Require this key as 'Authorization: Bearer KEY' (an OpenAI client's api_key) on every request "
                   "but /health; others get 401. Prefer the environment variable or --api-key-file: a command "
                   "line is visible to every user of the machine.")
@click.option("--api-key-file", type=NonEmptyPath(dir_okay=False, what="a file"), default=None,
              help="Read the API key from this file's first line.")
@click.option("--reasoning-format", type=click.Choice(["auto", "none"]), default="auto", show_default=True,
              help="auto: a thinking model's <think> block (Qwen3, DeepSeek-R1's distills) comes apart from the answer, "
                   "as reasoning_content (chat) or a reasoning item (responses); none: left in the text.")
@_template_kwargs_opt
@_prompt_cache_opts
@_engine_options(prediction=False)
@memory_opts()
def serve(bundle, host, port, queue_size, temperature, top_p, top_k, min_p, repetition_penalty, allow_origins, api_key,
          api_key_file, drafter, draft_tokens, max_context, threads, profile, provider, reasoning_format,
          template_kwargs):
    """Serve BUNDLE over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/responses, /v1/completions,
    /v1/models, /health, /metrics). One generation runs at a time; the others wait in a queue.
    --drafter, --draft-tokens and the sampling options are the defaults a request can override. The suffix
    drafter remembers every reply on disk to draft from for later requests (--no-memory: nothing is kept)."""
    from pathlib import Path

    from .errors import ConfigError

    try:
        from .server import bind, create_app, run
    except ImportError as e:
        raise EdgespecError(f"the server is not installed ({e.name} is missing): pip install starlette uvicorn "
                            "llguidance (the serve extra: pip install '.[serve]' in edgespec's checkout)")
    from .server import check_api_key, check_origins

    check_origins(allow_origins)  # (before the port and the model)
    _check_drafted(drafter, draft_tokens)  # (before the model loads)
    sampling = {k: v for k, v in (("top_p", top_p), ("top_k", top_k), ("min_p", min_p),
                                  ("repetition_penalty", repetition_penalty)) if v is not None}
    # (the temperature too: click's range takes 5e-7, which no request that leaves its temperature out is sampled at)
    _check_options(draft_tokens=draft_tokens, temperature=temperature, **sampling)
    _documents_note(drafter, "a request's drafter suffix or auto")
    if api_key_file is not None:
        if api_key is not None:
            raise ConfigError("--api-key (or EDGESPEC_API_KEY) and --api-key-file: give one of them")
        from .suffix import read_document

        lines = read_document(api_key_file, max_bytes=4096, what="API key file", error=ConfigError).splitlines()
        api_key = lines[0].strip() if lines else ""
    check_api_key(api_key)
    sock = bind(host, port)  # a busy port or an unknown host is refused before the model loads
    from .device_thread import DeviceThread

    # the engine loads, and every generation runs, on this one thread: onnxruntime's CUDA EP keeps a context per
    # calling thread (its handles, the CUDA graphs captured at load), built again for every new thread
    device = DeviceThread()
    ctx = click.get_current_context()

    def load_on_device():
        with ctx.scope(cleanup=False):  # (click's context is per thread: --no-memory, --prompt-cache-file... are in it)
            return _engine(bundle, profile, provider, max_context, threads, use_drafter=model_wanted(drafter))

    eng = None
    try:
        eng = _loaded(device.submit(load_on_device))
        eng.config(drafter=drafter, draft_tokens=draft_tokens)  # bad defaults now, not on every request
        model_id = Path(bundle).resolve().name
        app = create_app(eng, model_id, queue_size=queue_size, drafter=drafter, draft_tokens=draft_tokens,
                         temperature="model" if temperature is None else temperature, sampling=sampling,
                         allow_origins=allow_origins, api_key=api_key, chat_template_kwargs=template_kwargs,
                         reasoning_format=reasoning_format, device=device)
        temperature = app.state.server.defaults.get("temperature", eng.defaults.temperature)
        mem = eng.memory_stats().get("memory_path")
        pcs, pc_file = eng.prompt_cache_stats(), prompt_cache_options().get("prompt_cache_file")
        kept = f" ({pcs['entries']} kept from {pc_file})" if pcs and pc_file else ""
        run(app, sock, banner=f"(model '{model_id}', context {eng.max_context} tokens, one generation at a "
                              f"time, up to {queue_size} waiting; default temperature {temperature:g}"
                              + (f", {sampling_text(sampling)}" if sampling else "") + "; "
                              + (f"the model's recommended sampling {sampling_text(eng.sampling_defaults)} "
                                 "(--no-model-sampling for none); " if eng.sampling_defaults else "")
                              + (f"prompt cache {_budget_text(pcs['budget'])}{kept}; " if pcs else "no prompt cache; ")
                              + (f"replies remembered for drafting in {mem}, --no-memory to keep none" if mem
                                 else "no memory of replies")
                              + (f"; browser pages of {', '.join(allow_origins)} may call it" if allow_origins
                                 else "")
                              + ("; an API key required)" if api_key is not None else ")"))
    except BaseException:  # (closing must not hide why the server stopped)
        sock.close()
        device.close(timeout=0)
        if eng is not None:
            try:
                eng.close()
            except Exception as e:  # noqa: BLE001 - the original error is the one to report
                click.echo(f"warning: closing the engine failed too: {e}", err=True)
        raise
    sock.close()
    device.close(timeout=0)
    eng.close()  # the suffix drafter's memory and the prompt cache file written


# -- profiles and plan ----------------------------------------------------------------------
def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for r in [header, *rows]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])


def _echo_json(obj, **kw) -> None:
    """``obj`` as JSON on stdout: its characters as they are where stdout is UTF-8, else as \\u escapes (a
    cp1252 redirect made the ones it lacks '?', silently: JSON that read back as other text)."""
    enc = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    # (a float JSON cannot hold, a broken export's perplexity of inf, is null: json.dumps wrote Infinity and NaN,
    # which JSON parsers refuse)
    click.echo(json.dumps(_finite(obj), ensure_ascii=enc not in ("utf8", "utf8sig"), allow_nan=False, **kw))


def _finite(obj):
    """``obj`` with its non-finite floats (inf, nan) as None, for JSON."""
    import math

    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


@main.command()
@click.option("--json", "as_json", is_flag=True)
def profiles(as_json):
    """List the memory profiles: budget, providers, context and drafting policy."""
    from .profiles import list_profiles

    profs = list_profiles()
    if as_json:
        _echo_json([{"name": p.name, "memory_budget_mb": p.memory_budget_mb, "providers": list(p.providers),
                     "max_context": p.max_context, "drafter": p.drafter, "description": p.description,
                     "source": p.source} for p in profs], indent=1)
        return
    _table(("name", "budget", "providers", "max context", "drafter", "description"),
           [(p.name, f"{p.memory_budget_mb} MiB" if p.memory_budget_mb else "3/4 of RAM", ",".join(p.providers),
             str(p.max_context), p.drafter, p.description) for p in profs])
    click.echo("without --profile: this machine, CPU, 3/4 of its RAM. Budgets are estimates: "
               "check one with 'edgespec plan BUNDLE --profile NAME --measure'.", err=True)


@main.command("plan", cls=_OneLineUsage)
@click.argument("bundle", envvar="EDGESPEC_BUNDLE", type=NonEmptyPath())
@_profile_opt
@click.option("--max-context", type=int, default=None, help="Context to plan for (default: the profile's).")
@_provider_opt
@click.option("--no-drafter", is_flag=True, help="Plan without the drafter model.")
@click.option("--measure", is_flag=True,
              help="Also load the engine, fill the planned context (prefill, then decode 32) and print the "
                   "measured peak memory against the plan.")
@click.option("--measure-tokens", type=click.IntRange(min=1), default=None,
              help="With --measure: prefill this many tokens instead of filling the context.")
@click.option("--json", "as_json", is_flag=True)
@drafter_provider_opt
@_ends_on_hangup
def plan_cmd(bundle, profile, max_context, provider, no_drafter, measure, measure_tokens, as_json):
    """Show how a profile's memory budget is spent on BUNDLE, or why it does not fit."""
    from .manifest import load_manifest
    from .planner import plan
    from .profiles import resolve_profile

    if measure_tokens is not None and not measure:
        from .errors import ConfigError

        raise ConfigError("--measure-tokens sizes --measure's prompt: give --measure too")
    prof = resolve_profile(profile)
    m = load_manifest(bundle)
    from .placement import requested_providers

    dprov = placement_options().get("drafter_provider")
    # (with --measure the plan is this machine's, the one load() measures; without, the profile's device's, which
    # may be another machine's: said where this onnxruntime lacks its providers)
    # (with --measure, the load below says what this onnxruntime lacks: it was said twice)
    tprov, dprovs, _ = requested_providers(m, prof, provider, dprov, use_drafter=not no_drafter, here=measure,
                                           warn=not measure)
    p = plan(m, prof, max_context=max_context, use_drafter=not no_drafter, providers=tprov, drafter_providers=dprovs,
             keep_drafter=bool(dprov) and not no_drafter)
    if not measure:  # (after the plan: a refused one's error was its second line; session 57, a review)
        from .providers import available_providers, canonical

        drafting = m.drafter is not None and not no_drafter  # (a drafter's providers count where there is one)
        lacks = sorted({x for x in tprov + (dprovs if drafting else []) if canonical(x) not in available_providers()})
        if lacks:
            click.echo(f"note: this onnxruntime lacks {', '.join(lacks)}: the plan is for a machine that has it "
                       "(loaded here, the bundle runs on the CPU, with the CPU's plan)", err=True)
    samples = None
    if measure:
        from .measure import measure as measure_engine, prompt_length

        n, room = prompt_length(p.context, measure_tokens), prompt_length(p.context)
        decoded = min(32, p.context - n)  # (a context under 34 tokens holds fewer)
        what = (f"{n} tokens" + (f" (of {measure_tokens} asked: the context holds {room} beside the decoded ones)"
                                 if measure_tokens > n else "") if measure_tokens
                else f"the context ({p.context} tokens: {room} prefilled, {decoded} decoded)")
        click.echo(f"measuring: loading, prefilling {what}, decoding {decoded} ...", err=True)
        measured, samples = measure_engine(bundle, prompt_tokens=measure_tokens, profile=prof, provider=provider,
                                           max_context=max_context, use_drafter=not no_drafter,
                                           between=raise_if_hung_up, **placement_options())
        measured.close()  # (its figures are taken; it was left to the process's exit)
    if as_json:
        out = {"bundle": str(m.root), "profile": prof.name, "plan": p.to_dict()}
        if samples is not None:
            out["measured"] = [s.to_dict() for s in samples]
        _echo_json(out, indent=1)
        return
    click.echo(f"plan for {m.root} with profile {prof.name} (budget {p.budget / MiB:.0f} MiB)")
    for label, n in p.rows():
        click.echo(f"  {label:<52} {n / MiB:>9.1f} MiB")
    click.echo(f"  {'total':<52} {p.total / MiB:>9.1f} MiB  of {p.budget / MiB:.0f} MiB "
               f"({100 * p.total / p.budget:.0f}%)")
    gpu = p.devices.get("target") not in (None, "cpu")  # (0.0 MiB said no more: session 57, a review)
    click.echo(f"  {'prompt cache (at most; out of what is left)':<52} {p.prompt_cache / MiB:>9.1f} MiB"
               + ("  (none: it keeps CPU caches, the target's are on the GPU)" if gpu and not p.prompt_cache else ""))
    loaded = "none in this bundle" if m.drafter is None else ("loaded" if p.drafter == "model" else "not loaded")
    mtp = ("" if m.assistant is None else "; assistant (mtp): " + ("loaded" if "assistant" in p.weights else
                                                                   "not loaded (no drafter model asked for, or a target on a GPU: it drafts on the CPU only for now)"))
    click.echo(f"context {p.context} tokens; drafter model: {loaded}{mtp}; default drafting: {p.default_drafter}; "
               f"prefill chunk: {p.prefill_chunk} tokens")
    click.echo(f"weights: {p.weights_basis}")
    if len(set(p.devices.values())) > 1:
        click.echo("placement: " + ", ".join(f"{role} on the {dev.upper()}" for role, dev in p.devices.items()))
    click.echo("cut: " + ("; ".join(p.cuts) if p.cuts else "nothing"))
    for w in p.warnings:
        click.echo(f"warning: {w}")
    if samples:
        def mib(x):
            return f"{x / MiB:.1f} MiB" if x is not None else "-"

        click.echo("measured (this process; peak figures are high-water marks):")
        _table(("  stage", "peak RSS", "VmHWM", "RSS now", "GPU"),
               [(f"  {s.stage}", mib(s.peak_rss), mib(s.vm_hwm), mib(s.rss),
                 mib(s.gpu) + (f" ({s.gpu_scope})" if s.gpu_scope else "")) for s in samples])
        peak = max(s.vm_hwm or s.peak_rss for s in samples)
        click.echo(f"planned total {p.total / MiB:.1f} MiB; measured peak resident {peak / MiB:.1f} MiB "
                   f"({100 * peak / p.total:.0f}% of the plan)")
        if any(s.gpu is not None for s in samples):
            click.echo("note: on a discrete GPU the weights and KV caches sit in GPU memory, not in the resident set")


# -- info -----------------------------------------------------------------------------------
@main.command()
@click.argument("bundle", type=NonEmptyPath())
@click.option("--verify", is_flag=True, help="Hash every file against the manifest and open the models as generate "
              "does (a graph whose names or layers are not the manifest's is an error).")
@click.option("--json", "as_json", is_flag=True)
def info(bundle, verify, as_json):
    """Describe a bundle: models, precisions, sizes, validation and quality figures."""
    from .manifest import SCHEMA_VERSION, load_manifest

    m = load_manifest(bundle, deep=verify)
    if verify:  # (the manifest alone read: a graph that does not match it passed --verify, exit 0; session 57)
        from .api import load as load_engine

        load_engine(bundle, memory=False, prompt_cache_mb=0).close()
    if as_json:
        _echo_json(m.to_dict(), indent=1)
        return
    files = [meta for spec in m.models() for meta in spec.files.values()] + \
        list(m.tokenizer_files.values())
    unhashed = sum(1 for meta in files if not meta.get("sha256"))
    checked = ("sizes checked; weights hashed when changed since last verified" if not verify else
               "every file's sha256 verified" if not unhashed else
               f"{len(files) - unhashed} files' sha256 verified; {unhashed} with no sha256 in the manifest: sizes only")
    click.echo(f"bundle {m.root}  (schema {SCHEMA_VERSION}, {checked})")
    if not m.tokenizer_files:
        click.echo("  tokenizer files: not hashed in this manifest (an older export); checked against the models' "
                   "tokenizer fingerprint instead")
    if m.created or m.sources:
        click.echo(f"  exported {m.created or '(time not recorded)'} from "
                   + ", ".join(f"{role} {src}" for role, src in m.sources.items()))
    for role, table in m.source_files.items():  # (the weights' sha256 as a model page lists them; since session 55)
        big = {n: f for n, f in table.items() if f["bytes"] >= 1 << 20}
        for n, f in big.items():
            click.echo(f"  {role} source file {n} ({f['bytes']:,} bytes) sha256 {f['sha256']}")
        if len(table) > len(big):
            click.echo(f"  {role} source: {len(table) - len(big)} smaller file(s) hashed too ({'' if big else 'none over 1 MiB; '}"
                       "info --json lists them)")
    if m.tool_versions:
        click.echo("  with " + ", ".join(f"{mod} {v}" for mod, v in m.tool_versions.items()))
    vocab = f"  tokenizer vocab {m.tokenizer_vocab_size}" if m.tokenizer_vocab_size is not None else ""
    if m.tokenizer_special_past:  # (Gemma 3 1B's <image_soft_token>: never written, refused in a prompt)
        vocab += f" ({m.tokenizer_special_past} special past the model's rows: never written, refused in a prompt)"
    click.echo(f"  eos {list(m.eos_token_ids)}  bos {m.bos_token_id}  chat template: {_template_state(m.chat_template)}"
               + vocab)
    if m.sampling_defaults:
        click.echo("  recommended sampling (the defaults of generate, chat and serve; --no-model-sampling for none): "
                   + sampling_text(m.sampling_defaults))
    if _thinks(m):
        click.echo("  a thinking model: <think> and </think> are tokens of its own (serve gives the block apart as "
                   "reasoning_content; --chat-template-kwargs sets its template's variables, e.g. enable_thinking)")
    for spec in (m.target, m.drafter):
        if spec is None:
            continue
        click.echo(f"  {spec.role}: {spec.architecture} {spec.precision}, {spec.layout} layout "
                   f"{spec.quant.to_dict() or ''}")
        heads = f"{spec.num_attention_heads} attention heads, " if spec.num_attention_heads else ""
        kv = f"{spec.num_kv_heads} KV heads x {spec.head_dim}"
        if spec.kv_layers:  # (Gemma 4: its global layers' caches are wider)
            from collections import Counter

            kv = "KV heads x head size per layer " + ", ".join(
                f"{h} x {w} ({n} layer{'s' if n > 1 else ''})" for (h, w), n in Counter(spec.kv_layers).items())
        shared = sum(spec.kv_source(i) != i for i in range(spec.num_layers))
        if shared:  # (Gemma 4's shared key-value layers: their source's buffer)
            kv += f" ({shared} layers use an earlier layer's KV cache)"
        click.echo(f"    {spec.num_layers} layers, {heads}{kv}, "
                   f"vocab {spec.vocab_size}, max context {spec.max_context}, "
                   f"KV {spec.kv_dtype} ({spec.kv_bytes_per_token / 1024:.1f} KiB/token)")
        cpu = (f", {spec.cpu_resident_bytes / MiB:.1f} MiB resident once opened on the CPU EP (measured at export"
               + (f"; embedding tables of {spec.embedding_bytes / MiB:.1f} MiB stay mapped until read)"
                  if spec.embedding_bytes else ")")) if spec.cpu_resident_bytes is not None else ""
        params = f"{spec.params / 1e6:.1f}M parameters, " if spec.params else ""
        click.echo(f"    {params}{spec.bytes_on_disk / MiB:.1f} MiB on disk{cpu}")
        if spec.conv_layers:  # (LFM2: their states rolled back from the recent calls' conv inputs, kv.ConvStates)
            click.echo(f"    {len(spec.conv_layers)} convolution layers (no KV cache; states of "
                       f"{spec.conv_state_bytes / MiB:.1f} MiB, rolled back from their last inputs)")
        if spec.attention_window:
            click.echo(f"    sliding-window attention: up to {spec.attention_window:,} tokens (over KV caches of the "
                       "whole context)")
        if spec.head_size:
            click.echo(f"    reduced draft vocabulary: the lm_head computes {spec.head_size} of {spec.vocab_size} "
                       f"tokens ({m.relative(spec.head_ids)}; {spec.head_source or 'source not recorded'})")
        if spec.io.argmax:
            from .onnx_lm import ARGMAX_ROWS

            click.echo(f"    output {spec.io.argmax!r}: the argmax of the first {ARGMAX_ROWS} positions' logits, "
                       "computed on the device (a greedy GPU run copies it instead of the logits)")
        if spec.operators:
            click.echo("    operators: " + ", ".join(f"{op} {n}" for op, n in spec.operators.items()))
        if spec.kernels != "onnxruntime":
            pad = f"; attention padded by {spec.attention_pad} query row" if spec.attention_pad else ""
            from .native import cheap_rows, cpu_supported, isa

            cheap = None  # whether the path here has cheap verify rows (None: no path runs here)
            try:  # the library names its path: it is built here if it has not been
                why = cpu_supported()
                path = None if why else isa()
                here = why or f"this CPU takes its {path} path"
                cheap = None if why else cheap_rows(path)
            except ProviderError as e:  # no compiler: info still describes the bundle
                here = f"not runnable here: {e}"
            click.echo(f"    kernels: {spec.kernels} (edgespec exact-kernels: the CPU EP on x86-64 or aarch64; "
                       f"{here}{pad})")
            if spec.kernel_features:
                click.echo(f"    its attention computes: {', '.join(spec.kernel_features)} (edgespec since session 42)")
            if spec.io.logits_skip:
                click.echo(f"    a prefill computes its last position's logits only (input {spec.io.logits_skip!r})")
            if spec.io.row_positions:
                default = ("" if cheap is None else "; verified by default on this CPU's path" if cheap else
                           "; off by default on this CPU's path (on by default on the kernel's AVX-512 paths; "
                           "engine.decoder.policy.use_alternates)")
                click.echo(f"    a call can verify alternates beside a draft's tokens (input {spec.io.row_positions!r})"
                           + default)
            if spec.kernels_check:
                c = spec.kernels_check
                click.echo(f"    rewrite checked against the source graph: top-1 agreement {c['top1_agreement']:.3f} over "
                           f"{c['positions']} positions, max |Δlogit| {c['max_abs_logit_diff']:.3g} (logits up to "
                           f"{c['logit_scale']:.3g})")
        if spec.precision == "fp8":
            click.echo("    note: FP8 weights are laid out for TensorRT on SM89+ GPUs; the CPU EP runs them slowly")
        if spec.io.hidden:
            click.echo(f"    output {spec.io.hidden!r}: each logits row's hidden state (the assistant drafts from it)")
        for line in report_lines(spec.validation, spec.quality):
            click.echo(f"    {line}")
    a = m.assistant
    if a is not None:  # (Gemma 4's multi-token-prediction assistant: the mtp drafter)
        click.echo(f"  assistant: {a.architecture} {a.precision}, drafter 'mtp': {a.num_layers} layers of width "
                   f"{a.hidden_size}, no KV cache of its own: it attends the target's "
                   + ", ".join(f"layer {i} ({k.replace('_attention', '')})" for k, i in a.sources.items())
                   + (f", sliding layers the last {a.sliding_window + 1} rows" if a.sliding_window else "")
                   + ("; the centroid head" if a.ordered else ""))
        click.echo(f"    {a.params / 1e6:.1f}M parameters, {a.bytes_on_disk / MiB:.1f} MiB on disk (of it a copy of the "
                   f"target's embedding table, {a.embedding_bytes / MiB:.1f} MiB, which stays mapped until read on the "
                   "CPU)")
        if a.validated is not None:
            click.echo(f"    validation vs transformers' assistant step on the target's own state: ✓ relative "
                       f"difference {a.validated:.3g}")


def _check_writable(out_dir, make: bool = True) -> list[str]:
    """The report's folder can be written (``make``: made, and a file made and removed there); without ``make``
    nothing is made: the folder, or its nearest existing parent, must be a folder this process may write. Returns
    the folders it made, the deepest first (what a bench that writes no run removes again)."""
    import tempfile

    from .errors import ConfigError

    from .bench import check_report_files

    if os.path.exists(out_dir) and not os.path.isdir(out_dir):  # ("File exists", from makedirs, said nothing)
        raise ConfigError(f"cannot write the report to {out_dir}: it is a file; --out names a folder")
    missing, near = [], os.path.abspath(out_dir)  # (the folders not there yet, the deepest first; the nearest one that is)
    while not os.path.lexists(near) and os.path.dirname(near) != near:
        missing.append(near)
        near = os.path.dirname(near)
    if not make:
        if not os.path.isdir(near):
            raise ConfigError(f"cannot write the report to {out_dir}: {near} is not a folder")
        if not os.access(near, os.W_OK | os.X_OK):
            raise ConfigError(f"cannot write the report to {out_dir}: {near} is not writable")
        return []
    try:
        os.makedirs(out_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=out_dir).close()
    except OSError as e:
        raise ConfigError(f"cannot write the report to {out_dir}: {e.strerror or e}") from None
    check_report_files(out_dir)
    return missing


def _template_state(source) -> str:
    """'yes', 'no', or 'yes, but it does not parse: ...' (then every chat command refuses the bundle)."""
    if not source:
        return "no"
    from .template import ChatTemplate

    try:
        ChatTemplate(source)
    except EdgespecError as e:
        return f"yes, but {str(e).removeprefix('the bundle' + chr(39) + 's chat template ')}"
    from .tools import template_takes_tools

    return "yes, with tool calls (<tool_call>)" if template_takes_tools(source) else "yes"


# -- bench ----------------------------------------------------------------------------------
@main.command()
@click.argument("bundle", type=NonEmptyPath())
@click.option("--prompts", "prompts_file", type=NonEmptyPath(what="a file"), default=None,
              help="Spec-Bench question.jsonl (question_id, category, turns); default: the shipped set.")
@click.option("--drafters", default="model,prompt-lookup,auto,none", show_default=True,
              help="Comma-separated drafters to compare (none is always run as the baseline); "
                   "model:4 fixes the model drafter's k at 4; auto@8 bounds auto's drafts at 8 tokens a round.")
@click.option("--categories", default=None, help="Comma-separated categories to keep.")
@click.option("--limit", type=int, default=None, help="Use only the first N prompts.")
@click.option("--per-category", type=int, default=None, help="Use only the first N prompts of each category.")
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--draft-tokens", type=int, default=None, help="Fixed k (default adaptive).")
@click.option("--max-context", type=int, default=None)
@click.option("--threads", type=int, default=None)
@_profile_opt
@_provider_opt
@drafter_provider_opt
@click.option("--out", "out_dir", type=NonEmptyPath(), default="reports/bench", show_default=True)
@click.option("--no-plots", is_flag=True)
@memory_opts(default_memory=False)
@_ends_on_hangup
def bench(bundle, prompts_file, drafters, categories, limit, per_category, max_new_tokens, draft_tokens, max_context,
          threads, profile, provider, out_dir, no_plots):
    """Profile BUNDLE: speed, speedup, acceptance, time split and memory, per category and drafter."""
    from .bench import parse_drafters, read_prompts, run_bench, write_partial_report, write_report
    from .errors import ConfigError

    names = [d.strip() for d in drafters.split(",") if d.strip()]
    if not [n for n in names if n != "none"]:
        raise ConfigError(f"--drafters names no drafter to compare with none: {drafters!r}")
    parse_drafters(names)  # a bad entry is refused before any model is loaded
    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    from .decoder import MAX_DRAFT

    if draft_tokens is not None and not 0 <= draft_tokens <= MAX_DRAFT:  # (before the baseline runs, not after)
        raise ConfigError(f"--draft-tokens must be in 0..{MAX_DRAFT}, got {draft_tokens}")
    prompts = read_prompts(prompts_file, limit, categories.split(",") if categories else None, per_category)
    from .bench import _parse_drafter

    wants_model = any(_parse_drafter(n)[0] in ("model", "mtp", "auto") for n in names)  # (auto@8 too)
    from .manifest import load_manifest

    load_manifest(bundle)  # (a bundle that is none refused first, then a folder the report cannot go to: before
    _check_writable(out_dir, make=False)  # the models load, 13 s on the Qwen pair; made once they have loaded)
    # (no prompt cache: the report's memory is compared with the plan, which leaves it out)
    eng = _engine(bundle, profile, provider, max_context, threads, use_drafter=wants_model, prompt_cache_mb=0)
    if eng.decoder.drafters.get("model") is None and any(_parse_drafter(n)[0] == "model" for n in names):
        names = [n for n in names if _parse_drafter(n)[0] != "model"]
        if not [n for n in names if n != "none"]:
            raise ConfigError("--drafters model: this bundle/plan has no drafter model, and no other drafter is "
                              "named to compare with none")
        click.echo("note: this bundle/plan has no drafter model; skipping --drafters model", err=True)
    made = _check_writable(out_dir)  # before the bench runs, not after (what it made: removed if no run is written)
    click.echo(f"bench: {len(prompts)} prompts x {len(set(names) | {'none'})} drafters, "
               f"{max_new_tokens} new tokens each", err=True)
    try:
        rep = run_bench(eng, prompts, names, max_new_tokens=max_new_tokens, draft_tokens=draft_tokens,
                        between=raise_if_hung_up)
    except BaseException as e:  # Ctrl-C, SIGTERM or an error mid-run: the runs done are written (the report says it
        write_partial_report(getattr(e, "report", None), out_dir)  # stopped), and a folder it made for none removed
        for folder in made:  # (deepest first; only if empty)
            try:
                os.rmdir(folder)
            except OSError:
                break
        raise
    try:
        click.echo(rep.markdown())  # first: a report that cannot be written is not lost
    finally:  # (and the files whatever becomes of stdout: a pager quit, a closed pipe lost the whole run)
        files = write_report(rep, out_dir, plots=not no_plots)
        click.echo("wrote " + ", ".join(str(f) for f in files), err=True)


from .cli_export import drafter_vocab, exact_kernels, export  # noqa: E402  (the export commands, in their own module)

main.add_command(export)
main.add_command(drafter_vocab)
main.add_command(exact_kernels)

main.add_command(memory)

if __name__ == "__main__":
    main(prog_name="edgespec")  # (`python -m edgespec.cli`: its messages name the command as users type it)
