"""Stand-ins for codegen.compiler.compile_many, shared by the compile pool's
and the tuner's CPU tests: a config named "nocompile" fails to compile (as
NVRTC would say), one named "boom" raises (a template bug)."""


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
