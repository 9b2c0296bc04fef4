"""Mutants of edgespec/constrain.py, a second pass (session 94; session 68 ran 33 on its hot lines, before the
harness): response_format's checks, the tool-call grammar, the matchers' failures, Constraint and LazyConstraint.
Run from the copy:  python run.py constrain_mut.py tests/test_structured.py tests/test_tools.py"""
F = "edgespec/constrain.py"
MUTANTS = [
    # -- response_format's checks ---------------------------------------------------------------------------------------
    ("CN1", F, 'WHITESPACE = r"[ \\t]?|\\n{1,2}[ \\t]{0,20}"', 'WHITESPACE = r"[ \\t]*|\\n*[ \\t]*"'),  # unbounded whitespace
    ("CN2", F, "    if not isinstance(response_format, dict) or not isinstance(response_format.get(\"type\"), str):",
     "    if not isinstance(response_format, dict):"),  # {"type": 3}: a TypeError / odd message
    ("CN3", F, "    if extra or (kind != \"json_schema\" and \"json_schema\" in response_format):",
     "    if extra:"),  # json_object with a json_schema field taken silently
    ("CN4", F, "        extra = sorted(set(js) - {\"name\", \"schema\", \"strict\", \"description\"})",
     "        extra = sorted(set(js) - {\"name\", \"schema\", \"strict\", \"description\", \"schemas\"})"),  # a typo'd 'schemas' silently ignored
    ("CN5", F, "        if not isinstance(name, str) or not NAME.fullmatch(name):", "        if not isinstance(name, str):"),  # a name with spaces taken
    ("CN6", F, "        if js.get(\"strict\") is not None and not isinstance(js[\"strict\"], bool):", "        if False:"),  # strict: "yes" taken
    ("CN7", F, "        schema = js.get(\"schema\", {})\n", "        schema = js.get(\"schema\", {\"type\": \"object\"})\n"),  # no schema: only objects (any JSON value before)
    ("CN8", F, "        if not isinstance(schema, dict):\n            raise ConfigError(\"response_format.json_schema.schema must",
     "        if False:\n            raise ConfigError(\"response_format.json_schema.schema must"),  # schema: [] taken
    ("CN9", F, "        raise ConfigError(\"response_format's schema is not JSON (or nested too deeply)\") from None",
     "        raise"),  # a NaN in the schema: ValueError out (a 500)
    ("CN10", F, "    check_schema_numbers(schema, \"response_format's schema\")\n", ""),  # 2**63 in a schema reaches llguidance
    ("CN11", F, "    if len(text) > _MAX_SCHEMA:", "    if len(text) > 100 * _MAX_SCHEMA:"),  # a huge schema compiled
    ("CN12", F, "    if err and not err.startswith(\"WARNING\"):", "    if err:"),  # a schema with a warning refused
    ("CN13", F, "    if err and not err.startswith(\"WARNING\"):", "    if False:"),  # a schema llguidance cannot use taken
    ("CN14", F, "        raise ConfigError(f\"response_format's schema: {str(e).splitlines()[0][:300]}\") from None",
     "        raise ConfigError(f\"response_format's schema: {str(e)}\") from None"),  # a multi-line message
    ("CN15", F, "        if re.match(r\"\\s*\\d+ \\| \", ln):\n            break", "        if re.match(r\"\\s*\\d+ \\| \", ln):\n            pass"),  # the grammar's listing in the error
    ("CN16", F, "    for ln in err.splitlines()[:4]:", "    for ln in err.splitlines()[:1]:"),  # a regex error: only its first line
    ("CN17", F, "raise ConfigError(f\"{at[:200]}: the integer {str(v)[:40]}", "raise EdgespecError(f\"{at[:200]}: the integer {str(v)[:40]}"),  # a 500 not a 400
    ("CN18", F, "JSON_SAFE_INT = 2 ** 53 - 1", "JSON_SAFE_INT = 2 ** 63 - 1"),  # 2**60 taken
    # -- the tool-call grammar ------------------------------------------------------------------------------------------
    ("CN19", F, "        if isinstance(choice, dict) and f[\"name\"] != choice[\"name\"]:\n            continue", "        if False:\n            continue"),  # a named choice lets other functions be called
    ("CN20", F, "        schema = (f.get(\"parameters\") or {\"type\": \"object\", \"properties\": {}, \"additionalProperties\": False}) \\",
     "        schema = (f.get(\"parameters\") or {\"type\": \"object\"}) \\"),  # a strict function without parameters: any arguments
    ("CN21", F, "            if f.get(\"strict\") else {\"type\": \"object\"}", "            if True else {\"type\": \"object\"}"),  # non-strict held to its parameters
    ("CN22", F, "        check_schema_numbers(schema, f\"tools[{i}].function.parameters\")  # (tools.check_tools does too)\n", ""),  # (tools does too: equivalent?)
    ("CN23", F, "        bounded = {**schema, \"x-guidance\": {**own, \"whitespace_pattern\": WHITESPACE}}", "        bounded = {**schema}"),  # unbounded whitespace in a call
    ("CN24", F, "    body = f'\"\\\\n\" call \"\\\\n\" <[{close_id}]>'", "    body = f'\"\\\\n\" call <[{close_id}]>'"),  # no newline before </tool_call>
    ("CN25", F, "        head = f\"start: block\" + (' (\"\\\\n\" block)* \"\\\\n\"?' if parallel else \"\")", "        head = f\"start: block\" + (' (\"\\\\n\" block)* \"\\\\n\"?' if True else \"\")"),  # parallel false: several calls
    ("CN26", F, "        head = f\"start: block\" + (' (\"\\\\n\" block)* \"\\\\n\"?' if parallel else \"\")", "        head = f\"start: block\" + (' (\"\\\\n\" block)*' if parallel else \"\")"),  # a newline after the last call refused (session note: loops)
    ("CN27", F, "    return LAZY + f\"{open_id}:\" + g if choice == \"auto\" else g", "    return g"),  # auto's grammar not lazy: the whole reply a call
    # -- Grammars ------------------------------------------------------------------------------------------------------
    ("CN28", F, "            if not trigger.isdigit() or not 0 <= int(trigger) < self.vocab:", "            if not trigger.isdigit():"),  # a trigger past the vocabulary
    ("CN29", F, "            self._matcher(llg, grammar)  # refused now if it does not compile (or cannot start)\n", ""),  # a bad lazy grammar refused only at its first block
    ("CN30", F, "blank=self.blank_ids() if self.think is not None else frozenset(), table=self.table)", "blank=frozenset(), table=self.table)"),  # a thinking model's blank start opens no thinking
    ("CN31", F, "        if self._text_encode is None:\n            return tok", "        if True:\n            return tok"),  # special tokens' text matched as the token
    ("CN32", F, "            special_token_ids = [i for i in range(n) if tok.is_special_token(i)]", "            special_token_ids = []"),
    ("CN33", F, "                self._blank = frozenset(i for i, t in enumerate(texts) if t and not t.strip())", "                self._blank = frozenset(i for i, t in enumerate(texts) if not t.strip())"),  # empty-text ids as blank
    ("CN34", F, "            if not m.is_error() and not first.any():", "            if False:"),  # a grammar with no first token accepted
    ("CN35", F, "            if \"NoExtensionBias\" in err:\n                raise ConfigError(f\"the reply's grammar (response_format or strict tools) cannot be used",
     "            if False:\n                raise ConfigError(f\"the reply's grammar (response_format or strict tools) cannot be used"),
    ("CN36", F, "        self.table = max(vocab, tokens or 0)", "        self.table = vocab"),  # Gemma 3's ids past the vocabulary: llguidance refuses the count
    # -- Constraint ------------------------------------------------------------------------------------------------------
    ("CN37", F, "            if i and draft[i - 1] in self.eos:\n                bits[i:] = -1\n                break",
     "            if i and draft[i - 1] in self.eos:\n                bits[i:] = 0\n                break"),  # rows after an EOS allow nothing (never read?)
    ("CN38", F, "            if i < n and draft[i] not in self.eos:", "            if i < n:"),  # an EOS consumed (llguidance keeps none)
    ("CN39", F, "        if fed:\n            self.m.rollback(fed)", "        if fed > 1:\n            self.m.rollback(fed)"),  # one drafted token left in the matcher
    ("CN40", F, "        if not allowed[0].any():\n            raise EdgespecError", "        if False:\n            raise EdgespecError"),  # a dead-end grammar: all -inf logits
    ("CN41", F, "        if int(token) in self.eos:\n            return False\n        if not self.m.consume_token(int(token)):",
     "        if False:\n            return False\n        if not self.m.consume_token(int(token)):"),  # a drafted EOS pushed
    ("CN42", F, "        n, self._pushed = self._pushed, 0\n        if n:\n            self.m.rollback(n)", "        n = self._pushed\n        if n:\n            self.m.rollback(n)"),  # pushed not reset: the next pop rolls back kept tokens
    ("CN43", F, "        if tokens and not self.m.consume_tokens([int(t) for t in tokens]):", "        if tokens and not self.m.consume_tokens([int(t) for t in tokens][:-1]):"),  # last kept token not consumed
    ("CN44", F, "    if \"lexer error\" in err or \"too many\" in err:", "    if \"lexer error\" in err:"),  # llguidance's 'too many' limit: a 500
    ("CN45", F, "    first = err.splitlines()[0][:300] if err else \"unknown error\"", "    first = err[:300] if err else \"unknown error\""),  # multi-line
    ("CN46", F, "        allowed = np.concatenate([allowed, np.repeat(allowed[-1:], len(rows) - len(allowed), axis=0)])",
     "        allowed = np.concatenate([allowed, np.ones((len(rows) - len(allowed), allowed.shape[1]), dtype=bool)])"),  # rows past the mask unmasked
    # -- LazyConstraint --------------------------------------------------------------------------------------------------
    ("CN47", F, "            return True, (None if t == self.think[1] else _THINKING)", "            return True, _THINKING"),  # never leaves the thinking: calls never held
    ("CN48", F, "            if m is _FIRST and t == self.think[0]:\n                return True, _THINKING", "            if False:\n                return True, _THINKING"),  # <think> at the start: a call in it held
    ("CN49", F, "            if m is _FIRST and t in self.blank:\n                return True, _FIRST", "            if False:\n                return True, _FIRST"),  # a blank before <think>: thinking not seen
    ("CN50", F, "            return True, (self.new() if t == self.trigger else None)", "            return True, (self.new() if t == self.trigger else m)"),  # stays _FIRST after free text
    ("CN51", F, "        if t in self.eos or m.validate_tokens([t]) != 1:", "        if m.validate_tokens([t]) != 1:"),  # EOS inside a block
    ("CN52", F, "        return True, (None if m.is_stopped() else m)", "        return True, m"),  # a closed block keeps its matcher: text after a call held
    ("CN53", F, "            self.m = _THINKING if starts_inside(prompt_ids, self.think) else _FIRST", "            self.m = _FIRST"),  # template-opened thinking not seen
    ("CN54", F, "            if not rows[-1][t]:\n                break", "            if False:\n                break"),
    ("CN55", F, "            rows.append(np.ones(self.vocab, dtype=bool) if t in self.eos else self._mask(m))", "            rows.append(self._mask(m))"),
    ("CN56", F, "            if not ok and int(t) not in self.eos:\n                raise EdgespecError", "            if False:\n                raise EdgespecError"),  # a kept token outside the grammar unnoticed
    ("CN57", F, "        return self._mask(self._work if self._pushed else self.m)", "        return self._mask(self.m)"),  # a model drafter's mask ignores its own draft
    ("CN58", F, "        if not self._pushed:\n            self._work, self._pushed = self._copy(self.m), True",
     "        if not self._pushed:\n            self._work, self._pushed = self.m, True"),  # drafting advances the real matcher
    ("CN59", F, "        if m.is_error():  # (a failed matcher allows the end of sequence only", "        if False:  # (a failed matcher allows the end of sequence only"),
]
