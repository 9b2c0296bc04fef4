"""Structured outputs (edgespec/constrain.py, OpenAI's response_format): the decoder's masking on fake
models against the exact masked distribution (greedy equal under every drafter; sampled by a chi-square
test, and a planted bug it catches), then llguidance's JSON schemas on a tiny exported model and through
``edgespec serve``."""
from __future__ import annotations

import json

import numpy as np
import pytest

import edgespec
from edgespec import constrain
from edgespec.constrain import grammar_for, tool_call_grammar
from edgespec.decoder import Decoder, GenerationConfig, Stats
from edgespec.drafters import ModelDrafter, PromptLookupDrafter
from edgespec.errors import ConfigError, EdgespecError
from edgespec.sampling import SamplingParams, probs
from test_decoder import _chi2, _chi2_crit, run
from tiny import FakeLM, split_runs

pytest.importorskip("llguidance")

VOCAB = 4


def rule(reply, t) -> bool:
    """The fake grammar: a reply does not start with token 0 and never repeats its last token."""
    return t != (reply[-1] if reply else 0)


class RuleConstraint:
    """``constrain.Constraint``'s protocol over a fake vocabulary, ``rule`` as its grammar."""

    def __init__(self):
        self.reply = []
        self.pushed = []
        self.cuts = []  # (draft length, tokens allowed) of every verify call's masks

    def mask(self):
        return np.array([rule(self.reply + self.pushed, t) for t in range(VOCAB)], dtype=bool)

    def push(self, t):
        assert rule(self.reply + self.pushed, t)
        self.pushed.append(t)
        self.longest = max(getattr(self, "longest", 0), len(self.pushed) + 1)  # the draft's length so far
        return True

    def pop(self):
        self.pushed = []

    def masks(self, draft):
        rows, reply, n = [], list(self.reply), 0
        rows.append([rule(reply, t) for t in range(VOCAB)])
        for t in draft:
            if not rows[-1][t]:
                break
            reply.append(t)
            n += 1
            rows.append([rule(reply, u) for u in range(VOCAB)])
        self.cuts.append((len(draft), n))
        return np.array(rows, dtype=bool), n

    def consume(self, tokens):
        for t in tokens:
            assert rule(self.reply, t), (self.reply, t)
            self.reply.append(t)


def make(seed=7, noise=1.0):
    target = FakeLM(VOCAB, seed=seed, sharpness=1.0, reuse_buffer=True)
    dl = FakeLM(VOCAB, table=target.table + np.random.default_rng(3).normal(0, noise, target.table.shape),
                reuse_buffer=True)
    dec = Decoder(target, (), drafters=[ModelDrafter(dl, VOCAB), PromptLookupDrafter()])
    dec.constraints = lambda grammar: RuleConstraint()
    return dec


def exact_masked(prompt, n, sp, seed=7):
    lm = FakeLM(VOCAB, seed=seed, sharpness=1.0)
    out = {}

    def walk(ctx, reply, p):
        if len(reply) == n:
            out[tuple(reply)] = p
            return
        row = lm.logits_for(ctx).copy()
        row[[not rule(reply, t) for t in range(VOCAB)]] = -np.inf
        pr = probs(row[None], sp)[0]
        for t in range(VOCAB):
            walk(ctx + [t], reply + [t], p * pr[t])
    walk(list(prompt), [], 1.0)
    return out


PROMPT = [1, 2, 1, 2, 1]


def test_greedy_output_held_to_the_grammar_is_the_same_under_every_drafter():
    dec = make()
    changed = 0
    for prompt in (PROMPT, [3, 3, 0, 1], [0], [2, 2], [0, 3, 2]):
        ref, _ = run(dec, prompt, max_new_tokens=40, drafter="none", grammar="g")
        assert all(rule(ref[:i], t) for i, t in enumerate(ref)), ref
        free, _ = run(dec, prompt, max_new_tokens=40, drafter="none")
        changed += free != ref
        for d, k in (("model", 3), ("model", None), ("prompt-lookup", None), ("auto", None)):
            got, _ = run(dec, prompt, max_new_tokens=40, drafter=d, draft_tokens=k, grammar="g")
            assert got == ref, (prompt, d, k)
    assert changed  # the grammar changed some of the replies


def _counts(sp, runs, drafter, k=3, n=4):
    """At 4 new tokens a round verifies two draft tokens and their masks (at 3 only one; session 55, a review)."""
    def work(seeds):
        dec = make()
        counts: dict = {}
        deep = 0
        for i in seeds:
            st = Stats()
            out, _ = run(dec, PROMPT, st, max_new_tokens=n, temperature=sp.temperature, top_k=sp.top_k,
                         top_p=sp.top_p, seed=i, drafter=drafter, draft_tokens=k, grammar="g")
            counts[tuple(out)] = counts.get(tuple(out), 0) + 1
            deep += len(st.drafted_by_position) > 1 and st.drafted_by_position[1] > 0
        return counts, deep

    counts, deep = split_runs(work, runs)
    # blocks of two draft tokens verified (prompt lookup finds no two-token copy in this prompt under the grammar)
    assert deep >= runs // 20 or drafter == "prompt-lookup", deep
    return _chi2(counts, exact_masked(PROMPT, n, sp), runs)


@pytest.mark.parametrize("drafter, sp, grammar_drafts", [
    ("model", SamplingParams(1.0), True), ("model", SamplingParams(1.0), False),
    ("auto", SamplingParams(0.7, top_k=3), True), ("prompt-lookup", SamplingParams(1.3, top_p=0.8), True)])
def test_sampled_output_follows_the_masked_distribution(drafter, sp, grammar_drafts, monkeypatch):
    monkeypatch.setattr(ModelDrafter, "takes_grammar", grammar_drafts)
    stat, df = _counts(sp, 4000, drafter)
    assert stat < _chi2_crit(df), f"chi2 {stat:.1f} with {df} dof"


def test_a_model_drafter_drafts_with_the_grammar():
    """Its drafts never hold a forbidden token (greedy and sampled); without the grammar they do, and are
    cut there. (What it buys on a real pair: scripts/bench_structured.py.)"""
    for temperature in (0.0, 1.0):
        made = []
        dec = make()
        dec.constraints = lambda grammar: made.append(RuleConstraint()) or made[-1]
        st_with = Stats()
        run(dec, PROMPT, stats=st_with, max_new_tokens=60, drafter="model", draft_tokens=3, grammar="g",
            temperature=temperature, seed=1)
        cuts = made[-1].cuts
        assert cuts and all(n == k for k, n in cuts), cuts
        assert max(k for k, _ in cuts) == 3 and made[-1].longest >= 3  # drafts of several tokens, pushed
        ModelDrafter.takes_grammar = False
        try:
            st_without = Stats()
            run(dec, PROMPT, stats=st_without, max_new_tokens=60, drafter="model", draft_tokens=3, grammar="g",
                temperature=temperature, seed=1)
            assert any(n < k for k, n in made[-1].cuts)
        finally:
            ModelDrafter.takes_grammar = True


def test_the_statistical_test_catches_a_draft_cut_at_a_forbidden_token_under_sampling(monkeypatch):
    """Plant a bug that looks harmless: cut a sampled model draft at its first forbidden token (as greedy
    rounds may). The row after the cut then samples from p instead of the residual max(p - q, 0). (The
    model drafter drafts with the grammar, so its drafts hold no forbidden token: here it does not, as a
    drafter that cannot.)"""
    monkeypatch.setattr(ModelDrafter, "takes_grammar", False)
    real = RuleConstraint.masks

    def masks(self, draft):
        allowed, n = real(self, draft)
        if n < len(draft):
            draft[n:] = []  # the decoder's draft list, cut in place
        return allowed, n

    monkeypatch.setattr(RuleConstraint, "masks", masks)
    stat, df = _counts(SamplingParams(1.0), 4000, "model")
    assert stat > _chi2_crit(df), f"the planted bug went unnoticed (chi2 {stat:.1f}, {df} dof)"


def test_the_statistical_test_catches_verify_rows_left_unmasked(monkeypatch):
    monkeypatch.setattr(ModelDrafter, "takes_grammar", False)  # drafts with forbidden tokens to accept
    real = constrain.masked
    monkeypatch.setattr("edgespec.decoder.masked", lambda rows, allowed: rows if len(rows) > 1 else real(rows, allowed))
    monkeypatch.setattr(RuleConstraint, "consume", lambda self, tokens: self.reply.extend(tokens))  # no check
    stat, df = _counts(SamplingParams(1.0), 3000, "model")
    assert stat > _chi2_crit(df), f"the planted bug went unnoticed (chi2 {stat:.1f}, {df} dof)"


FORMAT_ERRORS = [
    ("json", "response_format must be"),
    ({"type": "xml"}, "response_format.type must be"),
    ({"type": "json_object", "schema": {}}, "unknown field 'schema'"),
    ({"type": "json_object", "json_schema": {}}, "unknown field 'json_schema'"),
    ({"type": "json_schema"}, "json_schema must be an object"),
    ({"type": "json_schema", "json_schema": {"schema": {}}}, r"name must be 1-64 letters, digits, _ or - \(it is missing\)"),
    ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}, "name must be 1-64 letters"),
    ({"type": "json_schema", "json_schema": {"name": "x" * 65, "schema": {}}}, "name must be 1-64 letters"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}, "must be a JSON Schema object"),
    ({"type": "json_schema", "json_schema": {"name": "x", "strict": "yes"}}, "strict must be"),
    ({"type": "json_schema", "json_schema": {"name": "x", "format": 1}}, "unknown field 'format'"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schemas": {}}}, "unknown field 'schemas'"),  # (a typo)
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}, "objectx"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"a": float("inf")}}}, "not JSON"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "[a-"}}},
     "regex parse error: .*unclosed character class"),  # (the error's later lines say why)
    # (session 55, a review) integers llguidance crashed the process on (SIGSEGV: bounds near -2**63), clamped (a
    # reply of 2**63 - 1 that finished 'stop' under a minimum of 10**20) or rounded (a const of 23 digits)
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "integer", "minimum": -2 ** 63, "maximum": -2 ** 63 + 8}}}, r"schema\.(minimum|maximum): the integer -9223"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "integer", "minimum": 10 ** 20, "maximum": 10 ** 20 + 5}}}, r"past \+-\(2\*\*53 - 1\)"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "properties": {"a": {"const": 12345678901234567890123}}}}}, r"schema\.properties\.a\.const: the integer"),
    # (session 94, a mutation test of constrain.py) the first integer past the bound, and a schema past its size
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "integer", "maximum": 2 ** 53}}}, r"schema\.maximum: the integer 9007199254740992 is past"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "description": "x" * (1 << 20)}}},
     r"has 1048\d{3} characters; at most 1048576"),
]


@pytest.mark.parametrize("fmt, message", FORMAT_ERRORS, ids=[str(i) for i in range(len(FORMAT_ERRORS))])
def test_a_malformed_response_format_is_a_config_error(fmt, message):
    with pytest.raises(ConfigError, match=message) as e:
        grammar_for(fmt)
    assert "\n" not in str(e.value)  # (one line: llguidance's messages span several)


_CHAIN = """
import json, sys
sys.path.insert(0, "tests")
from edgespec.constrain import Grammars, grammar_for, tool_call_grammar
from edgespec.errors import ConfigError
from tiny import make_tokenizer
tok = make_tokenizer()
grammars = Grammars(tok.backend_tokenizer.to_str(), len(tok), [tok.eos_token_id])
for case in sys.argv[1:]:
    n, wrap, where = case.split(":")
    n = int(n)
    ref = lambda i: {"$ref": f"#/$defs/d{i}"}
    level = {"ref": ref, "object": lambda i: {"type": "object", "properties": {"a": ref(i)}, "required": ["a"]},
             "anchor": lambda i: {"$anchor": f"x{i - 1}", "$ref": f"#x{i}"}}[wrap]
    defs = {f"d{i}": level(i + 1) for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"} if wrap != "anchor" else {"$anchor": f"x{n}", "type": "integer"}
    top = "#/$defs/d0" if wrap != "anchor" else "#x0"
    print(case, end=" ", flush=True)
    try:
        if where == "format":
            g = grammar_for({"type": "json_schema", "json_schema": {"name": "t", "schema": {"$defs": defs, "$ref": top}}})
            text = '{"a": ' * n + "7" + "}" * n if wrap == "object" else "7"
        else:
            params = {"type": "object", "properties": {"x": {"$ref": top}}, "required": ["x"], "$defs": defs}
            g = tool_call_grammar([{"type": "function", "function": {"name": "f", "strict": True, "parameters": params}}],
                                  "required", False, tok.convert_tokens_to_ids("<|im_start|>"),
                                  tok.convert_tokens_to_ids("<|im_end|>"))
            text = None
        c = grammars.constraint(g)
        if text is not None:  # the reply the schema holds, token by token, then its end
            for t in tok.encode(text):
                assert c.mask()[t], t
                c.push(t)
            assert c.mask()[tok.eos_token_id]
        print("compiled", flush=True)
    except ConfigError as e:
        print("refused:", e, flush=True)
"""


def test_schemas_whose_refs_nest_deep_compile_and_hold_the_reply():
    """(session 53, reviews) A flat 88 KB schema, a chain of 2,500 $refs (or 1,000 that each wrap the next in
    properties), overflowed llguidance's recursion on the thread's 8 MiB stack as it compiled: a segfault, the
    server gone with one request. Its compiles run on a thread with a 256 MiB stack now: such schemas compile (a
    chain of $refs, of $anchors, of objects, a strict tool's), their matchers hold the reply to them (run apart: a
    crash fails this test, not the suite)."""
    import subprocess
    import sys

    cases = ["2500:ref:format", "2500:anchor:format", "1500:object:format", "1000:object:tool"]
    r = subprocess.run([sys.executable, "-c", _CHAIN, *cases], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    assert [ln for ln in r.stdout.splitlines() if ln.strip()] == [f"{c} compiled" for c in cases], r.stdout


def test_a_recursive_schema_still_compiles():
    """A schema that refers back to itself (a tree)."""
    tree = {"type": "object", "properties": {"name": {"type": "string"},
                                             "children": {"type": "array", "items": {"$ref": "#"}}}}
    assert grammar_for({"type": "json_schema", "json_schema": {"name": "tree", "schema": tree}})


def test_text_is_no_format_and_a_grammar_excludes_ignore_eos():
    assert grammar_for(None) is None and grammar_for({"type": "text"}) is None
    with pytest.raises(ConfigError, match="ignore_eos"):
        GenerationConfig(grammar="x", ignore_eos=True)
    with pytest.raises(ConfigError, match="grammar must be"):
        GenerationConfig(grammar=5)


SCHEMA = {"type": "json_schema", "json_schema": {"name": "pick", "schema": {
    "type": "object", "additionalProperties": False, "required": ["n", "ok", "colour"],
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"},
                   "colour": {"enum": ["red", "green", "blue"]}}}}}


def check(text):
    obj = json.loads(text)
    assert set(obj) == {"n", "ok", "colour"} and 0 <= obj["n"] <= 99 and isinstance(obj["ok"], bool)
    assert obj["colour"] in ("red", "green", "blue")


def test_a_grammar_given_as_an_option_with_a_bad_trigger_is_a_config_error(tiny_bundle):
    """(session 46) generate(grammar="edgespec-lazy:abc:...") was a bare ValueError (int('abc'))."""
    import edgespec
    from edgespec.constrain import LAZY

    eng = edgespec.load(tiny_bundle, memory=False)
    for trigger in ("abc", "-1", str(10**6), ""):
        with pytest.raises(ConfigError, match="trigger must be a token id"):
            eng.generate("hi", max_new_tokens=4, grammar=f'{LAZY}{trigger}:start: "x"')
    # (session 94, a mutation test) a lazy grammar that does not compile is refused before the reply, not at the
    # first block its trigger opens (if the reply has one)
    with pytest.raises(ConfigError, match='unknown name: "nonsense"'):
        eng.generate("hi", max_new_tokens=4, grammar=f"{LAZY}5:start: nonsense")


def test_special_tokens_are_no_text_of_a_grammar_and_a_grammar_of_no_token_is_refused(tiny_bundle):
    """(session 94, a mutation test of constrain.py) llguidance reads the added tokens as special, so a grammar's text
    (a JSON string) is never written with one: the reply's text leaves special tokens out, and would lose it. And a
    grammar whose only first token is an id past the model's rows (a tokenizer's special id past the vocabulary, as
    Gemma 3's) allows no first token: refused before the reply (it was a failure at the first verify call)."""
    import edgespec
    from edgespec.constrain import Grammars

    eng = edgespec.load(tiny_bundle, memory=False)
    tok = eng.tokenizer
    specials = sorted(tok.special_ids())
    assert specials
    con = eng.decoder.constraints(grammar_for({"type": "json_schema", "json_schema": {
        "name": "s", "schema": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}}))
    con.consume(tok.encode('{"a": "', add_special=False))
    mask = con.mask()
    assert mask[tok.encode("x", add_special=False)[0]] and not mask[specials].any()
    vocab = eng.decoder.vocab
    rows = Grammars(tok._tok.to_str(), vocab - 1, eng.manifest.eos_token_ids, tokens=vocab)
    with pytest.raises(ConfigError, match="allows no first token"):
        rows.constraint(f"start: <[{vocab - 1}]>")
    assert rows.constraint(f"start: <[{vocab - 2}]>").mask()[vocab - 2]


def test_json_schema_replies_of_a_tiny_model_under_every_drafter(tiny_bundle):
    eng = edgespec.load(tiny_bundle, memory=False)
    msgs = [{"role": "user", "content": "Pick a number, a truth and a colour."}]
    ref = eng.generate(msgs, response_format=SCHEMA, max_new_tokens=120, temperature=0, drafter="none")
    assert ref.finish_reason == "eos", ref
    check(ref.text)
    for d in ("model", "prompt-lookup", "auto"):
        r = eng.generate(msgs, response_format=SCHEMA, max_new_tokens=120, temperature=0, drafter=d)
        assert r.token_ids == ref.token_ids, d
    for d in ("model", "auto"):  # sampled: every reply is held to the schema
        for seed in range(4):
            r = eng.generate(msgs, response_format=SCHEMA, max_new_tokens=120, temperature=1.0, seed=seed, drafter=d)
            assert r.finish_reason == "eos", (d, seed, r.text)
            check(r.text)
    r = eng.generate(msgs, response_format={"type": "json_object"}, max_new_tokens=200, temperature=0)
    if r.finish_reason == "eos":  # a random model may run out of tokens inside a string
        assert isinstance(json.loads(r.text), dict)
    else:
        assert r.text.lstrip().startswith("{")
    with pytest.raises(ConfigError, match="objectx"):
        eng.generate(msgs, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "objectx"}}})
    # a schema that compiles but cannot start (it is only itself): a ConfigError before the model runs, not an
    # EdgespecError at the first token (a 500 on the server)
    with pytest.raises(ConfigError, match="refers to itself"):
        eng.generate(msgs, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "$ref": "#"}}})
    # one that starts but refers to itself below the top with no way out: llguidance fails where the reply reaches
    # it, mid-generation: a ConfigError still (was an EdgespecError: a 500), under every drafter
    loops = ({"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}, "required": ["a"]},
             {"type": "array", "items": {"$ref": "#/items"}, "minItems": 1},
             {"$defs": {"x": {"$ref": "#/$defs/y"}, "y": {"$ref": "#/$defs/x"}}, "type": "object",
              "properties": {"a": {"$ref": "#/$defs/x"}}, "required": ["a"]})
    for schema in loops:
        for d in ("none", "model"):
            with pytest.raises(ConfigError, match="refers to itself"):
                eng.generate(msgs, response_format={"type": "json_schema", "json_schema": {"name": "x",
                                                                                          "schema": schema}},
                             max_new_tokens=40, temperature=0, drafter=d)


def test_a_schema_whose_fixed_text_is_a_special_tokens_text_spells_it_as_text(tiny_bundle):
    """(session 48, a review) llguidance encoded a grammar's fixed text (a const, an enum's one value, a property's
    name) matching added tokens: "<|im_start|>" came out as that special token, which no grammar's bytes match (the
    generation failed: an EdgespecError, a 500), and a const "<|im_end|>" (the end of sequence) ended the reply
    inside its string. The text is spelled as text now, and the reply is the schema's."""
    eng = edgespec.load(tiny_bundle, memory=False)
    msgs = [{"role": "user", "content": "Fill it in."}]
    specials = set(eng.tokenizer.special_ids())
    schema = {"type": "object", "additionalProperties": False, "required": ["<|im_start|>", "end", "kind"],
              "properties": {"<|im_start|>": {"const": 1}, "end": {"const": "<|im_end|>"},
                             "kind": {"enum": ["a<|endoftext|>b"]}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    ref = None
    for d in ("none", "model", "auto"):
        r = eng.generate(msgs, response_format=fmt, max_new_tokens=300, temperature=0, drafter=d)
        assert r.finish_reason == "eos", (d, r.text)
        assert json.loads(r.text) == {"<|im_start|>": 1, "end": "<|im_end|>", "kind": "a<|endoftext|>b"}
        assert not specials & set(r.token_ids[:-1]), r.token_ids  # (the last: the end of sequence)
        ref = ref or r.token_ids
        assert r.token_ids == ref, d


@pytest.mark.parametrize("scheme", ["first", "always", "legacy", "bytelevel"])
def test_a_grammars_fixed_text_is_spelled_without_a_sentencepiece_prefix_space(tmp_path, scheme):
    """(session 48, the diff's review) The grammar's fixed text spelled as text: on a SentencePiece-style tokenizer
    (Llama 2, Mistral, Phi-3) the text encoding adds a "▁" before a text, which llguidance then could not place
    (every response_format failed there, json_object too). ``encode_text_piece`` spells text as it stands inside a
    longer one: the const, holding a special token's text, is accepted in ordinary tokens, and the end follows."""
    from tokenizers import AddedToken, Tokenizer as HF, decoders, models, normalizers, pre_tokenizers

    from edgespec.constrain import Grammars, grammar_for
    from edgespec.tokenizer import Tokenizer

    if scheme == "bytelevel":
        hf = HF(models.BPE(vocab={**{c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}}, merges=[]))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
    else:
        vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
        for piece in ("\u2581", "a", "b", "\u2581a", "ab"):
            vocab[piece] = len(vocab)
        hf = HF(models.BPE(vocab=vocab, merges=[("\u2581", "a"), ("a", "b")], unk_token="<unk>", byte_fallback=True))
        if scheme == "legacy":
            hf.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        else:
            hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme, split=False)
        hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<s>", "</s>")])
    (tmp_path / "t").mkdir()
    hf.save(str(tmp_path / "t" / "tokenizer.json"))
    tok = Tokenizer(tmp_path / "t")
    eos = tok._tok.token_to_id("</s>")
    assert tok._tok.decode(tok.encode_text_piece("ab x"), skip_special_tokens=False) == "ab x"
    gr = Grammars(tok._tok.to_str(), tok.vocab_size, [eos], text_encode=tok.encode_text_piece)
    gr.constraint(grammar_for({"type": "json_object"}))  # (a llguidance panic: a ConfigError)
    c = gr.constraint(grammar_for({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"const": "ab</s>x"}}, "required": ["a"], "additionalProperties": False}}}))
    reply = tok.encode_text_piece('{"a": "ab</s>x"}')
    assert eos not in reply and c.m.validate_tokens(reply) == len(reply)
    assert c.m.consume_tokens(reply) and _allowed_after(c, eos)


def _allowed_after(c, token: int) -> bool:
    allowed, _ = c.masks([])
    return bool(allowed[0][token])


def test_an_end_of_sequence_in_a_draft_leaves_the_grammar_where_it_was(tiny_bundle):
    """llguidance keeps no end of sequence in the history it rolls back: a draft that holds one (or a
    drafter that pushes one) must not roll the grammar back past where it was (the tiny model's sampled
    replies went on after the closing brace when it did)."""
    eng = edgespec.load(tiny_bundle, memory=False)
    con = eng.decoder.constraints(grammar_for(SCHEMA))
    ids = eng.tokenizer.encode('{"n": 5, "ok": true, "colour": "red"}', add_special=False)
    eos = eng.manifest.eos_token_ids[0]
    con.consume(ids[:-1])
    allowed, n = con.masks([ids[-1], eos, eos, eos])
    assert n == 2 and allowed.shape[0] == 3 and allowed[2].all() and allowed[1][eos]
    assert con.push(ids[-1]) and not con.push(eos)
    con.pop()
    allowed, n = con.masks([ids[-1], eos])
    assert n == 2 and not allowed[0][eos]  # where it was: the closing token still to come


def test_cli_generate_holds_the_reply_to_a_json_schema(tiny_bundle, tmp_path):
    from click.testing import CliRunner

    from edgespec.cli import main

    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA["json_schema"]["schema"]))
    base = ["generate", str(tiny_bundle), "-p", "Pick a number, a truth and a colour.", "--chat",
            "--max-new-tokens", "120", "--temperature", "0"]
    r = CliRunner().invoke(main, base + ["--json", "--json-schema", str(schema)])
    assert r.exit_code == 0, r.output
    check(json.loads(r.output)["text"])
    streamed = CliRunner().invoke(main, base + ["--json-schema", str(schema)])
    assert streamed.exit_code == 0 and json.loads(r.output)["text"] in streamed.output  # the same reply, streamed
    wrapped = tmp_path / "response_format.json"  # (session 58, a review: the README's shape was refused, "Invalid
    wrapped.write_text(json.dumps(SCHEMA))  # type: json_schema") a whole response_format: the same reply
    w = CliRunner().invoke(main, base + ["--json", "--json-schema", str(wrapped)])
    assert w.exit_code == 0 and json.loads(w.output)["text"] == json.loads(r.output)["text"], w.output
    obj = CliRunner().invoke(main, base + ["--json", "--json-object", "--max-new-tokens", "8"])
    assert obj.exit_code == 0 and json.loads(obj.output)["text"].lstrip().startswith("{")
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "objectx"}')
    notjson = tmp_path / "notjson.json"
    notjson.write_text("{type: object")
    deep = tmp_path / "deep.json"  # (session 46: a RecursionError's traceback)
    deep.write_text("[" * 100000 + "]" * 100000)
    obj_file = tmp_path / "object.json"
    obj_file.write_text('{"type": "json_object"}')
    for args, msg in ((["--json-schema", str(bad)], "objectx"), (["--json-schema", str(notjson)], "is not JSON"),
                      (["--json-schema", str(obj_file)], "use --json-object"),
                      (["--json-schema", str(deep)], "is not JSON: maximum recursion depth"),
                      (["--json-schema", str(tmp_path / "none.json")], "no such JSON schema file"),
                      (["--json-schema", str(schema), "--json-object"], "give one of them")):
        r = CliRunner().invoke(main, base + args)
        lines = [line for line in r.output.strip().splitlines() if line]
        assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], r.output


def test_the_structured_outputs_bench_runs_on_a_tiny_bundle(tiny_bundle, tmp_path, capsys):
    """scripts/bench_structured.py: every drafter's reply equal to plain decoding's, greedy (exit 0), a table."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import bench_structured

    out = tmp_path / "s.json"
    assert bench_structured.main([str(tiny_bundle), "--reps", "1", "--drafters", "none,auto", "--max-new-tokens",
                                  "24", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| auto |" in table and "held to the schema" in table
    runs = json.loads(out.read_text())
    assert len(runs) >= 4 * 2 * 2 and all(r["same"] for r in runs)  # (a long prompt may not fit 256 tokens)
    assert bench_structured.main([str(tiny_bundle), "--reps", "1", "--drafters", "none", "--max-new-tokens", "8",
                                  "--temperature", "0.8"]) == 0
    assert bench_structured.main([str(tiny_bundle), "--llamacpp", "--temperature", "0.8"]) == 2


def test_a_strict_tools_integers_past_json_s_and_llguidance_s_limits_are_refused():
    """(session 55, a review) The same integers in a strict tool's parameters crashed the process at the tools'
    check (tool_call_grammar, then the matcher); a grammar past llguidance's lexer limits that failed at a later
    mask was a 500 (EdgespecError): the request's fault, a ConfigError (400)."""
    from edgespec.constrain import _failure
    from edgespec.tools import check_tools

    params = {"type": "object", "properties": {"n": {"type": "integer", "minimum": -2 ** 63}}}
    with pytest.raises(ConfigError, match=r"tools\[0\]\.function\.parameters\.properties\.n\.minimum"):
        check_tools([{"type": "function", "function": {"name": "f", "strict": True, "parameters": params}}])
    with pytest.raises(ConfigError, match=r"tools\[0\]\.function\.parameters"):
        tool_call_grammar([{"type": "function", "function": {"name": "f", "strict": True, "parameters": params}}],
                          "required", False, 1, 2)
    ok = {"type": "object", "properties": {"n": {"type": "integer", "minimum": -(2 ** 53 - 1), "maximum": 2 ** 53 - 1}}}
    assert check_tools([{"type": "function", "function": {"name": "f", "strict": True, "parameters": ok}}])
    assert isinstance(_failure("lexer error: too many expressions constructed", "the grammar"), ConfigError)
    assert type(_failure("something else", "the grammar")) is EdgespecError


def test_a_json_schema_without_its_schema_takes_any_json_value(tiny_bundle):
    """(constrain.py grammar_for: ``js.get("schema", {})``) a json_schema format with no ``schema`` is the empty
    schema: any JSON value (an array, a string, a number), where json_object takes objects only."""
    eng = edgespec.load(tiny_bundle, memory=False)
    anything = grammar_for({"type": "json_schema", "json_schema": {"name": "any"}})
    objects = grammar_for({"type": "json_object"})
    for text in ('[1, 2]', '"a b"', '3.5', '{"a": [true]}'):
        ids = eng.tokenizer.encode(text, add_special=False)
        assert eng.decoder.constraints(anything).masks(ids)[1] == len(ids), text
        n = eng.decoder.constraints(objects).masks(ids)[1]
        assert n == len(ids) if text.startswith("{") else n < len(ids), text
