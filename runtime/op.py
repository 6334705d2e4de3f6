"""`opgen.load(spec, N=, K=)`: a callable matmul op with per-call M dispatch.

Per call: M -> bucket label (a tuple index) -> kernel for that bucket, looked
up once in the tuning DB (winner) or else taken from the planner's
heuristic, then cached on the op. The hot path is a dict hit and a launch.
"""
from __future__ import annotations

from typing import Dict, Optional

from ..codegen import planner
from ..codegen.errors import UserError
from ..codegen.spec import Spec, scale_shape, weight_storage_shape, zero_shape
from . import arrays
from ..codegen.buckets import bucket_of, representative_M


def _spec(spec_or_name) -> Spec:
    if isinstance(spec_or_name, Spec):
        return spec_or_name
    from ..codegen.validate import load_spec, resolve_spec
    return load_spec(resolve_spec(str(spec_or_name)))


class MatmulOp:
    def __init__(self, spec: Spec, N: int, K: int, arch: Optional[str] = None, db=None,
                 use_db: bool = True):
        from .device import current_arch
        if spec.op != "matmul":
            raise UserError(f"{spec.name}: op {spec.op!r} is not a matmul (use opgen.load_quantize)")
        planner.check_shape(spec, N, K)
        self.spec, self.N, self.K = spec, N, K
        self.arch = arch or current_arch()
        self.db, self.use_db = db, use_db
        self._kernels: Dict[str, object] = {}
        self.sources: Dict[str, str] = {}      # bucket -> "db" | "heuristic"
        w = spec.b
        self._shapes = {"qweight": weight_storage_shape(w, N, K)}
        self._dtypes = {"qweight": (w.pack.container if w.pack else
                                    ("uint8" if w.dtype in ("float8_e4m3", "float8_e5m2") else w.dtype))}
        if w.scale is not None:
            self._shapes["scales"] = scale_shape(w.scale, N, K)
            self._dtypes["scales"] = w.scale.dtype
        if w.zero.kind in ("float", "int"):
            self._shapes["zeros"] = zero_shape(w, N, K)
            zd = w.zero.dtype
            self._dtypes["zeros"] = ("int32" if w.zero.pack is not None else zd) if w.zero.kind == "int" else zd

    def config_for(self, M: int) -> planner.Config:
        return self.kernel_for(M).config

    def kernel_for(self, M: int):
        label = bucket_of(M)
        k = self._kernels.get(label)
        if k is None:
            k = self._kernels[label] = self._make_kernel(label)
        return k

    def _make_kernel(self, label: str):
        from .kernel import Kernel
        cfg = None
        if self.use_db:
            try:
                from .tuning_db import TuningDB, make_key
                db = self.db if self.db is not None else TuningDB()
                rec = db.lookup(make_key(self.spec, self.N, self.K, arch=self.arch), label)
                if rec is not None:
                    cfg = planner.Config.from_dict(rec["config"])
                    self.sources[label] = "db"
            except Exception:   # a broken DB never breaks the op: fall back
                cfg = None
        if cfg is None:
            cfg = planner.heuristic(self.spec, self.arch, representative_M(label), self.N, self.K)
            self.sources[label] = "heuristic"
        return Kernel(self.spec, cfg, self.arch)

    def __call__(self, a, qweight, scales=None, zeros=None, bias=None, a_scale=None, out=None):
        spec = self.spec
        va = arrays.view(a, "a")
        if len(va.shape) != 2:
            raise ValueError(f"a: expected 2-D [M, K], got shape {list(va.shape)}")
        M = va.shape[0]
        if M == 0:
            raise ValueError("a: M must be at least 1")
        arrays.check(va, "a", (M, self.K), spec.a.dtype, None)
        dev = va.device
        given = {"qweight": qweight, "scales": scales, "zeros": zeros}
        ptrs = {"a": va.ptr}
        for name, x in given.items():
            if name not in self._shapes:
                if x is not None:
                    raise ValueError(f"{name}: spec {spec.name} has no {name}")
                continue
            if x is None:
                raise ValueError(f"{name}: required by spec {spec.name}, shape {list(self._shapes[name])}")
            v = arrays.view(x, name)
            arrays.check(v, name, self._shapes[name], self._dtypes[name], dev)
            ptrs[{"qweight": "b", "scales": "s", "zeros": "z"}[name]] = v.ptr
        if spec.a.scale == "row":
            if a_scale is None:
                raise ValueError(f"a_scale: {spec.a.dtype} activations need per-row scales [M] float32")
            v = arrays.view(a_scale, "a_scale")
            arrays.check(v, "a_scale", (M,), "float32", dev)
            ptrs["a_scale"] = v.ptr
        if bias is not None:
            if not spec.epilogue.bias:
                raise ValueError(f"bias: spec {spec.name} has epilogue.bias false")
            v = arrays.view(bias, "bias")
            arrays.check(v, "bias", (self.N,), spec.out.dtype, dev)
            ptrs["bias"] = v.ptr
        elif spec.epilogue.bias:
            raise ValueError(f"bias: required by spec {spec.name}, shape [{self.N}]")
        if out is None:
            out = arrays.empty_like_kind(va.kind, va.obj, (M, self.N), spec.out.dtype)
        vo = arrays.view(out, "out")
        arrays.check(vo, "out", (M, self.N), spec.out.dtype, dev)
        ptrs["out"] = vo.ptr
        kern = self.kernel_for(M)
        kern.launch(ptrs, M, self.N, self.K, arrays.stream_for(va.kind, va.obj))
        return out


class QuantizeOp:
    """op quantize: x [M, K] float16/bfloat16 -> (codes [M, K] int8/e4m3, scale [M] float32),
    per-row symmetric, scale = absmax / 127 (int8) or / 448 (e4m3), ties to even."""

    def __init__(self, spec: Spec, K: int, arch: Optional[str] = None):
        from .device import current_arch
        from .kernel import QuantizeKernel
        if K % 8:
            raise UserError(f"{spec.name}: K={K} must be a multiple of 8 (16-byte row loads)")
        self.spec, self.K = spec, K
        self.kernel = QuantizeKernel(spec, arch or current_arch())

    def __call__(self, x, codes=None, scale=None):
        vx = arrays.view(x, "x")
        if len(vx.shape) != 2:
            raise ValueError(f"x: expected 2-D [M, K], got shape {list(vx.shape)}")
        M = vx.shape[0]
        arrays.check(vx, "x", (M, self.K), self.spec.a.dtype, None)
        if codes is None:
            codes = arrays.empty_like_kind(vx.kind, vx.obj, (M, self.K), self.spec.out.dtype)
        if scale is None:
            scale = arrays.empty_like_kind(vx.kind, vx.obj, (M,), "float32")
        vc, vs = arrays.view(codes, "codes"), arrays.view(scale, "scale")
        arrays.check(vc, "codes", (M, self.K), self.spec.out.dtype, vx.device)
        arrays.check(vs, "scale", (M,), "float32", vx.device)
        self.kernel.launch(vx.ptr, vc.ptr, vs.ptr, M, self.K, arrays.stream_for(vx.kind, vx.obj))
        return codes, scale


def load(spec_or_name, N: Optional[int] = None, K: Optional[int] = None, arch: Optional[str] = None,
         db=None, use_db: bool = True):
    """The op for `spec` (a Spec, a shipped spec name or a YAML path): a MatmulOp
    at N x K, or for op quantize a QuantizeOp over rows of K."""
    spec = _spec(spec_or_name)
    if K is None:
        raise UserError(f"{spec.name}: K is required")
    if spec.op == "quantize":
        return QuantizeOp(spec, int(K), arch=arch)
    if N is None:
        raise UserError(f"{spec.name}: N is required")
    return MatmulOp(spec, int(N), int(K), arch=arch, db=db, use_db=use_db)


class QuantizedLinearOp:
    """W8A8 / FP8 linear from float activations, the BMINF pipeline fused to two
    launches: per-row quantize (one pass over x) -> int8/fp8 tensor-core GEMM
    whose epilogue applies scale_a[m] * scale_w[n] (+ bias, activation) and
    casts. BMINF runs three: quantize, cuBLASLt int8 GEMM, elementwise scaling."""

    def __init__(self, spec: Spec, N: int, K: int, input_dtype: str = "float16", **kw):
        from ..codegen.spec import Activation, Output, Spec as S
        if spec.a.scale != "row":
            raise UserError(f"{spec.name}: needs int8/fp8 activations with a per-row scale")
        qspec = S(name=f"quantize_{spec.a.dtype}_{input_dtype}", op="quantize",
                  a=Activation(input_dtype), b=None, out=Output(spec.a.dtype))
        self.quantize = QuantizeOp(qspec, K, arch=kw.get("arch"))
        self.matmul = MatmulOp(spec, N, K, **kw)

    def __call__(self, x, qweight, scales=None, zeros=None, bias=None, out=None):
        codes, a_scale = self.quantize(x)
        return self.matmul(codes, qweight, scales, zeros, bias=bias, a_scale=a_scale, out=out)


def load_linear(spec_or_name, N: int, K: int, input_dtype: str = "float16", **kw) -> QuantizedLinearOp:
    """A linear layer taking float activations for an int8/fp8-activation spec
    (e.g. "w8a8_int8"): quantize + GEMM with both scales fused."""
    return QuantizedLinearOp(_spec(spec_or_name), int(N), int(K), input_dtype, **kw)
