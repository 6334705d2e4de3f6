"""Shared data of the `opgen bench` CPU tests: measured ceilings, result
rows against the targets, and a runner.Gpu on torch's CPU."""
import contextlib
import time
import types

from opgen.bench.runner import Gpu
from opgen.codegen.resolve import as_spec
from opgen.runtime.timing import Timing

MEAS = {"copy_tbps": 4.0, "fp16_tflops": 800.0, "int8_tops": 1600.0, "fp8_tflops": 1500.0}


def spec(name):
    return as_spec(name)


def row(spec_name, M, opgen, N=8192, K=8192, **peers):
    r = {"spec": spec_name, "N": N, "K": K, "M": M, "opgen_us": opgen, "peer_errors": {}}
    for k, v in peers.items():
        r[k] = v
    return r


SYNTH = [
    row("gptq_v2_w4a16_g128", 1, 10.0, cublas_fp16_us=50.0, tinygemm_int4_us=15.0),
    row("w4a16_sym_g128", 1, 11.0, cublas_fp16_us=44.0, tinygemm_int4_us=30.0),
    row("gptq_v2_w4a16_g128", 16, 10.0, cublas_fp16_us=33.0),
    row("gptq_v2_w4a16_g128", 4096, 1000.0, cublas_fp16_us=800.0),
    row("gptq_v2_w4a16_g128", 1, 1.0, N=4096, K=4096, cublas_fp16_us=1.0),   # other shape: ignored
    row("w2a16_g128", 1, 14.0, bytes_floor_us=10.0),
    row("bnb_nf4", 1, 20.0, bytes_floor_us=10.0),
    row("w8a8_int8", 16, 10.0, int_mm_us=None),                              # M < 64: not a target
    row("w8a8_int8", 64, 10.0, int_mm_us=9.0, opgen_linear_us=15.0, bminf_w8a8_us=30.0,
         linear_verified=True),
    row("w8a8_int8", 256, 10.0, int_mm_us=12.0),
    row("fp8_e4m3_w8a8", 256, 10.0, scaled_mm_us=None),
    row("mxfp4", 1, None, error="CompileError: boom"),
]
SYNTH[-2]["peer_errors"] = {"scaled_mm": "RuntimeError: not supported"}


def find(targets, label, spec_name=None, M=None):
    out = [t for t in targets if t["target"] == label and (spec_name is None or t["spec"] == spec_name)
           and (M is None or t["M"] == M)]
    assert len(out) == 1, (label, spec_name, M, out)
    return out[0]


class _FakeTimer:
    stream = contextlib.nullcontext()        # the cupy stream (a context manager)

    def measure(self, launch, budget_us=None, **kw):
        for i in range(3):
            launch(i)
        return Timing(7.5, [7.5, 7.5, 7.5])


def fake_capture(enqueue):
    """runner.Gpu.capture on torch's CPU: the warm-up call, then a "replay"
    that runs the captured calls again."""
    enqueue()
    return enqueue


def fake_gpu(monkeypatch, torch):
    """A runner.Gpu on torch's CPU: its timer launches three times and reads
    7.5 µs, its graphs replay the captured calls; no cupy but the memory
    queries."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    pool = types.SimpleNamespace(free_all_blocks=lambda: None)
    cp = types.SimpleNamespace(
        cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(memGetInfo=lambda: (8 << 30, 16 << 30))),
        get_default_memory_pool=lambda: pool)
    g = object.__new__(Gpu)
    g.torch, g.cp = torch, cp
    g.dev = torch.device("cpu")
    g.timer, g.tstream = _FakeTimer(), None
    g.capture = fake_capture
    g.l2, g.budget_ms, g.mem_cap, g.seed, g.t0 = 1 << 20, 1.0, 1 << 28, 0, time.time()
    return g
