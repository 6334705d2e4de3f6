"""Where one decode step's time goes: the kernels of a graph-captured step of
`opgen bench --e2e`'s model, by total time, under torch.profiler (CUPTI
traces the kernels a graph replay launches).

    python3 bench/profile_step.py --variants fp16,opgen:w4a16_sym_g128 --batch 1 [--no-compile]

Per variant: the step's median time by CUDA events, and a table of kernel
names (cut to 60 characters) with their count and time per step, largest
first; the rows of opgen's kernels and of the linear layers' peers are what
the variant changes. A lab tool (bench/README.md): GPU only.
"""
import argparse
import statistics

from opgen.bench import e2e_model as em
from opgen.bench.e2e_variants import variant


def profile(name: str, model, batch: int, compile_step: bool, steps: int, top: int) -> None:
    import torch
    v = variant(name)
    why = v.unavailable(torch.device("cuda"))
    if why:
        print(f"## {name}: {why}")
        return
    mods = {n: v.layer(model.get_submodule(n))[0] for n in em.linear_names(model)}
    prompt = torch.randint(0, model.config.vocab_size, (batch, 128), device="cuda")
    with em.swapped(model, mods):
        dec = em.Decoder(model, batch, 128, steps + 8, compile=compile_step)
        dec.capture(prompt)
        dec.prefill(prompt)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(steps):
            start.record()
            dec.step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        dec.prefill(prompt)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                dec.step()
            torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            r = rows.setdefault(e.name[:60], [0, 0.0])
            r[0] += 1
            r[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    total = sum(r[1] for r in rows.values()) / steps
    print(f"## {name}, batch {batch}{', compiled' if compile_step else ''}: "
          f"{statistics.median(times):.3f} ms a step (events), {total / 1e3:.3f} ms of kernels (profiler)")
    print(f"| kernel | per step | µs per step | share |\n| --- | ---: | ---: | ---: |")
    for k, (count, us) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"| `{k}` | {count / steps:.0f} | {us / steps:.1f} | {us / steps / total:.1%} |")
    del mods


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--variants", default="fp16,no_linear,opgen:w4a16_sym_g128")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--no-compile", action="store_true",
                   help="the decode step eager (default: through torch.compile, as opgen bench --e2e)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    import torch
    config, _ = em.model_config(args.model, args.layers)
    model = em.build_model(config, "cuda", torch.float16)
    for name in args.variants.split(","):
        profile(name, model, args.batch, not args.no_compile, args.steps, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
