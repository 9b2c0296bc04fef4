"""Mutants of edgespec/template.py (session 95): a second pass after session 74's (36 mutants) over the chat
template's sandbox, its limits, transformers' extras (tojson, strftime_now, the generation tag) and the request's
template kwargs. Run from the copy:
  python run.py template_mut.py tests/test_hardening.py tests/test_fuzz.py tests/test_reasoning.py \
      --k "template or kwargs"
"""
T = "edgespec/template.py"
MUTANTS = [
    ("TP1", T, '_PERCENT_WIDTH = re.compile(r"%[-+ #0]*(?:\\*|\\d{7,})")', '_PERCENT_WIDTH = re.compile(r"%(?:\\*|\\d{7,})")'),  # '%-30000000s': flags not skipped
    ("TP2", T, '_PERCENT_WIDTH = re.compile(r"%[-+ #0]*(?:\\*|\\d{7,})")', '_PERCENT_WIDTH = re.compile(r"%[-+ #0]*(?:\\d{7,})")'),  # '%*s' taken
    ("TP3", T, '_WIDE = re.compile(r"\\d{7,}")', '_WIDE = re.compile(r"\\d{8,}")'),  # 7-digit str.format width
    ("TP4", T, "    except ValueError:  # (malformed: format itself refuses it)\n        return False", "    except ValueError:  # (malformed: format itself refuses it)\n        return True"),  # malformed: 'width' message instead of format's own
    ("TP5", T, '    return any(spec and ("{" in spec or _WIDE.search(spec)) for _, _, spec, _ in fields)', '    return any(spec and _WIDE.search(spec) for _, _, spec, _ in fields)'),  # nested field width taken
    ("TP6", T, '    return any(spec and ("{" in spec or _WIDE.search(spec)) for _, _, spec, _ in fields)', '    return any(_WIDE.search(lit + (spec or "")) for lit, _, spec, _ in fields)'),  # a 7-digit number in the text refused
    ("TP7", T, "        if time.perf_counter() > self.deadline:", "        if time.perf_counter() > self.deadline + 60:"),  # no time limit (the harness's timeout)
    ("TP8", T, "    return len(v) if isinstance(v, (str, bytes, list, tuple)) else 0", "    return len(v) if isinstance(v, str) else 0"),  # lists' sizes not counted
    ("TP9", T, "    if n > SIZE_LIMIT:", "    if n >= SIZE_LIMIT:"),  # the limit itself refused
    ("TP10", T, "                if isinstance(a, int):\n                    _check_size(a, f\"str.{name} width\")", "                if isinstance(a, str):\n                    _check_size(a, f\"str.{name} width\")"),  # widths unchecked
    ("TP11", T, '_WIDTH_METHODS = {"center", "ljust", "rjust", "zfill", "expandtabs"}', '_WIDTH_METHODS = {"center", "ljust", "rjust"}'),  # zfill/expandtabs unchecked
    ("TP12", T, "            count = owner.count(args[0]) if args[0] else len(owner) + 1\n", "            count = owner.count(args[0])\n"),  # empty old: no count
    ("TP13", T, '            _check_size(len(owner) + count * max(0, len(args[1]) - len(args[0])), "str.replace result")', '            _check_size(len(owner) + count * len(args[1]) - len(args[0]), "str.replace result")'),  # (near)
    ("TP14", T, "            items = list(args[0]) if args else []\n            _check_size(sum(_size(x) for x in items) + len(owner) * len(items), \"str.join result\")\n            args = (items,) + tuple(args[1:])", "            items = list(args[0]) if args else []\n            _check_size(sum(_size(x) for x in items) + len(owner) * len(items), \"str.join result\")"),  # generator consumed, then joined empty
    ("TP15", T, '        elif name in ("format", "format_map") and _format_too_wide(owner):', '        elif False:'),  # (older jinja2s; equivalent since 3.1.5)
    ("TP16", T, '            self.write("environment.sized(")\n            super().visit_Concat(node, frame)\n            self.write(")")', '            super().visit_Concat(node, frame)'),  # ~ unchecked
    ("TP17", T, '        intercepted_binops = frozenset(["*", "**", "+", "%"])', '        intercepted_binops = frozenset(["*", "**", "+"])'),  # % not intercepted
    ("TP18", T, '            if wrapped is not None and _format_too_wide(value.__self__):', '            if False:'),  # format wrapped, width unchecked
    ("TP19", T, "                    if _size(seq) and isinstance(n, int):", "                    if _size(seq) and isinstance(n, int) and n > 0 and seq is left:"),  # 1000000 * 'x' (int on the left)
    ("TP20", T, "                        left.bit_length() + right.bit_length() > 8 * SIZE_LIMIT:", "                        left.bit_length() * right.bit_length() > 8 * SIZE_LIMIT:"),  # small products refused
    ("TP21", T, '            elif operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:', '            elif operator == "**" and isinstance(right, int) and abs(right) > 64:'),  # 2 ** 1000.0: float exponent
    ("TP22", T, '            elif operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:', '            elif operator == "**" and isinstance(right, (int, float)) and right > 64:'),  # 2 ** -100 (float, fine: equivalent-ish)
    ("TP23", T, "                  and left.bit_length() * right > 8 * SIZE_LIMIT):", "                  and left.bit_length() * right > 64 * SIZE_LIMIT):"),  # power's bits
    ("TP24", T, '                _check_size(_size(left) + _size(right), "a concatenation")', '                _check_size(max(_size(left), _size(right)), "a concatenation")'),  # doubling to 2x limit
    ("TP25", T, '            elif operator == "%" and isinstance(left, str) and _percent_too_wide(left):', '            elif operator == "%" and isinstance(right, str) and _percent_too_wide(right):'),  # % width unchecked
    ("TP26", T, "            args = _checked_call(__obj, args, kwargs)\n", ""),  # method calls unchecked
    ("TP27", T, '        raise TemplateError(msg)', '        raise ValueError(msg)'),  # raise_exception's message: "failed: ValueError:"
    ("TP28", T, '            return nodes.Scope(body, lineno=lineno)', '            return nodes.Output([], lineno=lineno)'),  # the generation tag's body dropped
    ("TP29", T, '    env = LimitedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", Generation])', '    env = LimitedSandbox(trim_blocks=False, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", Generation])'),  # trim_blocks (transformers' setting)
    ("TP30", T, '    env = LimitedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", Generation])', '    env = LimitedSandbox(trim_blocks=True, lstrip_blocks=False, extensions=["jinja2.ext.loopcontrols", Generation])'),  # lstrip_blocks
    ("TP31", T, '    env = LimitedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", Generation])', '    env = LimitedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[Generation])'),  # {% break %} unknown
    ("TP32", T, '    env.globals["range"] = _bounded_range', '    pass'),  # range unbounded
    ("TP33", T, '    env.globals.pop("lipsum", None)', '    pass'),  # lipsum stays
    ("TP34", T, '    for name in ("urlize", "pprint"):', '    for name in ("urlize",):'),  # pprint stays
    ("TP35", T, '    env.filters["tojson"] = _tojson', '    pass'),  # jinja2's tojson (HTML-escaped, no ensure_ascii=False)
    ("TP36", T, '    for name in ("center", "indent", "replace", "join", "format", "wordwrap", "truncate"):', '    for name in ("center", "replace", "join", "format", "wordwrap", "truncate"):'),  # indent width unchecked
    ("TP37", T, "def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):", "def _tojson(x, ensure_ascii=True, indent=None, separators=None, sort_keys=False):"),  # non-ASCII escaped
    ("TP38", T, "def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):", "def _tojson(x, indent=None, ensure_ascii=False, separators=None, sort_keys=False):"),  # positional order
    ("TP39", T, "    if indent is not None and (_size(indent) if isinstance(indent, str) else abs(int(indent))) > _MAX_INDENT:", "    if indent is not None and not isinstance(indent, str) and int(indent) > _MAX_INDENT:"),  # a long string indent
    ("TP40", T, "    if separators is not None and sum(_size(s) for s in separators) > _MAX_INDENT:", "    if False:"),  # huge separators
    ("TP41", T, "    if not isinstance(fmt, str) or len(fmt) > _MAX_INDENT:", "    if len(fmt) > _MAX_INDENT:"),  # strftime_now(5): TypeError message
    ("TP42", T, "    return datetime.now().strftime(fmt)", "    return datetime.utcnow().strftime(fmt)"),  # (UTC: equivalent where TZ is UTC)
    ("TP43", T, "    passes = hasattr(f, \"jinja_pass_arg\")  # its first argument is jinja2's context or environment", "    passes = False"),  # context taken as the value
    ("TP44", T, '        if name in ("center", "indent", "wordwrap", "truncate"):\n            for a in vals[1:]:', '        if name in ("center", "indent", "wordwrap", "truncate"):\n            for a in vals[2:]:'),  # the first width unchecked
    ("TP45", T, "            count = s.count(old) if old else len(s) + 1\n            _check_size", "            count = s.count(old)\n            _check_size"),  # replace filter: empty old
    ("TP46", T, '            sep = vals[1] if len(vals) > 1 and isinstance(vals[1], str) else ""', '            sep = ""'),  # join filter: separator not counted
    ("TP47", T, "            args = (*args[:at], items, *args[at + 1:])", "            pass"),  # map's generator read, then joined empty
    ("TP48", T, '        elif name == "format" and vals and isinstance(vals[0], str) and _percent_too_wide(vals[0]):', '        elif False:'),  # format filter width
    ("TP49", T, '    for attr in ("jinja_pass_arg",):\n        if hasattr(f, attr):\n            setattr(guarded, attr, getattr(f, attr))', '    pass'),  # pass-arg lost: env not given
    ("TP50", T, "        if not isinstance(source, str):\n            raise BundleError", "        if source is None:\n            raise BundleError"),  # a number as the template
    ("TP51", T, "        except (TemplateError, RecursionError, MemoryError, ValueError, SyntaxError) as e:", "        except (TemplateError, RecursionError, MemoryError, ValueError) as e:"),  # {% break %} outside a loop: SyntaxError out
    ("TP52", T, '            if event == "line":\n                limits.tick()', '            if event == "call":\n                limits.tick()'),  # lines not timed
    ("TP53", T, '            elif event == "return":\n                limits.depth -= 1', '            elif event == "exception":\n                limits.depth -= 1'),  # returns not counted
    ("TP54", T, "            if frame.f_code.co_filename != code:\n                return None", "            if False:\n                return None"),  # jinja2's own frames counted (depth)
    ("TP55", T, "            if limits.depth > DEPTH_LIMIT:", "            if limits.depth > DEPTH_LIMIT * 100:"),  # the depth limit (Python's recursion limit then)
    ("TP56", T, "                size += len(chunk)\n", "                size = len(chunk)\n"),  # the output's size per piece
    ("TP57", T, "            sys.settrace(previous)", "            sys.settrace(None)"),  # a caller's tracer (coverage, a debugger) dropped
    ("TP58", T, '        except RecursionError:\n            raise ChatTemplateError("chat template: recursion too deep") from None\n', ''),  # (generic handler)
    ("TP59", T, '            raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {_first_line(e)}") from None', '            raise'),  # foreign exceptions out
    ("TP60", T, 'RESERVED = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "raise_exception",\n                      "range", "documents"})', 'RESERVED = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "raise_exception",\n                      "documents"})'),  # kwargs may replace range
    ("TP61", T, "    if kw is None:\n        return {}", "    if not kw:\n        return {}"),  # [] / "" taken as none
    ("TP62", T, "        if not isinstance(k, str) or not k.isidentifier():", "        if not isinstance(k, str):"),  # 'a b' taken
    ("TP63", T, "        text = json.dumps(kw, allow_nan=False)", "        text = json.dumps(kw)"),  # NaN taken
    ("TP64", T, "    if len(text) > KWARGS_LIMIT:", "    if len(text) > KWARGS_LIMIT * 2:"),  # 70,000 characters taken
    ("TP65", T, "    check_unicode(json.dumps(out, ensure_ascii=False), where)", "    pass"),  # lone surrogates taken
    ("TP66", T, "    return out\n\n\ndef _first_line", "    return kw\n\n\ndef _first_line"),  # the caller's object (tuples, shared) given to the template
    ("TP67", T, "    return (text.splitlines()[0] if text else type(e).__name__)[:300]", "    return text[:300] if text else type(e).__name__"),  # several lines
]
