"""`opgen bench --e2e`: what opgen does to a model's decode speed.

A transformers model is built from its config with random weights (no
download; e2e_model.py), and for each variant (e2e_variants.py: fp16, opgen
specs, the torch int4 and gemlite peers) its decoder's linear layers are
swapped for the variant's (lm_head stays fp16). For each batch size:

* Speed: the prompts (random tokens, prompt_len each) are prefilled, then
  new_tokens - 1 greedy decode steps run, one step compiled by
  torch.compile (unless plan.compile is off) and captured in a CUDA graph
  (static KV cache), timed with CUDA events; the median over `repeats` runs
  gives ms per step and tokens/s (batch / step time), and the speedup over
  fp16 at the same batch.
* Accuracy (kernel error alone): the same model holding the variant's
  dequantized weights in fp16 is the reference. It decodes greedily (its
  tokens and logits), then the variant and the reference computed in fp32
  are run teacher-forced on those tokens: rel_err = max |logits - ref| /
  max |ref| of the variant, against the reference's own fp16-vs-fp32
  rel_err_fp32; agreement = the fraction of positions where the variant's
  greedy token (given the reference's tokens before it) is the reference's,
  against the fp32 reference's own (agreement_fp32: with random weights the
  logits are nearly flat, and fp32 alone flips many).
* Check: before any of that, one layer of the variant against its
  dequantized weight on random inputs (a wrong layer is an error row, never
  timed as if it were right).

On a machine without CUDA everything runs eagerly on the CPU (opgen's layers
through the numpy reference): for tests, not for figures."""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence

from .. import __version__
from ..codegen.errors import UserError
from ..runtime.device import current_arch
from ..runtime.tuning_db import TuningDB
from . import e2e_load, e2e_report
from . import precompile as compiles
from .e2e_model import Decoder, build_model, linear_names, swapped
from .e2e_variants import Variant, reference_class, variant
from .failures import short_error

DEFAULT_MODEL = "llama-3-8b"
DEFAULT_BATCHES = (1, 16, 64)
DEFAULT_PROMPT = 128
DEFAULT_NEW_TOKENS = 64
DEFAULT_REPEATS = 3
CHECK_ROWS = 16


@dataclass
class Plan:
    model: str                      # the name or path given
    config: dict
    source: str
    batches: Sequence[int] = DEFAULT_BATCHES
    prompt: int = DEFAULT_PROMPT
    new_tokens: int = DEFAULT_NEW_TOKENS
    variants: Sequence[str] = ()
    repeats: int = DEFAULT_REPEATS
    accuracy: bool = True
    compile: bool = True            # the decode step through torch.compile (e2e_model.Decoder)
    load_time: bool = False         # also time a GPTQ checkpoint of the model loading (e2e_load.py)
    seed: int = 0


@dataclass
class Row:
    variant: str
    batch: int
    ms_per_step: Optional[float] = None
    tokens_per_s: Optional[float] = None
    speedup: Optional[float] = None           # over fp16 at this batch
    prefill_ms: Optional[float] = None
    graph: Optional[bool] = None              # decode steps replayed from a CUDA graph
    rel_err: Optional[float] = None
    rel_err_fp32: Optional[float] = None
    agreement: Optional[float] = None
    agreement_fp32: Optional[float] = None
    error: Optional[str] = None
    times_ms: List[float] = field(default_factory=list)


def _log(text: str) -> None:
    print(f"opgen bench --e2e: {text}", file=sys.stderr, flush=True)


class Clock:
    """CUDA events on a GPU, the wall clock (after a synchronize) on the CPU."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.type == "cuda"

    def ms(self, fn: Callable[[], None]) -> float:
        torch = self.torch
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b)
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3


def check_layer(torch, v: Variant, mod, real, linear) -> Optional[str]:
    """None when the variant's layer matches its dequantized weight (its
    activations as its kernels take them) on random inputs, else why not."""
    if real is None:
        return None
    g = torch.Generator(device=linear.weight.device).manual_seed(1)
    x = torch.randn(CHECK_ROWS, linear.in_features, generator=g, device=linear.weight.device,
                    dtype=torch.float32).to(linear.weight.dtype)
    with torch.no_grad():
        got = mod(x).float()
        want = reference_class()(real.to(torch.float16), v.act, torch.float32)(x.float())
    err = float((got - want).norm() / want.norm().clamp(min=1e-30))
    if not (err <= v.check_tol):
        return (f"layer check: {err:.3g} relative error against its dequantized weight "
                f"(> {v.check_tol:g})")
    return None


class Bench:
    def __init__(self, plan: Plan, log: Callable[[str], None] = _log):
        try:
            import torch
        except ImportError:
            raise UserError("opgen bench --e2e needs torch and transformers "
                            "(pip install torch transformers)") from None
        self.torch, self.plan, self.log = torch, plan, log
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
        self.graph = self.device.type == "cuda"
        # On the CPU the run tests its own logic: eager and uncaptured
        # (Inductor's CPU compile of every row would be most of its time).
        self.compile = plan.compile and self.graph
        self.clock = Clock(torch, self.device)
        t = time.perf_counter()
        self.model = build_model(plan.config, self.device, torch.float16, plan.seed)
        self.build_s = time.perf_counter() - t
        self.names = linear_names(self.model)
        V = self.model.config.vocab_size
        gen = torch.Generator().manual_seed(plan.seed)
        self.prompts = {B: torch.randint(0, V, (B, plan.prompt), generator=gen).to(self.device)
                        for B in plan.batches}

    # --- speed ---

    def decode_time(self, B: int, row: Row) -> None:
        """Time the model as it is at batch B into row."""
        plan, prompt = self.plan, self.prompts[B]
        dec = Decoder(self.model, B, plan.prompt, plan.new_tokens, compile=self.compile)
        if self.graph:
            dec.capture(prompt)                 # (compiles in its warm-up steps)
        row.graph = self.graph
        steps, prefill = [], []
        for _ in range(plan.repeats):
            prefill.append(self.clock.ms(lambda: dec.prefill(prompt)))
            steps.append(self.clock.ms(lambda: [dec.step() for _ in range(plan.new_tokens - 1)])
                         / max(plan.new_tokens - 1, 1))
        row.times_ms = [round(t, 4) for t in steps]
        row.ms_per_step = statistics.median(steps)
        row.prefill_ms = statistics.median(prefill)
        row.tokens_per_s = B / row.ms_per_step * 1e3

    # --- accuracy ---

    def accuracy(self, B: int, v: Variant, mods: dict, reals: dict, row: Row) -> None:
        torch, plan, prompt = self.torch, self.plan, self.prompts[B]
        Reference, act = reference_class(), v.act
        ref16 = {n: Reference(w, act, torch.float16) for n, w in reals.items()}
        store = torch.empty(plan.new_tokens, B, self.model.config.vocab_size, device=self.device)
        with swapped(self.model, ref16):
            ref_tokens = Decoder(self.model, B, plan.prompt, plan.new_tokens).run(
                prompt, each=lambda t, lg: store[t].copy_(lg))
        diff, row.agreement = self._max_diff(mods, B, ref_tokens, store)
        row.rel_err = diff / float(store.abs().max())
        # The reference in fp32: its fp16 weights multiplied in fp32 (not TF32),
        # the other parameters (embeddings, norms, lm_head) cast there and back,
        # exactly (buffers such as the rotary frequencies stay as they are).
        precision = torch.get_float32_matmul_precision()
        with swapped(self.model, {n: Reference(w, act, torch.float32) for n, w in reals.items()}):
            params = list(self.model.parameters())
            for p in params:
                p.data = p.data.float()
            torch.set_float32_matmul_precision("highest")
            try:
                row.rel_err_fp32, row.agreement_fp32 = self._max_diff({}, B, ref_tokens, store,
                                                                      ref_scale=True)
            finally:
                torch.set_float32_matmul_precision(precision)
                for p in params:
                    p.data = p.data.half()

    def _max_diff(self, mods: dict, B: int, force, store, ref_scale: bool = False):
        """(max |logits - store|, agreement) over a run of the model with mods
        swapped in, teacher-forced on `force` (the reference's greedy tokens):
        ref_scale: divided by max |logits| of this run; agreement: the
        fraction of positions whose greedy token equals force's."""
        torch, plan = self.torch, self.plan
        worst = torch.zeros((), device=self.device)
        top = torch.zeros((), device=self.device)

        def each(t, lg):
            torch.maximum(worst, (lg - store[t]).abs().max(), out=worst)
            torch.maximum(top, lg.abs().max(), out=top)
        with swapped(self.model, mods):
            got = Decoder(self.model, B, plan.prompt, plan.new_tokens).run(self.prompts[B], force=force,
                                                                            each=each)
        agreement = float((got == force).float().mean())
        return (float(worst / top.clamp(min=1e-30)) if ref_scale else float(worst)), agreement

    # --- one variant ---

    def variant_rows(self, name: str) -> Iterator[Row]:
        """The variant's row of each batch, yielded as each is measured (a
        variant that cannot run: every batch's row at once, failed)."""
        torch, plan = self.torch, self.plan
        rows = [Row(name, B) for B in plan.batches]

        def fail(msg: str) -> List[Row]:
            for r in rows:
                r.error = msg
            self.log(f"{name}: {msg}")
            return rows
        try:
            v = variant(name)
        except Exception as e:
            yield from fail(short_error(e))
            return
        why = v.unavailable(self.device)
        if why:
            yield from fail(f"skipped: {why}")
            return
        t = time.perf_counter()
        try:
            mods, reals = v.layers(self.model, self.names)
            first = self.names[0]
            lin = self.model.get_submodule(first)
            bad = check_layer(torch, v, mods.get(first, lin), reals.get(first), lin)
        except Exception as e:
            bad = f"quantize: {short_error(e)}"
        if bad:
            yield from fail(bad)
            return
        self.log(f"{name}: {len(mods)} layers made in {time.perf_counter() - t:.1f} s")
        for row in rows:
            try:
                t0 = time.perf_counter()
                with swapped(self.model, mods):
                    self.decode_time(row.batch, row)
                t1 = time.perf_counter()
                if reals and plan.accuracy:
                    self.accuracy(row.batch, v, mods, reals, row)
                # (the wall time of each part: what a run's time limit is spent on)
                self.log(f"{name} batch {row.batch}: {row.ms_per_step:.3f} ms/step"
                         + (f", rel_err {row.rel_err:.2e} (fp32 {row.rel_err_fp32:.2e}), "
                            f"agreement {row.agreement:.3f}" if row.rel_err is not None else "")
                         + f" [{t1 - t0:.1f} s timing, {time.perf_counter() - t1:.1f} s accuracy]")
            except Exception as e:
                row.error = short_error(e)
                self.log(f"{name} batch {row.batch}: {row.error}")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            yield row

    def env(self) -> dict:
        torch = self.torch
        out = {"device": torch.cuda.get_device_name(self.device) if self.graph else "cpu",
               "torch": torch.__version__, "opgen": __version__, "python": sys.version.split()[0]}
        try:
            import transformers
            out["transformers"] = transformers.__version__
        except ImportError:
            pass
        return out


def precompile(bench: Bench, workers: Optional[int]) -> None:
    """Compile the kernels of every opgen variant, every linear shape and
    every M the run takes (decode: the batch; prefill: batch x prompt; the
    layer check), in parallel, before the first layer runs them."""
    ours = [variant(n) for n in bench.plan.variants if n.startswith("opgen:")]
    specs = [v.spec for v in ours]
    if not specs or bench.device.type != "cuda":
        return
    shapes = [(m.out_features, m.in_features) for m in map(bench.model.get_submodule, bench.names)]
    if any(v.fuse for v in ours):          # (the wide layers of the +fuse variants)
        from ..fused_linear import sibling_groups      # (torch's: this module imports without it)
        for group in sibling_groups(bench.model, bench.names):
            mods = [bench.model.get_submodule(n) for n in group]
            shapes.append((sum(m.out_features for m in mods), mods[0].in_features))
    shapes = list(dict.fromkeys(shapes))
    Ms = sorted({CHECK_ROWS} | {B for B in bench.plan.batches}
                | {B * bench.plan.prompt for B in bench.plan.batches})
    # (the +pdl variants' kernels too: their launch is another kernel)
    pdl_Ms = Ms if any(v.pdl for v in ours) else ()
    jobs = compiles.compile_jobs(specs, shapes, Ms, TuningDB(), True, current_arch(), pdl_Ms)
    compiles.wait(compiles.start(jobs, current_arch(), workers, bench.log), bench.log)


def load_time(bench: Bench) -> dict:
    """The model written as a GPTQ v2 checkpoint (a temporary directory) and
    loaded in a fresh process to a model ready to decode (e2e_load.py)."""
    with tempfile.TemporaryDirectory(prefix="opgen_e2e_ckpt_") as d:
        try:
            out = e2e_load.write_gptq(bench.model, bench.names, bench.plan.config, Path(d))
            out.update(e2e_load.time_load(Path(d), str(bench.device)))
        except Exception as e:
            out = {"error": short_error(e)}
    bench.log("checkpoint load: " + (out["error"] if "error" in out else
                                     f"{out['bytes'] / 1e9:.2f} GB written in {out['write_s']:.1f} s, "
                                     f"ready in {out['process_s']:.1f} s"))
    return dict(out, format=e2e_load.GPTQ_SPEC)


def run(plan: Plan, log: Callable[[str], None] = _log, workers: Optional[int] = None,
        on_rows: Optional[Callable[[dict], None]] = None) -> dict:
    """The e2e result: env, plan, model, rows (one per variant and batch),
    complete; workers: compile processes (default: all cores but one);
    on_rows(result so far): after each row (a run cut short keeps them)."""
    bench = Bench(plan, log)
    log(f"model {plan.model}: {len(bench.names)} linear layers, built in {bench.build_s:.1f} s on "
        f"{bench.device}")
    precompile(bench, workers)
    cfg = bench.model.config
    out = {
        "env": bench.env(),
        "plan": {"model": plan.model, "source": plan.source, "batches": list(plan.batches),
                 "prompt": plan.prompt, "new_tokens": plan.new_tokens, "repeats": plan.repeats,
                 "variants": list(plan.variants), "seed": plan.seed, "graph": bench.graph,
                 "compile": bench.compile},
        "model": {"layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size,
                  "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
                  "linear_layers": len(bench.names)},
        "complete": False, "rows": [],
    }
    if plan.load_time:
        out["load"] = load_time(bench)
    rows: List[Row] = []
    for name in plan.variants:
        for row in bench.variant_rows(name):
            rows.append(row)
            base = {r.batch: r.ms_per_step for r in rows if r.variant == "fp16" and r.ms_per_step}
            for r in rows:
                if r.ms_per_step and base.get(r.batch):
                    r.speedup = base[r.batch] / r.ms_per_step
            out["rows"] = [asdict(r) for r in rows]
            if on_rows is not None:
                on_rows(out)
    out["complete"] = True
    return out


def main(plan: Plan, out_dir, command: str, workers: Optional[int] = None,
         plots: bool = True) -> int:
    """Run, evaluate the targets, write e2e.json / e2e.md / e2e.png into
    out_dir and print the tables: 1 when a row failed (a variant that
    cannot run here, a peer not installed, is skipped, not failed)."""
    t = time.time()
    head = {"command": command, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}

    def write(partial: dict, plots: bool = False) -> List[str]:
        results = dict(head, **partial, targets=e2e_report.evaluate(partial["rows"], partial.get("load")),
                       wall_s=round(time.time() - t, 1))
        return e2e_report.write_outputs(results, out_dir, plots=plots)
    results = run(plan, workers=workers, on_rows=write)
    paths = write(results, plots)
    results["targets"] = e2e_report.evaluate(results["rows"], results.get("load"))
    print(e2e_report.results_table(results["rows"]))
    print()
    print(e2e_report.targets_table(results["targets"]))
    print()
    for p in paths:
        print(p)
    failed = [r for r in results["rows"] if r["error"] and not r["error"].startswith("skipped:")]
    if "error" in results.get("load", {}):
        failed.append(results["load"])
    if failed:
        print(f"opgen bench --e2e: {len(failed)} row(s) failed (see e2e.md)", file=sys.stderr)
    return 1 if failed else 0
