"""`opgen.load(spec, N=, K=)`: a callable matmul op with per-call M dispatch.

Per call: M -> bucket label (a tuple index) -> kernel for that bucket, looked
up once in the tuning DB (winner) or else taken from the planner's
heuristic, then cached on the op. The hot path is a dict hit and a launch.
"""
from __future__ import annotations

import os
import warnings
from typing import Dict, Optional

from ..codegen import hw, planner
from ..codegen.compiler import CompileError, default_config
from ..codegen.buckets import bucket_of, representative_M
from ..codegen.errors import UserError
from ..codegen.spec import Activation, Output, Spec, stored_shapes
from ..codegen.resolve import as_spec
from ..codegen.transcode import transcode
from . import arrays
from .device import NoGPUError, current_arch, planning_sms
from .kernel import Kernel, QuantizeKernel
from .tuning_db import TuningDB, make_key


LAYOUTS = ("execution", "stored")


class PreparedWeight:
    """A weight moved into an op's execution layout (MatmulOp.prepare): its
    tensors in the storage of `spec`, the op's kernel spec, at N x K, of
    the kind (numpy, CuPy, torch) they were given as."""

    def __init__(self, spec: Spec, N: int, K: int, tensors: Dict[str, object]):
        self.spec, self.N, self.K, self.tensors = spec, N, K, tensors

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in self.tensors.items())
        return f"PreparedWeight({self.spec.name}, N={self.N}, K={self.K}: {shapes})"


class MatmulOp:
    """out = a @ W^T for `spec` at N x K. The kernels run on the spec's
    execution layout (planner.execution: the same weight stored as the
    fastest kernels read it): `prepare` moves a weight there once, and calls
    take what it returns. Where the spec already stores the weight that way
    (or layout="stored" keeps the spec's own storage, with the kernels that
    read it), calls take the spec's tensors as they are. pdl: its kernels
    launched for programmatic dependent launch (runtime/kernel.py's Kernel);
    off until measured on the GPU. db: the tuning DB its configs come from
    (a TuningDB or a DB file's path; default the user's, over the shipped
    one); use_db=False: the heuristic's picks only."""

    def __init__(self, spec: Spec, N: int, K: int, arch: Optional[str] = None, db=None,
                 use_db: bool = True, layout: str = "execution", pdl: bool = False):
        if spec.op != "matmul":
            raise UserError(f"{spec.name}: op {spec.op!r} is not a matmul (opgen.load gives quantize specs their own op)")
        if layout not in LAYOUTS:
            raise UserError(f"layout: {layout!r}, expected one of {', '.join(LAYOUTS)}")
        planner.check_shape(spec, N, K)
        self.spec, self.N, self.K = spec, int(N), int(K)       # (numpy integers too)
        self.arch = _arch(arch)
        # What the kernels read; the DB's key and the kernels' names are its.
        self.kernel_spec = planner.execution_spec(spec, self.arch) if layout == "execution" else spec
        self.sms = planning_sms()
        if isinstance(db, (str, os.PathLike)):
            db = TuningDB(db)
        elif db is not None and not isinstance(db, TuningDB):
            raise TypeError(f"db: a TuningDB or the path of a tuning DB file, not {type(db).__name__}")
        self.db, self.use_db, self.pdl = db, use_db, pdl
        self._kernels: Dict[str, object] = {}
        self.sources: Dict[str, str] = {}      # bucket -> "db" | "heuristic"
        spec = self.kernel_spec
        w = spec.b
        self._shapes = stored_shapes(spec, N, K)
        # Unpacked codes by their meaning (fp8 as float8_e4m3fn or its uint8 bits: arrays.ACCEPT)
        self._dtypes = {"qweight": w.pack.container if w.pack else w.dtype}
        if w.scale is not None:
            self._dtypes["scales"] = w.scale.dtype
        if w.zero.kind in ("float", "int"):
            zd = w.zero.dtype
            self._dtypes["zeros"] = ("int32" if w.zero.pack is not None else zd) if w.zero.kind == "int" else zd

    def config_for(self, M: int) -> planner.Config:
        """The config M's calls run (no GPU needed: nothing is compiled or loaded)."""
        label = bucket_of(M)
        k = self._kernels.get(label)
        return k.config if k is not None else self.choose(label)

    def kernel_for(self, M: int):
        label = bucket_of(M)
        k = self._kernels.get(label)
        if k is None:
            k = self._kernels[label] = self._make_kernel(label)
        return k

    def choose(self, label: str, from_db: bool = True, compiled: bool = True) -> planner.Config:
        """The config of M bucket `label`: the tuning DB's winner, else the
        planner's heuristic pick for this GPU's SM count, passing over picks
        that spill (compiler.default_config; compiled=False: the first pick,
        without compiling it). self.sources says which. The one place that
        makes this choice (the bench's precompile asks it too)."""
        key = None
        if self.use_db and from_db:
            try:
                key = make_key(self.kernel_spec, self.N, self.K, arch=self.arch)
            except NoGPUError:       # no device to name: no record applies (config_for without a GPU)
                pass
        if key is not None:
            try:
                db = self.db if self.db is not None else TuningDB()
                rec = db.lookup(key, label)
                if rec is not None:
                    self.sources[label] = "db"
                    return planner.Config.from_dict(rec["config"])
            except Exception as e:   # a broken DB never breaks the op: fall back, and say so
                warnings.warn(f"{self.kernel_spec.name}: the tuning DB's record for M bucket {label} "
                              f"is unusable ({type(e).__name__}: {e}); using the heuristic's pick",
                              RuntimeWarning, stacklevel=2)
        self.sources[label] = "heuristic"
        M = representative_M(label)
        if not compiled:
            return planner.heuristic(self.kernel_spec, self.arch, M, self.N, self.K, sms=self.sms)
        return default_config(self.kernel_spec, self.arch, M, self.N, self.K, sms=self.sms)

    def _make_kernel(self, label: str) -> Kernel:
        cfg = self.choose(label)
        try:
            return Kernel(self.kernel_spec, cfg, self.arch, self.pdl)
        except CompileError as e:
            if self.sources[label] != "db":
                raise
            # A record that renders as when it was tuned but that this NVRTC
            # refuses: the heuristic's kernel serves instead, and we say so.
            warnings.warn(f"{self.kernel_spec.name}: tuned config {cfg.name} does not compile here "
                          f"({str(e).splitlines()[0]}); using the heuristic's pick")
            return Kernel(self.kernel_spec, self.choose(label, from_db=False), self.arch, self.pdl)

    def prepare(self, qweight, scales=None, zeros=None) -> PreparedWeight:
        """The weight, given in the spec's storage, moved into the kernels'
        (codegen.transcode: bit-exact, nothing re-quantized). Once per weight,
        at load: CuPy arrays and torch CUDA tensors are moved on the GPU, on
        the caller's current stream; numpy arrays and torch CPU tensors on the
        CPU. The result is of the kind given."""
        given = {k: v for k, v in (("qweight", qweight), ("scales", scales), ("zeros", zeros))
                 if v is not None}
        if self.kernel_spec is self.spec:
            return PreparedWeight(self.spec, self.N, self.K, given)
        moved = arrays.transcoded(lambda t: transcode(self.spec, self.kernel_spec, t, self.N, self.K),
                                  given)
        return PreparedWeight(self.kernel_spec, self.N, self.K, moved)

    def _weights(self, qweight, scales, zeros) -> Dict[str, object]:
        """The tensors the kernels read, from a call's arguments."""
        if isinstance(qweight, PreparedWeight):
            p = qweight
            if scales is not None or zeros is not None:
                raise ValueError("scales, zeros: a PreparedWeight holds them; pass it alone")
            same = p.spec is self.kernel_spec or p.spec == self.kernel_spec
            if not same or (p.N, p.K) != (self.N, self.K):
                raise ValueError(f"weight: prepared for {p.spec.name} {p.N}x{p.K}, this op runs "
                                 f"{self.kernel_spec.name} {self.N}x{self.K}")
            return {"qweight": p.tensors.get("qweight"), "scales": p.tensors.get("scales"),
                    "zeros": p.tensors.get("zeros")}
        if self.kernel_spec is not self.spec:
            # The same bytes could be read either way (an order of the fields,
            # a square word grid): never guess which storage they are in.
            raise UserError(
                f"qweight: {self.spec.name}'s kernels read its execution layout "
                f"({self.kernel_spec.name}): prepare the weight once, w = op.prepare(qweight, "
                f"scales, zeros), and call op(a, w); or load with layout='stored' to run "
                f"the kernels of the stored form")
        return {"qweight": qweight, "scales": scales, "zeros": zeros}

    def __call__(self, a, qweight, scales=None, zeros=None, bias=None, a_scale=None, out=None):
        """out [M, N] = a [M, K] @ W^T: qweight a PreparedWeight (from
        prepare), or, where the kernels read the spec's own storage, its
        qweight, scales and zeros."""
        spec = self.kernel_spec
        given = self._weights(qweight, scales, zeros)
        va = arrays.view(a, "a")
        if len(va.shape) != 2:
            raise ValueError(f"a: expected 2-D [M, K], got shape {list(va.shape)}")
        M = va.shape[0]
        if M == 0:
            raise ValueError("a: M must be at least 1")
        arrays.check(va, "a", (M, self.K), spec.a.dtype, None)
        dev = va.device
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
        if spec.a.scale != "row" and a_scale is not None:
            raise ValueError(f"a_scale: spec {spec.name} has {spec.a.dtype} activations, which take no scale")
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
    per-row symmetric, scale = absmax / 127 (int8) or / 448 (e4m3), ties to even
    (pdl: MatmulOp's)."""

    def __init__(self, spec: Spec, K: int, arch: Optional[str] = None, pdl: bool = False):
        try:
            planner.check_shape(spec, K=K)
        except planner.PlanError as e:
            raise UserError(f"{spec.name}: {e}") from None
        self.spec, self.K = spec, int(K)
        self.kernel = QuantizeKernel(spec, _arch(arch), pdl)

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


def _arch(arch: Optional[str]) -> str:
    """The target: the GPU's, or a named one that codegen knows (UserError
    listing them otherwise)."""
    if arch is None:
        return current_arch()
    try:
        return hw.arch(arch).name
    except ValueError as e:
        raise UserError(str(e)) from None


def load(spec_or_name, N: Optional[int] = None, K: Optional[int] = None, arch: Optional[str] = None,
         db=None, use_db: bool = True, layout: str = "execution", pdl: bool = False):
    """The op for `spec` (a Spec, a shipped spec name or a YAML path): a MatmulOp
    at N x K (layout, pdl: MatmulOp's; pdl is off by default until measured
    on the GPU), or for op quantize a QuantizeOp over rows of K."""
    spec = as_spec(spec_or_name)
    if K is None:
        raise UserError(f"{spec.name}: K is required")
    if spec.op == "quantize":
        return QuantizeOp(spec, K, arch=arch, pdl=pdl)
    if N is None:
        raise UserError(f"{spec.name}: N is required")
    return MatmulOp(spec, N, K, arch=arch, db=db, use_db=use_db, layout=layout, pdl=pdl)


class QuantizedLinearOp:
    """W8A8 / FP8 linear from float activations, the BMINF pipeline fused to two
    launches: per-row quantize (one pass over x) -> int8/fp8 tensor-core GEMM
    whose epilogue applies scale_a[m] * scale_w[n] (+ bias, activation) and
    casts. BMINF runs three: quantize, cuBLASLt int8 GEMM, elementwise scaling."""

    def __init__(self, spec: Spec, N: int, K: int, input_dtype: str = "float16", **kw):
        if spec.a.scale != "row":
            raise UserError(f"{spec.name}: needs int8/fp8 activations with a per-row scale")
        self.quantize = QuantizeOp(quantize_spec(spec, input_dtype), K, arch=kw.get("arch"),
                                   pdl=kw.get("pdl", False))
        self.matmul = MatmulOp(spec, N, K, **kw)

    def prepare(self, qweight, scales=None, zeros=None) -> PreparedWeight:
        return self.matmul.prepare(qweight, scales, zeros)

    def __call__(self, x, qweight, scales=None, zeros=None, bias=None, out=None):
        codes, a_scale = self.quantize(x)
        return self.matmul(codes, qweight, scales, zeros, bias=bias, a_scale=a_scale, out=out)


def load_linear(spec_or_name, N: int, K: int, input_dtype: str = "float16", **kw) -> QuantizedLinearOp:
    """A linear layer taking float activations for an int8/fp8-activation spec
    (e.g. "w8a8_int8"): quantize + GEMM with both scales fused."""
    return QuantizedLinearOp(as_spec(spec_or_name), N, K, input_dtype, **kw)


def quantize_spec(spec: Spec, input_dtype: str = "float16") -> Spec:
    """The op-quantize spec of QuantizedLinearOp's first launch for `spec`:
    input_dtype rows -> spec's activation codes and per-row scales."""
    return Spec(name=f"quantize_{spec.a.dtype}_{input_dtype}", op="quantize",
                a=Activation(input_dtype), b=None, out=Output(spec.a.dtype))
