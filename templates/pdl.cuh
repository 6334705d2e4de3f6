// Programmatic dependent launch (sm_90+), pasted only into kernels rendered
// with pdl (codegen/render.py). A launch with the programmatic-serialization
// attribute (runtime/pdl.py) may start before the previous kernel on its
// stream has finished: the kernel issues what does not depend on that kernel
// (weights, scales, zero points) first and waits before it reads the
// activations or writes anything.

// griddepcontrol.wait: until every prerequisite grid has completed and its
// memory is visible to this grid (a no-op when the launch had no programmatic
// dependency). SASS: ACQBULK. The "memory" clobber keeps the memory accesses
// that follow it in the source after it (the activation loads: __ldg,
// cp.async, TMA); loads written before it the compiler may still move below
// it (the GEMVs' streamed weights, non-volatile asm; the scales' __ldg).
DEV void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
// griddepcontrol.launch_dependents: the dependent grid may be scheduled once
// every block of this one has said so or exited (it then waits in
// pdl_wait for this grid to complete). SASS: PREEXIT.
DEV void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
