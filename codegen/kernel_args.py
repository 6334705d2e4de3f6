"""The matmul kernels' argument list, declared once: every template's
signature is emitted from it (`kernel_params`, a Jinja global), the build
plan lists it (plan.json "arguments"), and the launcher passes its values in
this order (runtime/kernel.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple


@dataclass(frozen=True)
class Arg:
    name: str     # what callers call it: plan.json, the launcher's pointers
    ctype: str    # the C type a caller passes
    doc: str
    param: str = ""   # the kernel's own declaration, where it is not "ctype name"

    @property
    def declaration(self) -> str:
        """The parameter in the kernel's signature; every pointer is
        __restrict__ (no two arguments alias)."""
        decl = self.param or f"{self.ctype} {self.name}"
        ctype, name = decl.rsplit(" ", 1)
        return f"{ctype} __restrict__ {name}" if ctype.endswith("*") else decl

    def describe(self) -> dict:
        """The plan's entry (plan.json "arguments")."""
        return dict(name=self.name, type=self.ctype, doc=self.doc)


# The kernels take the activations and the weights as bytes (A, B: their
# element types are the spec's, named in the source as the typed views a, b).
ARGUMENTS: Tuple[Arg, ...] = (
    Arg("a", "const void*", "activations [M, K] (row-major, spec a.dtype)", "const uint8_t* A"),
    Arg("a_scale", "const float*", "per-row activation scales [M] (int8/fp8 activations) or null"),
    Arg("b", "const void*", "stored weight (qweight) in the spec's layout", "const uint8_t* B"),
    Arg("s", "const void*", "weight scales in the spec's layout, or null", "const void* S"),
    Arg("z", "const void*", "weight zero points in the spec's layout, or null", "const void* Z"),
    Arg("bias", "const void*", "bias [N] (out dtype) or null"),
    Arg("out", "void*", "output [M, N] (row-major, spec out.dtype)"),
    Arg("ws", "float*", "split-K workspace [M*N] fp32, zero-initialised once (kernels leave it zeroed)"),
    Arg("counters", "int*", "split-K tile counters, zero-initialised once"),
    Arg("M", "int", ""), Arg("N", "int", ""), Arg("K", "int", ""),
)

# The TMA GEMMs (launches whose "tma" entry is set) take their operands as
# tensor maps passed by value instead of a / b (TmaDesc: templates/tma.cuh).
TMA_ARGUMENTS: Tuple[Arg, ...] = (
    Arg("tmA", "const __grid_constant__ CUtensorMap",
        "activations [M, K]: cuTensorMapEncodeTiled, 2-D, box = tma.box_a, 128-byte swizzle, zero OOB fill",
        "const __grid_constant__ TmaDesc tmA"),
    Arg("tmB", "const __grid_constant__ CUtensorMap",
        "weights: dense [N, K] (for predecode: the dequant launch's output), box = tma.box_b, same "
        "settings; or the stored words of decoded weights as 4-byte elements [rows, row bytes / 4] "
        "of their stored layout, box = tma.box_b, no swizzle",
        "const __grid_constant__ TmaDesc tmB"),
) + tuple(a for a in ARGUMENTS if a.name not in ("a", "b"))


def kernel_params(args: Sequence[Arg]) -> str:
    """The parameter list of a kernel's signature, `name(` ... `)`, wrapped
    at 100 columns as the templates lay it out (`{{ kernel_name }}(` first)."""
    lines, line = [], ""
    col = len("{{ kernel_name }}(")
    for i, a in enumerate(args):
        piece = a.declaration + ("," if i < len(args) - 1 else "")
        if line and col + len(line) + 1 + len(piece) > 100:
            lines.append(line)
            line, col = "", 11
        line = f"{line} {piece}" if line else piece
    return f"\n{' ' * 11}".join(lines + [line])
