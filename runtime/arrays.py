"""Array interop: CuPy arrays and torch tensors in, the same kind out.

Only device pointers, shapes, strides and dtypes are read (zero-copy). A
storage dtype is named by its bytes' meaning in the spec language, so
bfloat16 may arrive as torch.bfloat16 or as uint16 bits, fp8 as
torch.float8_e4m3fn or uint8 bits, and an int32 container as int32 or uint32.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

ALIGN = 16

# storage dtype name -> accepted (framework-neutral) dtype names
ACCEPT = {
    "float16": ("float16",),
    "bfloat16": ("bfloat16", "uint16", "int16"),
    "float32": ("float32",),
    "int8": ("int8",),
    "uint8": ("uint8", "int8"),
    "float8_e4m3": ("float8_e4m3fn", "uint8", "int8"),
    "float8_e5m2": ("float8_e5m2", "uint8", "int8"),
    "e8m0": ("uint8", "float8_e8m0fnu", "int8"),
    "int32": ("int32", "uint32"),
}


@dataclass(frozen=True)
class View:
    ptr: int
    shape: Tuple[int, ...]
    dtype: str
    contiguous: bool
    device: int
    kind: str          # "cupy" | "torch"
    obj: object


def view(x, what: str) -> View:
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        if not x.is_cuda:
            raise ValueError(f"{what}: a torch tensor on {x.device}; opgen needs it on a CUDA device")
        return View(x.data_ptr(), tuple(x.shape), str(x.dtype).replace("torch.", ""),
                    x.is_contiguous(), x.device.index or 0, "torch", x)
    if mod == "cupy":
        return View(x.data.ptr, tuple(x.shape), str(x.dtype), bool(x.flags.c_contiguous),
                    x.device.id, "cupy", x)
    raise ValueError(f"{what}: expected a CuPy array or a torch CUDA tensor, got {type(x).__name__}")


def check(v: View, what: str, shape: Tuple[int, ...], storage: str, device: Optional[int]) -> None:
    if v.shape != tuple(shape):
        raise ValueError(f"{what}: shape {list(v.shape)}, expected {list(shape)}")
    ok = ACCEPT.get(storage, (storage,))
    if v.dtype not in ok:
        raise ValueError(f"{what}: dtype {v.dtype}, expected {storage} (as {' or '.join(ok)})")
    if not v.contiguous:
        raise ValueError(f"{what}: must be contiguous (row-major)")
    if v.ptr % ALIGN:
        # The kernels move 16-byte vectors (cp.async, ld.global.v4).
        raise ValueError(f"{what}: data pointer must be {ALIGN}-byte aligned (is {v.ptr % ALIGN} past)")
    if device is not None and v.device != device:
        raise ValueError(f"{what}: on device {v.device}, but the inputs are on device {device}")


def empty_like_kind(kind: str, ref, shape, storage: str):
    """A new output array of the caller's kind, on the same device."""
    if kind == "torch":
        import torch
        dt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
              "int8": torch.int8, "float8_e4m3": torch.float8_e4m3fn, "int32": torch.int32}[storage]
        return torch.empty(shape, dtype=dt, device=ref.device)
    import cupy
    dt = {"float16": "float16", "bfloat16": "uint16", "float32": "float32", "int8": "int8",
          "float8_e4m3": "uint8", "int32": "int32"}[storage]
    with cupy.cuda.Device(ref.device.id):
        return cupy.empty(shape, dtype=dt)


def stream_for(kind: str, ref):
    """The caller's current stream, as a CuPy stream object."""
    import cupy
    if kind == "torch":
        import torch
        s = torch.cuda.current_stream(ref.device)
        return cupy.cuda.ExternalStream(s.cuda_stream)
    return cupy.cuda.get_current_stream()


# --- host and device arrays for array code (codegen.transcode) -------------------------

_INT_OF_SIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def _as_xp(x, what: str):
    """x as a numpy or CuPy array sharing its memory (torch tensors through
    DLPack, reinterpreted as the integer type of their width: CuPy has no
    bfloat16 or fp8), and the way back to x's kind and dtype."""
    mod = type(x).__module__.split(".")[0]
    if mod in ("numpy", "cupy"):
        return x, lambda y: y
    if mod != "torch":
        raise ValueError(f"{what}: expected a numpy or CuPy array or a torch tensor, got {type(x).__name__}")
    import torch
    bits = x.detach().contiguous()
    bits = bits.view(getattr(torch, _INT_OF_SIZE[bits.element_size()]))
    if bits.is_cuda:
        import cupy
        arr = cupy.from_dlpack(bits)
    else:
        arr = bits.numpy()

    def back(y):
        t = torch.from_dlpack(y) if x.is_cuda else torch.from_numpy(y)
        t = t.to(x.device) if t.device != x.device else t
        # same width as given: back to the given dtype (bfloat16 scales stay bfloat16)
        return t.view(x.dtype) if t.element_size() == x.element_size() else t
    return arr, back


def transcoded(fn, tensors: dict) -> dict:
    """fn (numpy or CuPy arrays in, of one kind out) run on `tensors` of any
    supported kind, each result returned as the kind of the input of the same
    name. CuPy work runs on the caller's current stream (torch's, for torch
    tensors)."""
    conv = {k: _as_xp(v, k) for k, v in tensors.items()}
    arrs = {k: a for k, (a, _) in conv.items()}
    first = next(iter(tensors.values()))
    if type(first).__module__.split(".")[0] == "torch" and first.is_cuda:
        with stream_for("torch", first):
            out = fn(arrs)
    else:
        out = fn(arrs)
    return {k: conv[k][1](v) if k in conv else v for k, v in out.items()}
