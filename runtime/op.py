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
from .buckets import bucket_of, representative_M

_STORE = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "int8": "int8",
          "float8_e4m3": "float8_e4m3"}


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
        arrays.check(va, "a", (M, self.K), _STORE[spec.a.dtype], None)
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


def load(spec_or_name, N: int, K: int, arch: Optional[str] = None, db=None, use_db: bool = True) -> MatmulOp:
    """A matmul op for `spec` (a Spec, a shipped spec name or a YAML path) at N x K."""
    return MatmulOp(_spec(spec_or_name), int(N), int(K), arch=arch, db=db, use_db=use_db)
