"""Gaps a second mutation test of ``edgespec/onnx_lm.py`` found (docs/bench/mutation_harness/onnx_lm_mut2.py,
ON1-ON79): what a model is set to do at load (the verify bound of a width policy given, a hidden-state output the
graph lacks, the no-skip warning on a GPU device, inputs the manifest names and the graph lacks, a logits output
without a static vocabulary axis), a CUDA graph replay's failure and its time, the process-wide thread pool. The tiny
bundles of conftest; a GPU device is faked where a test needs one (the cache's buffers made on the
host by a patched ``OrtValue``)."""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

from edgespec.errors import BundleError
from edgespec.manifest import load_manifest
from edgespec.onnx_lm import OnnxLM
from edgespec.providers import choose
from edgespec.width import GPU_MIN_VERIFIED


def test_a_given_width_policy_bounds_verify_calls_at_the_probes_widest_at_least(tiny_bundle):
    """ON16: a target on onnxruntime's kernels opened with its width policy given (not probed) verifies no wider than
    the old probe's widest call (``GPU_MIN_VERIFIED``), or than the policy's narrowest call where that is wider; and
    feeds a prefill's last token alone. A drafter is not split."""
    m = load_manifest(tiny_bundle)
    for min_width, bound in ((1, GPU_MIN_VERIFIED), (2, GPU_MIN_VERIFIED), (GPU_MIN_VERIFIED + 3, GPU_MIN_VERIFIED + 3)):
        lm = OnnxLM(m.target, 64, choose(["cpu"]), min_width=min_width)
        assert (lm.verified_width, lm.split_last) == (bound, True), min_width
    assert OnnxLM(m.drafter, 64, choose(["cpu"]), min_width=2).split_last is False


def test_a_hidden_state_output_the_graph_lacks_is_not_kept(tiny_bundle):
    """ON12: a manifest naming a hidden-state output (``io.hidden``) that its graph does not have: ``keeps_hidden``
    says no, and calls run (bound, the name failed the next call inside onnxruntime)."""
    spec = load_manifest(tiny_bundle).target
    lm = OnnxLM(replace(spec, io=replace(spec.io, hidden="no_such_output")), 64, choose(["cpu"]), min_width=1)
    assert lm.keeps_hidden() is False
    assert lm.forward([3, 4, 5]).shape == (3, spec.vocab_size)
    with pytest.raises(IndexError, match="no hidden state"):
        lm.hidden_of(0)


def test_a_graph_replays_failure_is_the_bundles_and_its_time_counts(tiny_bundle):
    """ON23, ON24: a call that replays a CUDA graph (faked: ``graphs`` set on a CPU model) counts its time in
    ``run_seconds``, and onnxruntime's failure in a replay is a ``BundleError`` (exit code 2) naming the call's width
    and the way out, on one line."""
    lm = OnnxLM(load_manifest(tiny_bundle).target, 64, choose(["cpu"]), min_width=1)
    want = lm.forward([3, 4, 5]).copy()
    lm.reset()

    class Replays:
        fail = False

        def run(self, ids, past, argmax):
            time.sleep(0.05)
            if self.fail:
                raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : replay failed\nmore lines")
            return want[: len(ids)]

    lm.graphs = Replays()
    ran = lm.run_seconds
    assert np.array_equal(lm.forward([3, 4, 5]), want)
    assert lm.run_seconds - ran >= 0.05
    lm.graphs.fail = True
    with pytest.raises(BundleError, match=r"CUDA graph of 2 tokens\): \[ONNXRuntimeError\].*replay failed "
                                          r"\(--no-cuda-graphs runs without them\)$") as e:
        lm.forward([6, 7])
    assert "\n" not in str(e.value)


def test_a_graph_without_the_logits_skip_on_a_gpu_device_is_warned_of(tiny_cuda_bundle, monkeypatch):
    """ON5: a cuda-layout model without the logits skip (exported before session 29) that runs on a GPU carries the
    warning that its prefills compute every position's logits. The GPU is faked: onnxruntime said to run CUDA, the
    cache's buffers made on the host. The same model with its skip carries none; on the device its
    cache is not on the host, so it keeps no hidden states and takes the graph's argmax."""
    import onnxruntime as ort

    import edgespec.onnx_lm as onnx_lm

    spec = load_manifest(tiny_cuda_bundle).target
    old = replace(spec, io=replace(spec.io, logits_skip=None))
    host = ort.OrtValue.ortvalue_from_shape_and_type
    monkeypatch.setattr(onnx_lm, "_check_running", lambda *a: "cuda")
    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_shape_and_type",
                        staticmethod(lambda shape, dtype, device="cpu", index=0: host(shape, dtype)))
    lm = OnnxLM(old, 64, choose(["cpu"]), min_width=1)
    assert lm.device == "cuda" and lm.cache.host == [] and lm.device_argmax and not lm.keeps_hidden()
    assert "computes every position's logits in a prefill" in lm.layout_warning
    assert OnnxLM(spec, 64, choose(["cpu"]), min_width=1).layout_warning is None


def test_a_thread_pool_made_outside_edgespec_is_of_unknown_size(monkeypatch):
    """ON62: where onnxruntime's process-wide pool was made before edgespec's first session (its own
    ``set_global_thread_pool_sizes`` refuses a second), the pool's size is unknown (-1), not the count edgespec
    asked for (``open_session`` then says of no thread count that it is not applied: it cannot know)."""
    import onnxruntime as ort

    import edgespec.onnx_lm as onnx_lm

    def made_before(*a):
        raise RuntimeError("the global thread pool has been created already")

    monkeypatch.setattr(onnx_lm, "_shared_pool", None)
    monkeypatch.setattr(ort, "set_global_thread_pool_sizes", made_before)
    assert onnx_lm.shared_thread_pool(2) == -1 and onnx_lm.shared_thread_pool(3) == -1


def test_an_onnxruntime_with_a_pool_call_but_no_per_session_switch_gives_each_session_its_own(monkeypatch):
    """ON63: an onnxruntime whose Python API has ``set_global_thread_pool_sizes`` but whose ``SessionOptions`` lack
    ``use_per_session_threads`` cannot put a session on the process-wide pool: no pool is made (each session its own,
    ``NO_GLOBAL_POOL``), rather than one no session could join."""
    import onnxruntime as ort

    import edgespec.onnx_lm as onnx_lm

    made, real = [], ort.SessionOptions

    class NoSwitch(real):
        def __getattribute__(self, name):
            if name == "use_per_session_threads":
                raise AttributeError(name)
            return super().__getattribute__(name)

    monkeypatch.setattr(onnx_lm, "_shared_pool", None)
    monkeypatch.setattr(ort, "set_global_thread_pool_sizes", lambda *a: made.append(a))
    monkeypatch.setattr(ort, "SessionOptions", NoSwitch)
    assert onnx_lm.shared_thread_pool(2) == onnx_lm.NO_GLOBAL_POOL and made == []


@pytest.mark.parametrize("name", ["logits_skip", "row_positions"])
def test_a_manifest_naming_an_input_its_graph_lacks_is_refused_at_load(tiny_bundle, name):
    """ON64, ON65: a manifest whose ``io`` names a logits skip or rows' positions input that the graph does not have
    is inconsistent: a ``BundleError`` at load naming it, not a model that runs without it."""
    spec = load_manifest(tiny_bundle).target
    with pytest.raises(BundleError, match=r"^the target graph has no 'no_such_input' that the manifest names "
                                          r"\(\d+ layers\); the bundle is inconsistent$"):
        OnnxLM(replace(spec, io=replace(spec.io, **{name: "no_such_input"})), 64, choose(["cpu"]), min_width=1)



def test_a_graph_whose_logits_have_no_static_vocabulary_axis_runs_on_onnxruntimes_buffers(tiny_bundle, monkeypatch):
    """ON79: a graph whose logits output names its vocabulary axis symbolically (no static width; faked: onnxruntime
    infers the builder's): the model states no logits width, keeps no logits buffer of its own (onnxruntime allocates
    each call's), and computes what it computes with a static axis. (Taken as a width, the axis' name failed the
    load.)"""
    from types import SimpleNamespace

    import edgespec.onnx_lm as onnx_lm

    spec, real = load_manifest(tiny_bundle).target, onnx_lm.open_session
    ids = [3, 4, 5, 6]
    want = OnnxLM(spec, 64, choose(["cpu"]), min_width=1).forward(ids)

    class Symbolic:
        def __init__(self, session):
            self.session = session

        def __getattr__(self, name):
            return getattr(self.session, name)

        def get_outputs(self):
            return [SimpleNamespace(name=o.name, type=o.type, shape=[*o.shape[:-1], "vocab"])
                    if o.name == spec.io.logits else o for o in self.session.get_outputs()]

    monkeypatch.setattr(onnx_lm, "open_session", lambda *a, **k: Symbolic(real(*a, **k)))
    lm = OnnxLM(spec, 64, choose(["cpu"]), min_width=1)
    assert lm.logits_width is None and lm._own_logits(len(ids)) is None
    assert np.array_equal(lm.forward(ids), want)
