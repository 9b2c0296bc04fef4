"""Mutants of edgespec/tokenizer.py (TK: the tokenizer wrapper, chat encoding, FIM, streaming detokenization) and
edgespec/tools.py (TL: tool-call checks, parsing, the forced start and the one-call stop), session 94 (helper): a
second pass after session 68's 25 and 39 mutants of their hot lines. Run from the copy:
  python run.py tokenizer_tools.py tests/test_tools.py --only TL1,...
  python run.py tokenizer_tools.py tests/test_runtime.py --k "..." --only TK1,...
(the test sets used per group are in mutation_s94.md)
"""
K = "edgespec/tokenizer.py"
L = "edgespec/tools.py"
MUTANTS = [
    # ================================================= tools.py =================================================
    # -- check_tools ------------------------------------------------------------------------------------------------
    ("TL1", L, "    if not isinstance(tools, (list, tuple)):\n        raise ConfigError(f\"tools must be",
     "    if not isinstance(tools, list):\n        raise ConfigError(f\"tools must be"),  # a Python caller's tuple of tools refused
    ("TL2", L, "    if len(tools) > MAX_TOOLS:", "    if len(tools) >= MAX_TOOLS:"),  # exactly 128 tools refused
    ("TL3", L, "        where = f\"tools[{i}]\"", "        where = \"tools[0]\""),  # an error about the 2nd tool names tools[0]
    ("TL4", L, "        if name is None:\n            raise ConfigError(f\"{where}.function.name is missing",
     "        if False:\n            raise ConfigError(f\"{where}.function.name is missing"),  # a missing name: \"must be ... got null\", not \"missing\"
    ("TL5", L, 'NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")', 'NAME = re.compile(r"[A-Za-z0-9_-]{0,64}")'),  # an empty function name accepted
    ("TL6", L, 'NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")', 'NAME = re.compile(r"[A-Za-z0-9_]{1,64}")'),  # a name with a hyphen refused
    ("TL7", L, "            clean[\"description\"] = f[\"description\"]\n", "            pass\n"),  # a tool's description silently not given to the template
    ("TL8", L, "            check_schema_numbers(f[\"parameters\"], f\"{where}.function.parameters\")\n", "            pass\n"),  # a schema's bad numbers not refused here
    ("TL9", L, "if f[\"parameters\"].get(\"type\", \"object\") != \"object\":", "if f[\"parameters\"].get(\"type\", \"string\") != \"object\":"),  # parameters without a type refused
    ("TL10", L, "            clean[\"parameters\"] = f[\"parameters\"]\n", "            pass\n"),  # a tool's parameters silently dropped
    ("TL11", L, "            if f[\"strict\"]:  # its arguments", "            if True:  # its arguments"),  # strict: false made strict
    ("TL12", L, "            if not isinstance(f[\"strict\"], bool):\n", "            if False:\n"),  # strict: \"yes\" accepted (as strict)
    # -- check_tool_choice ------------------------------------------------------------------------------------------
    ("TL13", L, "    if isinstance(choice, dict) and choice.get(\"type\") == \"function\" and isinstance(",
     "    if isinstance(choice, dict) and isinstance("),  # a tool_choice without \"type\": \"function\" accepted
    ("TL14", L, "raise ConfigError(\"tool_choice names no function: its name is missing\" if name is None else",
     "raise ConfigError(\"tool_choice names no function: its name is missing\" if name is not None else"),  # the two messages swapped
    ("TL15", L, "        if choice == \"required\" and not names:", "        if False:"),  # required without tools passes check_tool_choice
    # -- check_tool_messages ----------------------------------------------------------------------------------------
    ("TL16", L, "if not isinstance(m, dict) or not (m.get(\"tool_calls\") or m.get(\"role\") == \"tool\"):",
     "if not isinstance(m, dict) or not m.get(\"tool_calls\"):"),  # a tool message passed whole, its fields unchecked
    ("TL17", L, "            for key in (\"tool_call_id\", \"name\"):", "            for key in (\"tool_call_id\",):"),  # a tool result's name dropped
    ("TL18", L, "                    if not isinstance(m[key], str):\n                        raise ConfigError(f\"message {i}'s {key} must be a string\")\n",
     "                    if False:\n                        raise ConfigError(f\"message {i}'s {key} must be a string\")\n"),  # a numeric tool_call_id accepted
    ("TL19", L, "        if not isinstance(calls, (list, tuple)):\n            raise ConfigError(f\"message {i}'s tool_calls must be a list\")\n",
     "        if False:\n            raise ConfigError(f\"message {i}'s tool_calls must be a list\")\n"),  # tool_calls as an object: another message
    ("TL20", L, "            args = f.get(\"arguments\", \"{}\")", "            args = f.get(\"arguments\", \"null\")"),  # a call without arguments rendered with null
    ("TL21", L, "                    args = json.loads(args) if args.strip() else {}", "                    args = json.loads(args)"),  # empty arguments rendered as \"\", not {}
    ("TL22", L, "                except RecursionError:\n                    raise ConfigError(f\"{where}.function.arguments is nested too deeply\") from None\n",
     "                except RecursionError:\n                    raise\n"),  # deeply nested arguments: an untyped RecursionError (500)
    ("TL23", L, "            elif not isinstance(args, dict):\n                raise ConfigError(f\"{where}.function.arguments must be a JSON string\")\n",
     "            elif False:\n                raise ConfigError(f\"{where}.function.arguments must be a JSON string\")\n"),  # arguments as a list or number accepted
    ("TL24", L, "                call[\"id\"] = c[\"id\"]\n", "                pass\n"),  # the call's id not given to the template
    ("TL25", L, "        out.append({**m, \"content\": \"\" if content is None else content, \"tool_calls\": conv})",
     "        out.append({**m, \"content\": content, \"tool_calls\": conv})"),  # an assistant call message with content null refused
    ("TL26", L, "        out.append({**m, \"content\": \"\" if content is None else content, \"tool_calls\": conv})",
     "        out.append({**m, \"content\": \"\" if content is None else content})"),  # calls given to the template unconverted (arguments a string)
    # -- ToolCall, the strict decoder --------------------------------------------------------------------------------
    ("TL27", L, "        return d if index is None else {\"index\": index, **d}", "        return d"),  # streamed call deltas without their index
    ("TL28", L, "    if v in (float(\"inf\"), float(\"-inf\")):", "    if v == float(\"inf\"):"),  # -1e999 taken as a number
    # -- _as_calls --------------------------------------------------------------------------------------------------
    ("TL29", L, "        args = c.get(\"arguments\", c.get(\"parameters\", {}))", "        args = c.get(\"arguments\", c.get(\"parameters\"))"),  # a block call without arguments is no call
    ("TL30", L, "                args = json.dumps(json.loads(args))\n        else:\n            return None\n",
     "                args = json.dumps(json.loads(args))\n        else:\n            args = json.dumps(args)\n"),  # arguments a list/number/null taken as a call
    ("TL31", L, "        if not _utf8(c[\"name\"]):\n            return None\n", ""),  # a call whose name is a lone surrogate (500 at the response)
    ("TL32", L, "            if not _utf8(args):  # (a lone surrogate", "            if False:  # (a lone surrogate"),  # arguments with a lone surrogate: no UTF-8 form
    ("TL33", L, "    if whole and rest.strip():\n        return None\n", ""),  # a closed block with text after its JSON taken as a call
    # -- _call_shaped / _bare_calls ---------------------------------------------------------------------------------
    ("TL34", L, "    if t[0] != \":\":\n        return False\n", ""),  # {\"name\" x ... held as a possible call
    ("TL35", L, "    if t[0] != '\"':\n        return False\n", "    if t[0] != '\"':\n        return None\n"),  # {\"name\": 5 ... held to the end (not streamed)
    ("TL36", L, "        if not isinstance(obj, dict) or set(obj) != _BARE_KEYS:", "        if not isinstance(obj, dict) or not set(obj) <= _BARE_KEYS:"),  # a bare {\"name\"} alone taken as a call
    ("TL37", L, "    for body in (t, t[1:-1] if t.startswith(\"{{\") and t.endswith(\"}}\") else None):", "    for body in (t,):"),  # the doubled-brace bare call not read
    # -- ToolCallParser ---------------------------------------------------------------------------------------------
    ("TL38", L, "        body = s.rstrip()\n", "        body = s\n"),  # whitespace before a call given out as content
    ("TL39", L, "        if not self._content and self.calls:  # content after a call", "        if self.calls:  # content after a call"),  # text after a 2nd call glued
    ("TL40", L, "        for end in (closer, \"```\", CLOSE):", "        for end in (closer, CLOSE):"),  # an unclosed <tool_call> ended by ``` keeps the fence as content
    ("TL41", L, "            if rest.startswith(end) or end.startswith(rest):", "            if rest.startswith(end):"),  # a cut closer kept as content
    ("TL42", L, "            if self.limit is None or len(self.calls) < self.limit:", "            if self.limit is None or len(self.calls) <= self.limit:"),  # one call past the limit kept
    ("TL43", L, "                elif c == '\"' or c == \"\\n\":", "                elif c == '\"':"),  # a stray quote hides every closer after it
    ("TL44", L, "            elif closer.startswith(buf[i:]):  # the closer may be starting", "            elif False:  # the closer may be starting"),  # a closer cut across two pieces missed
    ("TL45", L, "                    if head and head[0] not in \"{[\":", "                    if head and head[0] not in \"{\":"),  # a fenced list of calls is content
    ("TL46", L, "                    self._checked = bool(head)", "                    self._checked = True"),  # a fence's first character not looked at
    ("TL47", L, "        if not self.calls and self._space:  # no calls", "        if self._space:  # no calls"),  # trailing whitespace after calls as content
    ("TL48", L, "            self._close(self._buf, self._block[0] + self._buf, out, whole=False)", "            self._close(self._buf, self._block[0] + self._buf, out, whole=True)"),  # an unclosed call with text after: no call
    ("TL49", L, "            if calls is None:\n                return self.feed(held) + self.finish()\n", "            if calls is None:\n                return [(\"content\", held)]\n"),  # a held non-call not parsed for blocks / not in content
    # -- ToolRequest, CallEnd, tool_request -------------------------------------------------------------------------
    ("TL50", L, "        return self.choice == \"required\" or isinstance(self.choice, dict)", "        return self.choice == \"required\""),  # a named function not forced
    ("TL51", L, "            if strict:\n                raise ConfigError(\"strict tool calls need llguidance", "            if False:\n                raise ConfigError(\"strict tool calls need llguidance"),  # strict silently unconstrained without llguidance
    ("TL52", L, "            return OPEN + '\\n{\"name\": \"'", "            return OPEN + '{\"name\": \"'"),  # required's forced start without its line break
    ("TL53", L, "json.dumps(self.choice[\"name\"]) + ', \"arguments\":'", "json.dumps(self.choice[\"name\"]) + ', \"arguments\": '"),  # a named call's forced start ends in a lone space
    ("TL54", L, "if self.parses and not self.parallel and not (thinking and not self.forced) else []", "if self.parses and not self.parallel and not thinking else []"),  # a forced call of a thinking model runs past its call
    ("TL55", L, "if bare and not t[\"function\"].get(\"strict\")])", "if not t[\"function\"].get(\"strict\")])"),  # the one-call stop's parser holds a bare-call start
    ("TL56", L, "        if p.calls:\n            return False\n", ""),  # a closer after the first call counted as ending it
    ("TL57", L, "        if self.prefix:\n            p.feed(self.prefix)\n", ""),  # a forced start not read: the forced call lost
    ("TL58", L, "    return bool(source) and OPEN in source and re.search", "    return bool(source) and re.search"),  # a template naming tools but not <tool_call> accepted
    ("TL59", L, "    if not tools:\n        return None\n    if not template_takes_tools", "    if tools is None:\n        return None\n    if not template_takes_tools"),  # tools [] on a template without tools refused
    ("TL60", L, "    return self.tools if self.tools and self.choice != \"none\" else None", "    return self.tools if self.tools else None"),  # tool_choice none still renders tools
]
MUTANTS += [
    # =============================================== tokenizer.py ===============================================
    # -- special_ids_past, tokenizer_fingerprint ----------------------------------------------------------------------
    ("TK1", K, "    if total <= n:\n        return 0\n", "    if total <= n:\n        return None\n"),  # a tokenizer within the head's rows read as one with a normal token past it
    ("TK2", K, "    return len(past) if all(i in added and added[i].special for i in past) else None",
     "    return len(past) if all(i in added for i in past) else None"),  # a non-special added token past the rows taken as never written
    ("TK3", K, "    return len(past) if all(i in added and added[i].special for i in past) else None",
     "    return len(past) if any(i in added and added[i].special for i in past) else None"),  # one special past the rows is enough
    ("TK4", K, "        \"merges\": model.get(\"merges\") or [],\n", ""),  # tokenizers differing only in merges hash alike (a drafter of another tokenizer accepted)
    ("TK5", K, "        \"normalizer\": data.get(\"normalizer\"),\n", ""),  # tokenizers differing only in their normalizer hash alike
    ("TK6", K, "        \"vocab\": sorted(vocab.items()) if isinstance(vocab, dict) else vocab,", "        \"vocab\": list(vocab.items()) if isinstance(vocab, dict) else vocab,"),  # the same vocab in another key order hashes differently
    ("TK7", K, "    size = (max(ids) + 1) if ids else 0", "    size = len(ids)"),  # a vocabulary with a gap in its ids: size too small
    ("TK8", K, "    added = sorted((t[\"id\"], t[\"content\"]) for t in data.get(\"added_tokens\") or [])", "    added = [(t[\"id\"], t[\"content\"]) for t in data.get(\"added_tokens\") or []]"),  # added tokens listed in another order hash differently
    # -- fim_split ----------------------------------------------------------------------------------------------------
    ("TK9", K, "    lead = 1 if len(prompt) > 1 and prompt[0] != fim.prefix else 0", "    lead = 0"),  # a bos-led FIM prompt not recognized
    ("TK10", K, "    if len(prompt) < lead + 3 or prompt[lead] != fim.prefix", "    if len(prompt) < lead + 4 or prompt[lead] != fim.prefix"),  # <pre><suf><mid> (empty gap sides) not recognized
    ("TK11", K, " or prompt[lead] != fim.prefix or prompt[-1] != fim.middle:", " or prompt[lead] != fim.prefix:"),  # a prompt not ending in <middle> taken as FIM
    ("TK12", K, "    for i in range(lead + 1, len(prompt) - 1):", "    for i in range(lead + 2, len(prompt) - 1):"),  # an empty prefix: its <suffix> not found
    ("TK13", K, "            return lead, i\n", "            return lead, i + 1\n"),  # the suffix's index one off
    # -- Tokenizer: reading, ids, bytes -------------------------------------------------------------------------------
    ("TK14", K, "            raise BundleError(f\"cannot read {path}: {e}\") from None", "            raise"),  # a broken tokenizer.json: an untyped Exception
    ("TK15", K, "        return t is None or t == f\"[PAD{int(i)}]\"", "        return t is None"),  # a GGUF's [PAD<i>] filler taken for a token
    ("TK16", K, "        if i in self._added:\n            return self._added[i].encode(\"utf-8\")\n", ""),  # a special token's bytes from the decoder (logprobs' bytes)
    ("TK17", K, "        if t is None:\n            return b\"\"\n        if type(self._tok.decoder)", "        if t is None:\n            return b\"?\"\n        if type(self._tok.decoder)"),  # an id with no token gets bytes
    ("TK18", K, "        b = _fallback_byte(t)\n        if b is not None:\n            return bytes([b])\n", ""),  # <0xNN> tokens' bytes: the decoder's U+FFFD
    ("TK19", K, "            return t.replace(\"\\u2581\", \" \").encode(\"utf-8\")", "            return t.replace(\"\\u2581\", \"\").encode(\"utf-8\")"),  # SentencePiece's \u2581 not a space in bytes
    ("TK20", K, "            if len(tail) >= 4:  # a character is at most 4 bytes", "            if len(tail) >= 2:  # a character is at most 4 bytes"),  # a character cut after 2 single-byte tokens not seen as cut
    ("TK21", K, "            else:  # a piece of text (whole characters): the tail's bytes begin after it\n                break\n",
     "            else:  # a piece of text (whole characters): the tail's bytes begin after it\n                continue\n"),  # byte tokens before a text piece read as the reply's end
    ("TK22", K, "        return back if back < need else 0", "        return back if back <= need else 0"),  # a whole last character counted as unfinished
    ("TK23", K, "        need = 2 if 0xC0 <= b < 0xE0 else 3 if 0xE0 <= b < 0xF0 else 4", "        need = 2 if 0xC0 <= b < 0xE0 else 3 if 0xE0 <= b < 0xF0 else 3"),  # a 4-byte character's 3 first bytes taken as whole
    ("TK24", K, "            seen += int(ids[j]) not in special", "            seen += 1"),  # a special token after the cut character counted as one of its bytes
    # -- encode / FIM -------------------------------------------------------------------------------------------------
    ("TK25", K, "        _check_text(text, \"the prompt\")\n        tok = self._tok", "        tok = self._tok"),  # a non-string prompt: an untyped error
    ("TK26", K, "(not ids or ids[0] != self.bos_token_id)", "(ids[0] != self.bos_token_id)"),  # an empty prompt with bos: IndexError
    ("TK27", K, "(not ids or ids[0] != self.bos_token_id)", "True"),  # a prompt starting with bos's text gets two bos
    ("TK28", K, "        if add_special and self.add_bos and", "        if self.add_bos and"),  # add_special=False still adds bos (FIM's pieces, healing)
    ("TK29", K, "        tok = self._tok if parse_special else self._text_tokenizer()", "        tok = self._tok"),  # parse_special=False still reads special tokens
    ("TK30", K, "| set(ids) | set(self.eos_token_ids)", "| set(ids)"),  # a middle does not end at the model's eos
    ("TK31", K, "| set(ids) | set(self.eos_token_ids)", "| set(self.eos_token_ids)"),  # a middle does not end at a FIM control token
    ("TK32", K, "{added[n] for n in FIM_ENDS if n in added}", "set()"),  # a middle does not end at <|endoftext|>, <|file_sep|>, ...
    ("TK33", K, "        if f is None:\n            raise ConfigError(\"this model has no fill-in-the-middle", "        if False:\n            raise ConfigError(\"this model has no fill-in-the-middle"),  # a suffix on a non-FIM model: AttributeError
    ("TK34", K, "        _check_text(suffix, \"the suffix\")", "        _check_text(suffix, \"the prompt\")"),  # a bad suffix's error names the prompt
    ("TK35", K, "        return ([self.bos_token_id] if self.add_bos and self.bos_token_id is not None else []) + [f.prefix]", "        return [f.prefix]"),  # a FIM prompt without the model's bos
    ("TK36", K, "            + self.encode(suffix, add_special=False, parse_special=parse_special) + [f.middle]", "            + self.encode(suffix, add_special=False, parse_special=True) + [f.middle]"),  # a special token's text in the suffix read as the token
    ("TK37", K, "\"\\u2581\") else []", "\"\\u2581\") and False else []"),  # a grammar's forced text mid-reply gets SentencePiece's leading space
    ("TK38", K, "        t.encode_special_tokens = True\n", ""),  # the text copies read special tokens' text as tokens
    # -- special ids / texts, min_tokens, decode ----------------------------------------------------------------------
    ("TK39", K, "            self._special_ids = frozenset(i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)",
     "            self._special_ids = frozenset(self._tok.get_added_tokens_decoder())"),  # non-special added tokens (<tool_call>) treated as special
    ("TK40", K, "                                   if t.content and _markup(t.special, t.content))", "                                   if t.content and t.special)"),  # <tool_call> typed in a message read as the token
    ("TK41", K, "    return bool(special or content.strip())", "    return bool(special or content)"),  # a whitespace added token (Gemma's \\n\\n) counted as markup
    ("TK42", K, "            self._max_token_bytes = max((len(t.encode(\"utf-8\", \"replace\")) for t in self._tok.get_vocab()), default=1)",
     "            self._max_token_bytes = max((len(t) for t in self._tok.get_vocab()), default=1)"),  # the token bound counted in characters: no lower bound
    ("TK43", K, "        return len(text.encode(\"utf-8\", \"surrogatepass\")) // max(1, self._max_token_bytes)", "        return len(text) // max(1, self._max_token_bytes)"),  # text's bound in characters: a CJK prompt's bound too small
    ("TK44", K, "        except (OverflowError, TypeError):  # (a negative id", "        except OverflowError:  # (a negative id"),  # a non-integer id: an untyped TypeError (500)
    ("TK45", K, "if not isinstance(i, int) or not 0 <= i < 2**32), ids)!r}", "if not isinstance(i, int) or not 0 < i < 2**32), ids)!r}"),  # the error names id 0, not the bad one
    # -- render_chat, eos, encode_chat --------------------------------------------------------------------------------
    ("TK46", K, "        if not self.chat_template:\n            raise ConfigError(\"this bundle has no chat template; use a plain prompt\")\n", ""),  # no template: an untyped error
    ("TK47", K, "        bos = self.id_to_token(self.bos_token_id) if self.bos_token_id is not None else \"\"", "        bos = \"\""),  # the template's bos_token empty
    ("TK48", K, "                e = e.get(\"content\") if isinstance(e, dict) else e\n", ""),  # an eos_token given as an AddedToken object ignored
    ("TK49", K, "            except (OSError, ValueError, RecursionError):  # (no file", "            except (OSError, RecursionError):  # (no file"),  # a malformed tokenizer_config.json breaks every chat
    ("TK50", K, "                text = (self.id_to_token(self.eos_token_ids[0]) or \"\") if self.eos_token_ids else \"\"", "                text = (self.id_to_token(self.eos_token_ids[-1]) or \"\") if self.eos_token_ids else \"\""),  # the fallback eos is the last end id
    ("TK51", K, "        if template_kwargs and any(s in x for x in _strings([template_kwargs]) for s in specials):", "        if False:"),  # a special token's text in chat_template_kwargs written as markup
    ("TK52", K, "        in_content = any(s in m[\"content\"] or s in (m.get(\"reasoning_content\") or \"\")", "        in_content = any(s in m[\"content\"]"),  # a special text in reasoning_content alone encoded as the token
    ("TK53", K, "in_reply if m.get(\"role\") == \"assistant\" else specials, texts)", "specials, texts)"),  # an assistant's <think> tags made text
    ("TK54", K, "            if m.get(\"tool_calls\") and in_structured:\n                m[\"tool_calls\"] = _mark(", "            if False:\n                m[\"tool_calls\"] = _mark("),  # a special text in a call's arguments encoded as the token
    ("TK55", K, "        if tools and in_structured:\n            tools = _mark(", "        if False:\n            tools = _mark("),  # a special text in a tool's description encoded as the token
    ("TK56", K, "                low = max(at, offsets[k - 1][1] if k else 0)", "                low = at"),  # an lstrip token takes spaces of the text before it
    ("TK57", K, "        stand_in = ids[bool(before.normalized)]", "        stand_in = ids[0]"),  # a stretch after a normalized token encoded after the wrong stand-in
    ("TK58", K, "        return tail if tail and not self.decode(tail).endswith(\"\\ufffd\") else ()", "        return tail"),  # a prompt ending mid-character gives its context
    # -- check_messages, _check_text, _fallback_byte ------------------------------------------------------------------
    ("TK59", K, "re.fullmatch(r\"[A-Za-z_][A-Za-z0-9_-]{0,31}\", role)", "re.fullmatch(r\"[A-Za-z_][A-Za-z0-9_-]{0,63}\", role)"),  # a 64-character role accepted
    ("TK60", K, "re.fullmatch(r\"[A-Za-z_][A-Za-z0-9_-]{0,31}\", role)", "re.fullmatch(r\"[A-Za-z0-9_][A-Za-z0-9_-]{0,31}\", role)"),  # a role starting with a digit accepted
    ("TK61", K, "        if m.get(\"reasoning_content\") is not None:  # (an assistant's thinking", "        if False:  # (an assistant's thinking"),  # a non-string reasoning_content: an untyped error
    ("TK62", K, "(undecodable byte at character {e.start})", "(undecodable byte at character {e.end})"),  # the error points one character late
    ("TK63", K, "    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):", "    if not isinstance(messages, Sequence):"),  # a string of messages: \"message 0 must be an object\"
    ("TK64", K, "        except ValueError:\n            return None\n    return None", "        except KeyError:\n            return None\n    return None"),  # a token \"<0xZZ>\" breaks bytes and decoding
    # -- StreamDecoder ------------------------------------------------------------------------------------------------
    ("TK65", K, "        return self._tok.decode(self._span(self._prefix))[len(self._tok.decode(self._span(self._prefix, self._read))):]",
     "        return self._tok.decode(self._span(self._prefix))"),  # held() returns text already emitted too
    ("TK66", K, "        if len(full) > len(prefix_text) and not full.endswith(\"\\ufffd\"):", "        if len(full) > len(prefix_text):"),  # a cut character streamed as U+FFFD
    ("TK67", K, "        return len(self._tok.finished_text(self._ctx + list(ids))) - self._ctx_len", "        return len(self._tok.finished_text(list(ids)))"),  # offsets of a reply decoded without its context (a stop string's ids on SentencePiece)
    ("TK68", K, "        full = self._tok.finished_text(self._span(0), self._prefix)", "        full = self._tok.decode(self._span(self._prefix))"),  # flush sends a cut last character as U+FFFD
]
