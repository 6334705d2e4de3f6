"""Stand-ins shared by the CPU tests of the compile pool, the tuner and the
tune pool: two small specs, a config that is only a name, and
codegen.compiler.compile_many, where a config named "nocompile" fails to
compile (as NVRTC would say) and one named "boom" raises (a template bug)."""
from dataclasses import dataclass

from opgen.codegen.spec import Activation, Output, Scale, Spec, Weight


def fake_spec(name: str, weight: str = "uint4") -> Spec:
    """A fp16-activation spec of 4-bit group-128 (or int8 per-channel) weights."""
    scale = Scale("float16", "group", 128) if weight == "uint4" else Scale("float16", "channel")
    return Spec(name=name, op="matmul", a=Activation("float16"), b=Weight(weight, scale=scale),
                out=Output("float16"))


SPEC = fake_spec("w4a16_fake")
SPEC2 = fake_spec("w8a16_fake", "int8")


@dataclass(frozen=True)
class FakeConfig:
    name: str

    def to_dict(self):
        return {"name": self.name}


def fake_compile(spec, cfg, arch):
    if cfg.name == "nocompile":
        return "CompileError: uses too much shared memory"
    if cfg.name == "boom":
        raise ValueError("template bug")
    return None


def fake_compile_many(jobs, workers):
    """Stands in for compiler.compile_many, in this process: (job, why) per job;
    like the real one run in-process, an unexpected error propagates."""
    for job in jobs:
        yield job, fake_compile(*job)
