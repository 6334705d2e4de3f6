"""The peers `opgen bench` times against opgen, in torch: cuBLAS fp16 / bf16
(`torch.mm`), tinygemm int4 (`torch._weight_int4pack_mm`), gemlite's A16W4
group-128 Triton kernels (when the gemlite package is installed), cuBLASLt
int8 (`torch._int_mm`), fp8 (`torch._scaled_mm`) and the unfused BMINF-style
W8A8 pipeline (per-row quantize in torch ops, `torch._int_mm`, scale).  Each is
timed once per (N, K, M) and shared by every spec, isolated and, with graph,
in graph mode (graph.py: L layers in one CUDA graph, here captured by torch).
`gpu` is runner.Gpu."""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

from . import gemlite_peer
from . import graph as graph_mode
from .failures import short_error
from .roofline import _r


def peer_defs(gpu, N: int, K: int):
    """name -> (make_weights() -> tuple, make_act(M) -> tuple, call(act, w))."""
    torch, dev = gpu.torch, gpu.dev
    f16, bf16, i8 = torch.float16, torch.bfloat16, torch.int8

    def randn(*shape, dtype):
        return torch.randn(*shape, dtype=torch.float16, device=dev).to(dtype)

    def randi8(*shape):
        return torch.randint(-127, 128, shape, dtype=i8, device=dev)

    def tinygemm_w():
        codes = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=dev)
        packed = torch._convert_weight_to_int4pack(codes, 8)
        sz = torch.randn(K // 128, N, 2, dtype=bf16, device=dev)
        return packed, sz

    def bminf(act, w):
        a, = act
        w8, ws = w
        s = a.abs().amax(dim=1, keepdim=True).float().clamp_(min=1e-8) / 127.0
        q = torch.round(a.float() / s).clamp_(-127, 127).to(i8)
        acc = torch._int_mm(q, w8.t())
        return (acc.float() * s * ws).to(f16)

    gemlite_meta: list = []          # the layer's meta arguments, made with its weights

    def gemlite_w():
        # its forward as a function of its tensors, so they can rotate like the others'
        q = torch.randint(0, 16, (N, K), dtype=torch.uint8, device=dev)
        s = (torch.rand(N, K // 128, device=dev) / 64 + 1e-3).to(f16)
        z = torch.full((N, K // 128), 8.0, device=dev, dtype=f16)
        layer = gemlite_peer.w4_layer(q, s, z)
        gemlite_meta[:] = gemlite_peer.meta_args(layer)
        return gemlite_peer.tensor_args(layer)

    f8 = getattr(torch, "float8_e4m3fn", None)
    return {
        "cublas_fp16": (lambda: (randn(N, K, dtype=f16),),
                        lambda M: (randn(M, K, dtype=f16), torch.empty(M, N, dtype=f16, device=dev)),
                        lambda act, w: torch.mm(act[0], w[0].t(), out=act[1])),
        "cublas_bf16": (lambda: (randn(N, K, dtype=bf16),),
                        lambda M: (randn(M, K, dtype=bf16), torch.empty(M, N, dtype=bf16, device=dev)),
                        lambda act, w: torch.mm(act[0], w[0].t(), out=act[1])),
        "tinygemm_int4": (tinygemm_w,
                          lambda M: (randn(M, K, dtype=bf16),),
                          lambda act, w: torch._weight_int4pack_mm(act[0], w[0], 128, w[1])),
        "gemlite_w4": (gemlite_w, lambda M: (randn(M, K, dtype=f16),),
                       lambda act, w: gemlite_peer.forward(act[0], w, gemlite_meta)),
        # torch._int_mm needs M > 16: a caller pads smaller batches to 17 rows.
        "int_mm": (lambda: (randi8(N, K),),
                   lambda M: (randi8(max(M, 17), K),),
                   lambda act, w: torch._int_mm(act[0], w[0].t())),
        "scaled_mm": (lambda: (randn(N, K, dtype=f8),
                               torch.ones(1, N, dtype=torch.float32, device=dev)),
                      lambda M: (randn(M, K, dtype=f8),
                                 torch.ones(M, 1, dtype=torch.float32, device=dev)),
                      lambda act, w: torch._scaled_mm(act[0], w[0].t(), scale_a=act[1],
                                                      scale_b=w[1], out_dtype=bf16)),
        "bminf_w8a8": (lambda: (randi8(N, K),
                                torch.rand(N, dtype=torch.float32, device=dev) / 64 + 1e-3),
                       lambda M: (randn(max(M, 17), K, dtype=f16),),   # as int_mm
                       bminf),
    }


def _nbytes(ts) -> int:
    return sum(int(t.numel() * t.element_size()) for t in ts)


def _weights(make_w, Ms, on_result):
    """make_w(), or None after reporting its error on every M's row."""
    try:
        return make_w()
    except Exception as e:
        for M in Ms:
            on_result(M, None, "weights: " + short_error(e), 0)
        return None


def _rotating_time(gpu, make_w, make_act, call, Ms, on_result) -> None:
    """Time call(act_set, w_set) for each M, rotating weight and activation
    copies; on_result(M, us or None, error or None, n_copies)."""
    w0 = _weights(make_w, Ms, on_result)
    if w0 is None:
        return
    w_sets = [w0]
    for M in Ms:
        try:
            act0 = make_act(M)
            n = gpu.n_copies(_nbytes(w0) + _nbytes(act0))
            while len(w_sets) < n:
                w_sets.append(tuple(t.clone() for t in w0))
            acts = [act0] + [tuple(t.clone() for t in act0) for _ in range(n - 1)]
            call(acts[0], w_sets[0])              # raises here if unsupported
            gpu.torch.cuda.synchronize(gpu.dev)

            def launch(i, acts=acts, n=n):
                call(acts[i % n], w_sets[i % n])
            t = gpu.measure(launch)
            on_result(M, t.median_us, None, n)
        except Exception as e:
            on_result(M, None, short_error(e), 0)
        finally:
            launch = acts = act0 = None
    w_sets = w0 = None
    gpu.free()


def _graph_time(gpu, make_w, make_act, call, Ms, N: int,
                on_result: Callable[[int, Optional[float], Optional[str], int], None]) -> None:
    """call in graph mode for each M (graph.py): L layers, each with its own
    weights, activation and output, warmed up and captured by gpu.capture
    (torch.cuda.CUDAGraph), the graph replayed under gpu.measure;
    on_result(M, µs per layer or None, error or None, L)."""
    if not Ms:
        return
    w0 = _weights(make_w, Ms, on_result)
    if w0 is None:
        return
    w_bytes = _nbytes(w0)
    w_sets = [w0]
    for M in Ms:
        L, stage = 0, "layers"
        try:
            act0 = make_act(M)
            layer_bytes = w_bytes + _nbytes(act0) + 4 * M * N     # (+ an output the call makes)
            L = graph_mode.checked_layer_count(w_bytes, layer_bytes, gpu.l2, gpu.mem_budget())
            while len(w_sets) < L:
                w_sets.append(tuple(t.clone() for t in w0))
            acts = [act0] + [tuple(t.clone() for t in act0) for _ in range(L - 1)]

            def enqueue(acts=acts, L=L):
                for i in range(L):
                    call(acts[i], w_sets[i])
            stage = "capture"
            replay = gpu.capture(enqueue)
            stage = "timing"
            t = gpu.measure(lambda i: replay())
            on_result(M, t.median_us / L, None, L)
        except Exception as e:
            on_result(M, None, f"{stage}: " + short_error(e), L)
        finally:
            replay = enqueue = acts = act0 = None
            gpu.free()
    w_sets = w0 = None
    gpu.free()


def time_peers(gpu, peers: Sequence[str], N: int, K: int, Ms: Sequence[int], *,
               graph: bool) -> Dict[int, dict]:
    """{M: the peers' row at N x K}: PEER_us (None on failure) and errors;
    with graph, for M <= graph.MAX_M also PEER_graph_us (µs per layer, None
    on failure), graph_layers {peer: L} and graph_errors {peer: error}."""
    out = {M: {"N": N, "K": K, "M": M, "errors": {}} for M in Ms}
    graph_Ms = [M for M in Ms if M <= graph_mode.MAX_M] if graph else []
    for M in graph_Ms:
        out[M].update(graph_layers={}, graph_errors={})
    defs = peer_defs(gpu, N, K)
    for name in peers:
        make_w, make_act, call = defs[name]

        def done(M, us, err, n, name=name):
            out[M][f"{name}_us"] = _r(us)
            if err:
                out[M]["errors"][name] = err
            gpu.log(f"{N}x{K} M={M} {name}: " + (f"{us:.2f} us" if us is not None else err))

        def graph_done(M, us, err, L, name=name):
            r = out[M]
            r[f"{name}_graph_us"] = _r(us)
            r["graph_layers"][name] = L
            if err:
                r["graph_errors"][name] = err
            gpu.log(f"{N}x{K} M={M} {name}, graph" + (f" of {L} layers: " if L else ": ")
                    + (f"{us:.2f} us per layer" if us is not None else err))
        _rotating_time(gpu, make_w, make_act, call, Ms, done)
        _graph_time(gpu, make_w, make_act, call, graph_Ms, N, graph_done)
    return out
