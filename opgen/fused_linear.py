"""Sibling linear layers that read the same input, run as one wider layer.

In a decoder layer q, k and v read the same normed hidden state, and so do
the MLP's gate and up projections. One matmul of their stacked weights (N
the sum of theirs) costs one launch and one pass over the input instead of
three or two; at decode (M = 1) a 1024-row k or v projection is mostly
launch and tail (docs/performance.md, Whole-model decode). The wide layer
runs when the first sibling is called; the others take their columns of its
output, a view, when they are called with the same input tensor (the same
object, not modified in place since: its version counter), in the same
thread. With another input, or a sibling called twice, the wide layer runs
again: slower, not wrong. The output is let go of once every sibling has
taken its columns, so an input is only matched between its siblings' calls
(transformers' q / k / v and gate / up calls follow each other).

What the match cannot see: an input changed in place between those calls
without its version counter (through .data, numpy, DLPack or raw pointers),
or under torch.compile and inference mode, where there is no counter to
read (identity alone then). transformers' modules never do either.

The shared state is a plain object (FusedOutput), one per thread:
torch.compile traces it into one matmul, and a CUDA graph captures the one
launch. Torch only; the stacked quantized layer is opgen.torch's
(QuantLinear.stacked, fuse_siblings).
"""
import threading
from typing import List, Mapping, Sequence, Tuple

import torch
from torch import nn

from .model_shapes import CROSS_ATTENTION, FUSE_GROUPS


def sibling_groups(model: nn.Module, eligible: Sequence[str],
                   groups: Sequence[Sequence[str]] = FUSE_GROUPS) -> List[Tuple[str, ...]]:
    """The qualified names of `eligible` layers of model (nn.Linear or
    opgen's QuantLinear) that fuse: for each module but cross-attention
    (CROSS_ATTENTION), each of `groups` whose members are all its children,
    all eligible, of one kind (class, spec, launch), in_features, dtype and
    device; a layer in one group only (the first that takes it)."""
    ok = set(eligible)
    out = []
    for parent_name, parent in model.named_modules():
        if parent_name.rpartition(".")[2] in CROSS_ATTENTION:
            continue
        prefix = f"{parent_name}." if parent_name else ""
        for group in groups:
            names = [prefix + child for child in group]
            if all(n in ok for n in names) and \
                    len({_kind(parent.get_submodule(child)) for child in group}) == 1:
                out.append(tuple(names))
                ok -= set(names)          # (groups that overlap: the first one given)
    return out


def _kind(layer: nn.Module) -> tuple:
    """What siblings must share to stack: class, the spec their kernels run
    (its content, layout included), launch (pdl), in_features, and the
    dtype and device of the first tensor held."""
    t = next(layer.parameters(), None)
    if t is None:
        t = next(layer.buffers(), None)
    ks = getattr(layer, "kernel_spec", None)
    return (type(layer), None if ks is None else ks.content_hash(), getattr(layer, "pdl", None),
            layer.in_features, None if t is None else (t.dtype, t.device))


class FusedOutput:
    """The wide layer's output, shared by its parts: computed for an input
    when a part asks first, kept until every part has taken its columns."""

    def __init__(self, wide: nn.Module, sizes: Sequence[int]):
        self.wide = wide
        self.bounds = []
        lo = 0
        for n in sizes:
            self.bounds.append((lo, lo + n))
            lo += n
        self._local = threading.local()      # (threads running one model each match their own input)

    def __getstate__(self):                  # (copies and pickles hold no input or output)
        return {"wide": self.wide, "bounds": self.bounds}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._local = threading.local()

    def part(self, i: int, x):
        compiling = torch.compiler.is_compiling()
        s = self if compiling else self._local     # (traced once: no thread state to keep apart)
        version = None if compiling or x.is_inference() else x._version
        if getattr(s, "x", None) is not x or s.version != version or i in s.served:
            s.x, s.version, s.out, s.served = x, version, self.wide(x), set()
        s.served.add(i)
        lo, hi = self.bounds[i]
        out = s.out[..., lo:hi]
        if len(s.served) == len(self.bounds):       # every part served: let go of them
            s.x = s.out = None
        return out


class FusedPart(nn.Module):
    """One sibling's output: columns [lo, hi) of the wide layer's. Part 0
    holds the wide layer as its submodule (its buffers are in the state
    dict, .to() moves them); the others reach it through the shared
    FusedOutput."""

    def __init__(self, shared: FusedOutput, index: int):
        super().__init__()
        if index == 0:
            self.wide = shared.wide
        self.shared, self.index = shared, index
        lo, hi = shared.bounds[index]
        self.in_features, self.out_features = getattr(shared.wide, "in_features", None), hi - lo

    def forward(self, x):
        return self.shared.part(self.index, x)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # A state dict of separate layers holds this part's own tensors: an
        # error naming the cure, under strict=False too (the stacked storage
        # would stay unfilled).
        own = [k for k in state_dict if k.startswith(prefix) and not k.startswith(prefix + "wide.")]
        if own:
            error_msgs.append(f"{own[0]}: a separate layer's tensor, but {prefix[:-1] or 'this layer'} is "
                              f"part of a stacked layer (siblings fused); load it into layers replaced "
                              f"with fuse=False")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def dequantized(self):
        """This part's rows of the wide layer's real weight (its dequantized())."""
        lo, hi = self.shared.bounds[self.index]
        return self.shared.wide.dequantized()[lo:hi]

    # What a part shares with the wide layer (QuantLinear's spec and launch),
    # so that code reading a replaced layer's spec works on a part too.
    spec = property(lambda self: self.shared.wide.spec)
    spec_name = property(lambda self: self.shared.wide.spec_name)
    kernel_spec = property(lambda self: self.shared.wide.kernel_spec)
    pdl = property(lambda self: self.shared.wide.pdl)

    def extra_repr(self) -> str:
        lo, hi = self.shared.bounds[self.index]
        return f"part {self.index} of {len(self.shared.bounds)}: columns {lo}:{hi}"


def fused_parts(wide: nn.Module, sizes: Sequence[int]) -> List[FusedPart]:
    """The parts of one wide layer whose outputs are `sizes` columns wide, in order."""
    shared = FusedOutput(wide, sizes)
    return [FusedPart(shared, i) for i in range(len(sizes))]


def install(model: nn.Module, modules: Mapping[str, nn.Module]) -> None:
    """Set each qualified name of model to its module."""
    for name, mod in modules.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, mod)
