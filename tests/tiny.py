"""Tiny random Hugging Face models built from configs, and a scripted fake LM for engine tests."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edgespec.kv import TokenCache
from edgespec.lm import CausalLM

CORPUS = [
    "def hello(world):\n    return world + 1\n",
    "The quick brown fox jumps over the lazy dog. The dog sleeps.",
    "Question: what is two plus two? Answer: four. Question: and three plus three? Answer: six.",
    "import numpy as np\nx = np.zeros(3)\nprint(x)\n",
] * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_tokenizer(vocab_size: int = 400, seed_text: list[str] | None = None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(seed_text or CORPUS, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                 pad_token="<|endoftext|>")
    hf.chat_template = CHAT_TEMPLATE
    return hf


def make_model(directory: Path, arch: str = "qwen2", *, seed: int = 0, layers: int = 2, hidden: int = 64,
               heads: int = 4, kv_heads: int = 2, max_pos: int = 256, tokenizer=None, perturb_from: Path | None = None,
               noise: float = 0.0, **extra) -> Path:
    """Save a tiny random model (and tokenizer) to ``directory``: ``arch`` qwen2, llama, qwen3 (per-head
    query and key norms), gemma2 (sliding windows on alternate layers, softcaps), gemma3 (both, and a rotary
    theta per layer type), mistral, gemma, phi3, granite, olmo, olmo2 and olmo3 (norms after attention and MLP, query
    and key norms over the whole projection; olmo3: sliding windows on three layers of four), smollm3, lfm2 (convolution layers beside attention: test_conv.py), phi
    (Phi-2), nemotron or ernie4_5; ``extra``: more
    config fields (``sliding_window``). With ``perturb_from``, copy that model's weights and add Gaussian
    noise: a drafter that mostly agrees with its target."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    tokenizer = tokenizer or make_tokenizer()
    vocab = len(tokenizer)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_pos,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    if arch in ("qwen3", "gemma", "gemma2", "gemma3", "hunyuan", "exaone4"):
        common["head_dim"] = hidden // heads
    if arch in ("phi3", "smollm3"):
        common["pad_token_id"] = None
    if arch == "phi3":  # (else transformers reads it as a LongRoPE model, whose factors the config lacks)
        common["original_max_position_embeddings"] = extra.pop("original_max_position_embeddings", max_pos)
    configs = {"qwen2": "Qwen2Config", "llama": "LlamaConfig", "qwen3": "Qwen3Config", "gemma2": "Gemma2Config",
               "mistral": "MistralConfig", "gemma3": "Gemma3TextConfig", "gemma": "GemmaConfig", "phi3": "Phi3Config",
               "granite": "GraniteConfig", "olmo": "OlmoConfig", "olmo2": "Olmo2Config", "olmo3": "Olmo3Config", "hunyuan": "HunYuanDenseV1Config",
               "granite4": "GraniteMoeHybridConfig", "exaone4": "Exaone4Config", "smollm3": "SmolLM3Config", "lfm2": "Lfm2Config",
               "phi": "PhiConfig", "nemotron": "NemotronConfig", "ernie4_5": "Ernie4_5Config"}
    cfg = getattr(transformers, configs[arch])(**{**common, **extra})
    torch.manual_seed(seed)
    if perturb_from is not None:
        model = AutoModelForCausalLM.from_pretrained(perturb_from, dtype=torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(noise * torch.randn_like(p) * p.std().clamp_min(1e-3))
    else:
        model = AutoModelForCausalLM.from_config(cfg)
        with torch.no_grad():  # sharper distributions than the default init: repetition and clear argmaxes
            model.get_output_embeddings().weight.mul_(8.0)
    model.eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return Path(directory)


class SimClock:
    """A simulated clock for policy tests: only the fake models' simulated costs advance it."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeSpec:
    def __init__(self, vocab: int, max_context: int):
        self.vocab_size = vocab
        self.max_context = max_context
        self.role = "fake"


class FakeLM(CausalLM):
    """A scripted LM on the real LM protocol (``edgespec.lm.CausalLM``: its padding to
    ``min_width``, prefill, rewind and cache are the runtime's own): logits are a fixed function of
    the context (a hash of the last ``order`` tokens), so results are exact and cheap."""

    def __init__(self, vocab: int = 6, max_context: int = 512, seed: int = 0, order: int = 2, sharpness: float = 2.0,
                 table: np.ndarray | None = None, delay: tuple[float, float] = (0.0, 0.0), clock=None,
                 min_width: int = 1, width_multiple: int = 1, odd_row_noise: float = 0.0,
                 reuse_buffer: bool = False, wide_above: int | None = None):
        self.spec = FakeSpec(vocab, max_context)
        self.max_context = max_context
        self.cache = TokenCache(max_context)
        self.min_width, self.width_multiple = min_width, width_multiple
        # a kernel that computes rows in pairs and the odd last row of a call on another path (as
        # MatMulNBits at block 128 on AVX-512): that row's logits move by this much noise
        self.odd_row_noise = odd_row_noise
        # a kernel that takes another path for calls of more than this many tokens (a GPU GEMM whose
        # algorithm changes with the rows): every row of such a call moves by noise
        self.wide_above = wide_above
        self.vocab = vocab
        self.order = order
        rng = np.random.default_rng(seed)
        self.table = table if table is not None else rng.normal(0, sharpness, size=(vocab ** order, vocab))
        self.delay = delay  # simulated seconds per call and per token computed, added to ``clock``
        self.clock = clock
        # as OnnxLM: calls up to 16 tokens return a view of one buffer that the next call overwrites
        self._buf = np.empty((16, vocab), dtype=np.float32) if reuse_buffer else None
        self._init_counters()

    def logits_for(self, context) -> np.ndarray:
        key = 0
        for t in context[-self.order:]:
            key = key * self.vocab + int(t)
        return self.table[key % self.table.shape[0]].astype(np.float32)

    def _run(self, ids, past):
        if self.clock is not None:
            self.clock.t += self.delay[0] + self.delay[1] * len(ids)
        context = self.cache.ids[:past] + [int(t) for t in ids]
        rows = np.stack([self.logits_for(context[: past + i + 1]) for i in range(len(ids))])
        if self.odd_row_noise and len(ids) % 2:
            key = sum(int(t) * 31 ** j for j, t in enumerate(context[-3:]))
            rows[-1] += np.random.default_rng(key).normal(0, self.odd_row_noise, self.vocab).astype(np.float32)
        if self.wide_above is not None and len(ids) > self.wide_above:
            key = sum(int(t) * 31 ** j for j, t in enumerate(context[-3:]))
            rows += np.random.default_rng(key).normal(0, 3.0, rows.shape).astype(np.float32)
        self._returned_view = self._buf is not None and len(ids) <= self._buf.shape[0]
        if self._returned_view:
            self._buf[: len(ids)] = rows
            return self._buf[: len(ids)]
        return rows


class _SlotCache(TokenCache):
    """A ``TokenCache`` whose slots can be moved (an accepted alternate into its position, as KVCache)."""

    def move(self, src: int, dst: int) -> None:
        self.ids.set(dst, self.ids[src])


class AltFakeLM(FakeLM):
    """A ``FakeLM`` that verifies alternates (``CausalLM.forward_alternates``): a row at ``positions[i]``
    gets the logits of the context up to that position followed by its own token, as the native
    kernel's alternate rows are one-token calls after the rows before them."""

    verifies_alternates = True
    cheap_rows = True  # (the decoder then turns alternates on, as on edgespec's AVX-512 paths)

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.cache = _SlotCache(self.max_context)

    def _run(self, ids, past, argmax=False, positions=None):
        if positions is None:
            out = super()._run(ids, past)
        else:
            head = self.cache.ids[:past]
            out = np.stack([self.logits_for(head + [int(t) for t in ids[:at]] + [int(tok)])
                            for tok, at in zip(ids, positions)])
            self._returned_view = False
        return np.argmax(out, axis=-1) if argmax else out


def split_runs(work, runs: int, timeout: float = 600.0):
    """``work(seeds)``'s result over the seeds ``range(runs)``, the upper half run in a forked child on the other
    core: the statistical tests' thousands of seeded generations are pure Python on one core, a CI machine's second
    idle (their ~290 s of the suite's time). Results merge: dicts of counts add up, numbers add, lists join, tuples
    merge member by member. Each half builds its own decoder (``work`` does), so the two halves' drafters learn from
    different runs: every seeded run must follow the target's distribution whatever its drafter holds. A failure in
    the child is raised here; a child that has not answered in ``timeout`` seconds is killed and fails the test."""
    import os
    import pickle
    import select
    import signal
    import time

    half = runs // 2
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its half, its result down the pipe, out without pytest's teardown
        code = 0
        try:
            os.close(r)
            try:
                out = ("ok", work(range(half, runs)))
            except BaseException as e:  # noqa: BLE001 - said in the parent
                out = ("error", f"{type(e).__name__}: {e}")
            data = pickle.dumps(out)
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    answered = False
    try:
        mine = work(range(half))
        chunks, deadline = [], time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"the forked half of the runs did not answer in {timeout:.0f} s")
            chunk = os.read(r, 1 << 16)
            if not chunk:
                answered = True
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        if not answered:  # (this half failed or was stopped: the child's half is not waited for)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    status, theirs = pickle.loads(b"".join(chunks)) if chunks else ("error", "the child exited without a result")
    if status != "ok":
        raise AssertionError(f"the forked half of the runs failed: {theirs}")
    return _merge(mine, theirs)


def _merge(a, b):
    if isinstance(a, dict):
        out = dict(a)
        for k, v in b.items():
            out[k] = _merge(out[k], v) if k in out else v
        return out
    if isinstance(a, list):
        return a + b
    if isinstance(a, tuple):
        return tuple(_merge(x, y) for x, y in zip(a, b))
    return a + b


def numpy_exp_is_libms() -> bool:
    """Whether numpy's float64 exp gives the C library's bits here (on CPUs with AVX-512 numpy uses its
    own vectorized exp, which differs from glibc's by an ulp on some inputs)."""
    import math

    x = np.linspace(-30.0, 0.0, 4001)
    return all(float(a) == math.exp(float(b)) for a, b in zip(np.exp(x), x))


# A chat template in the <tool_call> format (Qwen2.5's and Hermes' shape, shorter), for models that call tools.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "Call one as <tool_call>{\"name\": N, \"arguments\": A}</tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{% if m.content %}{{ m.content }}\n"
    "{% endif %}{% for c in m.tool_calls %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                              "parameters": {"type": "object",
                                                             "properties": {"city": {"type": "string"}}}}}]
# get_weather strict, its parameters allowing only Rome or Oslo (the key order edgespec renders: check_tools)
STRICT = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city"],
    "properties": {"city": {"enum": ["Rome", "Oslo"]}}}, "strict": True}}]
ASK = {"role": "user", "content": "Weather in Paris?"}
ASK_TWO = {"role": "user", "content": "Weather in Paris and Rome?"}
HELLO = {"role": "user", "content": "Hello"}


def _call(city: str, i: int) -> dict:
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}


# (messages, tools, the reply the model learns): a call, a reply to its result, no call, two calls, no tools
TOOL_LESSONS = [
    ([ASK], WEATHER, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ([ASK, {"role": "assistant", "content": None, "tool_calls": [_call("Paris", 0)]},
      {"role": "tool", "tool_call_id": "call_0", "content": "14 C"}], WEATHER, "It is 14 C in Paris."),
    ([HELLO], WEATHER, "Hello! Ask me about the weather."),
    ([ASK_TWO], WEATHER, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
                         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'),
    ([ASK], None, "I cannot see the weather."),
    # with the strict tool it learns to call for Paris all the same: the grammar must make it Rome or Oslo
    ([ASK], STRICT, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ([HELLO], STRICT, "Hello! Ask me about the weather."),
]


def make_tool_model(directory: Path) -> Path:
    """A tiny qwen2 model trained until it says each of ``TOOL_LESSONS``' replies, greedy, token for token,
    with the tool template: a model that really calls tools, in seconds, for tests of the whole path."""
    from edgespec.template import ChatTemplate
    from edgespec.tools import check_tool_messages

    tok = make_tokenizer(seed_text=CORPUS + [json.dumps(WEATHER), TOOLS_TEMPLATE] * 10)
    tok.add_tokens(["<tool_call>", "</tool_call>"])  # as Qwen2.5's: tokens of their own, not special
    tok.chat_template = TOOLS_TEMPLATE
    make_model(directory, "qwen2", seed=5, tokenizer=tok, hidden=128, max_pos=512)
    template = ChatTemplate(TOOLS_TEMPLATE)
    rows = []
    for msgs, tools, reply in TOOL_LESSONS:
        prompt = template.render(messages=check_tool_messages(msgs), add_generation_prompt=True,
                                 **({"tools": tools} if tools else {}))
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        r = tok(reply, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append((p, r))
    return train_replies(directory, tok, rows, "the tool model")


FIM_TOKENS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>"]
# (the code before the gap, after it, the middle): Qwen2.5-Coder's fill-in-the-middle prompts, learnt whole
FIM_LESSONS = [
    ("def add(a, b):\n    ", "\n\nprint(add(1, 2))\n", "return a + b"),
    ("import numpy as np\nx = ", "\nprint(x)\n", "np.zeros(3)"),
    ("def hello(world):\n", "\n", "    return world + 1\n"),
]


def make_fim_model(directory: Path) -> Path:
    """A tiny qwen2 model with Qwen2.5-Coder's FIM tokens, trained until it fills each of ``FIM_LESSONS``'
    gaps and then says <|endoftext|> (which is not its end-of-sequence token, <|im_end|>: a FIM stop)."""
    tok = make_tokenizer(seed_text=CORPUS + [p + m + s for p, s, m in FIM_LESSONS] * 10)
    tok.add_special_tokens({"additional_special_tokens": FIM_TOKENS})
    make_model(directory, "qwen2", seed=6, tokenizer=tok, hidden=128, max_pos=256)
    ids = {t: tok.convert_tokens_to_ids(t) for t in FIM_TOKENS}
    rows = []
    for prefix, suffix, middle in FIM_LESSONS:
        p = ([ids["<|fim_prefix|>"]] + tok(prefix, add_special_tokens=False)["input_ids"] + [ids["<|fim_suffix|>"]]
             + tok(suffix, add_special_tokens=False)["input_ids"] + [ids["<|fim_middle|>"]])
        rows.append((p, tok(middle, add_special_tokens=False)["input_ids"] + [tok.bos_token_id]))  # <|endoftext|>
    return train_replies(directory, tok, rows, "the FIM model")


def train_replies(directory: Path, tok, rows: list[tuple[list[int], list[int]]], what: str) -> Path:
    """Train the model saved in ``directory`` until it says each row's reply after its prompt, greedy,
    token for token, by a margin (rows: (prompt ids, reply ids)); saved back with ``tok``."""
    import torch
    from transformers import AutoModelForCausalLM

    n = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), n), tok.pad_token_id)
    labels = torch.full((len(rows), n), -100)
    for i, (p, r) in enumerate(rows):
        ids[i, :len(p) + len(r)] = torch.tensor(p + r)
        labels[i, len(p):len(p) + len(r)] = torch.tensor(r)  # the replies are what it learns
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(600):
        out = model(input_ids=ids, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        if step % 20 == 19:
            with torch.no_grad():
                pred = model(input_ids=ids).logits[:, :-1].argmax(-1)
                mask = labels[:, 1:] != -100
                margin = torch.sort(model(input_ids=ids).logits[:, :-1], -1).values
                gap = (margin[..., -1] - margin[..., -2])[mask].min()
                if bool((pred[mask] == labels[:, 1:][mask]).all()) and float(gap) > 2.0:
                    break
    else:
        raise RuntimeError(f"{what} did not learn its replies (loss {float(out.loss):.3f})")
    model.eval().save_pretrained(directory)
    tok.save_pretrained(directory)
    return Path(directory)


# Qwen3's chat template in brief: enable_thinking false writes an empty block into the generation prompt; the
# "opened" variant writes <think> there itself (a reply then starts inside its block, as DeepSeek-R1's does)
THINK_TEMPLATE = (TOOLS_TEMPLATE.replace("{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", "")
                  + "{% if add_generation_prompt %}<|im_start|>assistant\n"
                  "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
                  "{% elif opened is defined and opened %}<think>\n{% endif %}{% endif %}")
WHY = {"role": "user", "content": "Why is the sky blue?"}
WHY_SHORT = {"role": "user", "content": "Why?"}  # (asked under the opened block: WHY's would repeat its tokens)
# (messages, template kwargs, the reply the model learns)
THINK_LESSONS = [
    ([HELLO], {}, "<think>\nThe user greets me.\n</think>\n\nHello there!"),
    ([HELLO], {"enable_thinking": False}, "Hello there!"),
    ([WHY], {}, "<think>\nLight scatters.\nShort waves most.\n</think>\n\nBlue light scatters most."),
    ([WHY_SHORT], {"opened": True}, "Light scatters.\n</think>\n\nBlue light scatters most."),
    # a thinking agent: it thinks, then calls (the call must be read from the answer, not from the thinking)
    ([ASK], {"tools": WEATHER}, '<think>\nI need the <tool_call> tool.\n</think>\n\n<tool_call>\n{"name": '
                                '"get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
]


def make_think_model(directory: Path) -> Path:
    """A tiny qwen2 model with Qwen3's <think> and </think> tokens, trained until it says each of
    ``THINK_LESSONS``' replies (its thinking, then its answer) under ``THINK_TEMPLATE``."""
    from edgespec.template import ChatTemplate

    tok = make_tokenizer(seed_text=CORPUS + [r for _, _, r in THINK_LESSONS] * 10 + [json.dumps(WEATHER)] * 10)
    tok.add_tokens(["<think>", "</think>", "<tool_call>", "</tool_call>"])  # as Qwen3's: their own, not special
    tok.chat_template = THINK_TEMPLATE
    make_model(directory, "qwen2", seed=7, tokenizer=tok, hidden=128, max_pos=256)
    template = ChatTemplate(THINK_TEMPLATE)
    rows = []
    for msgs, kw, reply in THINK_LESSONS:
        prompt = template.render(messages=msgs, add_generation_prompt=True, **kw)  # (tools: rendered as the engine does)
        rows.append((tok(prompt, add_special_tokens=False)["input_ids"],
                     tok(reply, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]))
    return train_replies(directory, tok, rows, "the thinking model")


def write_gguf(hf_dir: Path, path: Path, arch: str = "qwen3") -> Path:
    """The float32 model in ``hf_dir`` as a GGUF file (gguf's writer, llama.cpp's tensor names; its tokenizer as a
    GPT-2 BPE; a Llama's query and key rows permuted as llama.cpp's converter does; LFM2's KV heads per layer and
    convolution kernels as llama.cpp writes them): a model of a family whose GGUF reading transformers gets wrong,
    without llama.cpp's converter."""
    import gguf
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    if arch == "lfm2":  # (llama.cpp's: KV heads per layer, 0 for a convolution; the kernel's length)
        w.add_head_count_kv([0 if t == "conv" else cfg.num_key_value_heads for t in cfg.layer_types])
        w.add_shortconv_l_cache(cfg.conv_L_cache)
    else:
        w.add_head_count_kv(cfg.num_key_value_heads)
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads  # (Phi3Config has none)
    w.add_key_length(head)
    w.add_value_length(head)
    w.add_layer_norm_rms_eps(cfg.norm_eps if arch == "lfm2" else cfg.rms_norm_eps)
    w.add_rope_freq_base(float((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)))
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), cfg.num_hidden_layers)

    def permute(v, heads):  # (llama.cpp's LlamaModel.permute: its query and key rows, which transformers undoes)
        return v.reshape(heads, 2, v.shape[0] // heads // 2, *v.shape[1:]).swapaxes(1, 2).reshape(v.shape)

    for k, v in model.state_dict().items():
        if k == "lm_head.weight" and getattr(cfg, "tie_word_embeddings", False):
            continue  # (the embedding's: llama.cpp writes no output tensor then)
        v = v.numpy().astype(np.float32)
        if arch == "llama" and k.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")):
            v = permute(v, cfg.num_attention_heads if "q_proj" in k else cfg.num_key_value_heads)
        if arch == "lfm2" and k.endswith("conv.conv.weight"):  # (llama.cpp's [channels, kernel])
            v = v.reshape(v.shape[0], v.shape[-1])
        w.add_tensor(names.get_name(k, try_suffixes=(".weight", ".bias")), v)
    tok = AutoTokenizer.from_pretrained(hf_dir)
    vocab = sorted(tok.get_vocab().items(), key=lambda x: x[1])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([1] * len(vocab))
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_eos_token_id(tok.eos_token_id)
    w.add_bos_token_id(tok.bos_token_id)
    if arch == "phi3" and tok.pad_token_id is not None:  # (Phi3Config's default padding id is past a tiny vocab)
        w.add_pad_token_id(tok.pad_token_id)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def damaged_zips(members: dict[str, np.ndarray]) -> dict[str, bytes]:
    """A zip file of ``members`` (.npy arrays, as np.savez writes them) damaged in the ways a reader meets
    beyond a truncation: a member too short for a .npy header, a broken deflate stream, a compression method
    zipfile does not know, members marked encrypted, a header of deeply nested JSON."""
    import io
    import struct
    import zipfile

    def npz(arrays: dict, method=zipfile.ZIP_STORED, raw: dict | None = None) -> bytearray:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", method) as z:
            for k, a in arrays.items():
                b = io.BytesIO()
                np.save(b, a)
                z.writestr(f"{k}.npy", b.getvalue())
            for k, v in (raw or {}).items():
                z.writestr(k, v)
        return bytearray(buf.getvalue())

    def patch(b: bytearray, local: int, central: int, value: int) -> bytes:
        for sig, off in ((b"PK\x03\x04", local), (b"PK\x01\x02", central)):
            p = b.find(sig)
            while p >= 0:
                struct.pack_into("<H", b, p + off, value)
                p = b.find(sig, p + 4)
        return bytes(b)

    deflated = npz(members, zipfile.ZIP_DEFLATED)
    first = deflated.find(b".npy") + 4
    for j in range(first + 5, first + 25):
        deflated[j] ^= 0xFF
    nested = ("[" * 100000 + "]" * 100000).encode()
    return {
        "short member": bytes(npz({}, raw={"meta.npy": b"\x93NUMPY"})),
        "broken deflate stream": bytes(deflated),
        "unknown compression method": patch(npz(members), 8, 10, 99),
        "encrypted members": patch(npz(members), 6, 8, 1),
        "nested JSON": bytes(npz({**members, "meta": np.frombuffer(nested, np.uint8)})),
    }
