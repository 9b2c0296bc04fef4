"""edgespec's Python API (the README's Python API section points here; tests/test_api.py runs it).

    python docs/api_example.py [BUNDLE]     # default: bundles/smollm2-int4
"""
import json
import sys

import edgespec

bundle = sys.argv[1] if len(sys.argv) > 1 else "bundles/smollm2-int4"
engine = edgespec.load(bundle)  # checks the bundle, plans memory, opens the ONNX sessions

# A whole reply: its text, token ids, why it ended and statistics. A string is a plain prompt;
# a list of messages goes through the model's chat template.
result = engine.generate("The three primary colours are", max_new_tokens=24)
print(result.text)
result = engine.generate([{"role": "user", "content": "Write a haiku about the sea."}], max_new_tokens=40)
print(result.text)
print(f"[{result.finish_reason}: {len(result.token_ids)} tokens, {result.stats['tokens_per_second']:.1f} tok/s, "
      f"acceptance {result.stats['acceptance_rate']:.2f}]")

# A streamed reply: text deltas as they are decoded. Options: temperature, top_k, top_p, seed,
# drafter ("model", "prompt-lookup", "suffix", "prediction", "auto", "none"), draft_tokens, stop (strings),
# prediction (below).
for delta in engine.stream("1, 2, 3,", max_new_tokens=30, stop=[" 8"]):
    print(delta, end="", flush=True)
print()

# A reply expected mostly to repeat a text (an edit of a file, a regenerated answer): pass the text as
# its prediction. The target checks every token drafted from it, so the reply is the one it would be
# without; a good prediction only makes it come sooner.
code = "def area(r):\n    return 3.14159 * r * r\n"
edit = engine.generate([{"role": "user", "content": "Rename the function area to circle_area:\n" + code}],
                       max_new_tokens=40, prediction=code)
print(edit.text)
print(f"[{edit.stats['accepted_by_drafter'].get('prediction', 0)} tokens drafted from the prediction and kept]")

# A reply held to a JSON Schema (structured outputs, OpenAI's response_format; needs llguidance, which the
# serve extra installs): the model writes only JSON the schema allows, and the reply is still its own.
fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "required": ["colour", "certain"], "additionalProperties": False,
    "properties": {"colour": {"enum": ["red", "green", "blue"]}, "certain": {"type": "boolean"}}}}}
answer = engine.generate([{"role": "user", "content": "What colour is the sky? Answer in JSON."}],
                         response_format=fmt, max_new_tokens=200)
print(answer.text, "->", json.loads(answer.text)["colour"])

# A conversation through the model's chat template; the KV cache is reused between turns.
chat = engine.chat(system="You are terse.")
print(chat.send("What is 2+2?", max_new_tokens=20).text)
print(chat.send("And times three?", max_new_tokens=20).text)

# Errors are typed: every one is an edgespec.EdgespecError.
try:
    engine.generate("Hello", temperature=-1)
except edgespec.ConfigError as e:
    print(f"error: {e}")
