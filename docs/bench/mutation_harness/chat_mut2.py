"""Mutants of edgespec/chat.py (session 97): a second pass after session 81's H1-H40, aimed at what that pass did not
name: what a terminal is shown, the options and streams the REPL starts with, piped input's skipping and CRLF, the
byte bound of a line, the exit code, // messages, a Ctrl-C in a command, the notices around a reply, the commands'
words and /help, /set's display, the drafters a chat takes, /load's checks, /save's links and modes, the statistics'
empty cases, Ctrl-C's handler.
Run from the copy:  python run.py chat_mut2.py tests/test_chat.py --k "not smol"
"""
P = "edgespec/chat.py"
MUTANTS = [
    ("CH1", P, "for c in range(32) if c not in (9, 10, 13)}", "for c in range(32) if c not in (9, 10)}"),  # a carriage return shown as ^M
    ("CH2", P, "if c not in (9, 10, 13)} | {127: \"^?\"} | \\", "if c not in (9, 10, 13)} | \\"),  # DEL reaches the terminal
    ("CH3", P, "    {c: f\"\\\\x{c:02x}\" for c in range(0x80, 0xa0)}", "    {c: f\"\\\\x{c:02x}\" for c in range(0x80, 0x9f)}"),  # the last C1 control passed
    ("CH6", P, "        self.options = self._checked({k: v for k, v in (options or {}).items() if v is not None})", "        self.options = self._checked(dict(options or {}))"),  # options given as None kept
    ("CH8", P, "        self.interactive = self.stdin is sys.stdin and self.stdin.isatty()", "        self.interactive = self.stdin.isatty()"),  # another terminal stream read with input()
    ("CH9", P, "        except (AttributeError, ValueError):\n            self._tty = False", "        except AttributeError:\n            self._tty = False"),  # a closed stdout's ValueError
    ("CH10", P, "        room = self.session.room(self.options.get(\"max_new_tokens\") or self.engine.defaults.max_new_tokens)", "        room = self.session.room(self.engine.defaults.max_new_tokens)"),  # the chat's own max_new_tokens ignored at start
    ("CH12", P, "        self.failed += 1\n", "        pass\n"),  # errors not counted
    ("CH13", P, "            line = line.removesuffix(\"\\n\").removesuffix(\"\\r\")", "            line = line.removesuffix(\"\\n\")"),  # piped CRLF keeps \r in a block
    ("CH14", P, "            if line.rstrip() == BLOCK:", "            if line.strip() == BLOCK:"),  # an indented closing quote ends the block
    ("CH16", P, "                self._skipping = bool(rest) and not rest.endswith(\"\\n\")", "                self._skipping = not rest.endswith(\"\\n\")"),  # end of input while skipping: a loop
    ("CH17", P, "            if len(line) > self.line_limit and not line.endswith(\"\\n\"):", "            if len(line) > self.line_limit:"),  # a line of exactly the limit and its newline skipped
    ("CH19", P, "        if len(line) * 4 > self.line_limit and _utf8_len(line) > self.line_limit:", "        if len(line) > self.line_limit and _utf8_len(line) > self.line_limit:"),  # a line over the limit in bytes, not characters, taken
    ("CH20", P, "        limit = f\"{self.line_limit >> 20} MiB\" if self.line_limit >= 1 << 20 else f\"{self.line_limit} bytes\"", "        limit = f\"{self.line_limit >> 20} MiB\" if self.line_limit > 1 << 20 else f\"{self.line_limit} bytes\""),  # 1 MiB said in bytes
    ("CH21", P, "        return 1 if self.failed and not self.interactive else 0", "        return 1 if self.failed else 0"),  # a terminal's session exits 1
    ("CH24", P, "                self.reply(line[1:])", "                self.reply(line[2:])"),  # // messages lose their slash
    ("CH25", P, "                except KeyboardInterrupt:  # (a /load or /save", "                except RuntimeError:  # (a /load or /save"),  # Ctrl-C in a command ends the chat
    ("CH27", P, "                if not parts:\n                    self._notice_dropped(dropped)  # before", "                if False:\n                    self._notice_dropped(dropped)  # before"),  # the dropped notice after the reply
    ("CH28", P, "            if parts:\n                self._out(\"\\n\")\n            self._error(str(e))", "            self._error(str(e))"),  # an error mid-reply not on its own line
    ("CH29", P, "        elif getattr(self.engine.last_stats, \"finish_reason\", None) == \"context\":", "        elif getattr(self.engine.last_stats, \"finish_reason\", None) == \"length\":"),  # the full-context notice on the wrong finish
    ("CH31", P, "        if n > 0:\n            self._note(f\"[dropped", "        if n >= 0:\n            self._note(f\"[dropped"),  # a dropped notice every turn
    ("CH32", P, "        if name in (\"exit\", \"quit\"):", "        if name in (\"exit\",):"),  # /quit unknown
    ("CH33", P, "        if arg and name in (\"help\", \"reset\", \"stats\"):", "        if arg and name in (\"help\", \"reset\"):"),  # /stats with words after it
    ("CH34", P, "            self._out(HELP.replace(\"{drafters}\", \", \".join(self._drafter_names())) + \"\\n\")", "            self._out(HELP + \"\\n\")"),  # /help shows {drafters}
    ("CH35", P, "        drafter = options.get(\"drafter\") or self.engine.defaults.drafter", "        drafter = options.get(\"drafter\")"),  # the default drafter none not seen
    ("CH37", P, "        return [d for d in drafter_choices() if d != \"prediction\" and (d in (\"auto\", \"none\") or d in loaded)]", "        return [d for d in drafter_choices() if d in (\"auto\", \"none\") or d in loaded]"),  # prediction offered
    ("CH38", P, "            why = getattr(self.engine.decoder, \"unavailable\", {}).get(name) or f\"no {name} drafter is loaded\"", "            why = f\"no {name} drafter is loaded\""),  # the engine's reason lost
    ("CH39", P, "            self._out(shown.replace(\"draft_tokens=None\", \"draft_tokens=auto\") + \"\\n\")", "            self._out(shown + \"\\n\")"),  # /set shows draft_tokens=None
    ("CH40", P, "        self._out(f\"{key} = {'auto' if parsed is None and key == 'draft_tokens' else parsed}\\n\")", "        self._out(f\"{key} = {parsed}\\n\")"),  # /set draft_tokens auto says None
    ("CH42", P, "        if messages is None or any(m[\"role\"] not in (\"system\", \"user\", \"assistant\") or not isinstance(m[\"content\"], str)", "        if messages is None or any(m[\"role\"] not in (\"system\", \"user\", \"assistant\")"),  # a content that is no text loaded
    ("CH44", P, "        self.session.dropped = 0\n", "        pass\n"),  # /load keeps the old dropped count
    ("CH45", P, "        if os.path.islink(path):\n            path = os.path.realpath(path)", "        if False:\n            path = os.path.realpath(path)"),  # /save replaces a link with a file
    ("CH46", P, "            except OSError:\n                mode = 0o600", "            except OSError:\n                mode = 0o644"),  # a new conversation readable by all
    ("CH47", P, "                os.fchmod(f.fileno(), mode)\n", "                pass\n"),  # the replaced file's mode lost
    ("CH49", P, "        transcript = self.session.transcript\n", "        transcript = self.session.messages\n"),  # /save loses the dropped exchanges
    ("CH50", P, "    return path if path.isprintable() else ascii(path)", "    return path"),  # a name's control characters printed
    ("CH53", P, "    except (OSError, ValueError, RecursionError):\n        return None", "    except (OSError, ValueError):\n        return None"),  # a deeply nested JSON file raises
    ("CH56", P, "    drafters = \", \".join(f\"{k} {v}\" for k, v in sorted(st.rounds_by_drafter.items())) or \"-\"", "    drafters = \", \".join(f\"{k} {v}\" for k, v in sorted(st.rounds_by_drafter.items()))"),  # no drafters: an empty field
    ("CH57", P, "        f\"finish: {st.finish_reason or 'stopped'}\",", "        f\"finish: {st.finish_reason}\","),  # finish: None
    ("CH58", P, "    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) != signal.SIG_IGN:", "    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:"),  # a handler set from another thread
    ("CH59", P, "    return lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)", "    return None"),  # SIGINT's ignoring not put back
]
