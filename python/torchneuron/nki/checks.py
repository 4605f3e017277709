"""Reference checks: a kernel against the torch implementation it declares.

    results = nki.check(add_kernel, shapes=[[(128, 64), (128, 64)],
                                            [(128, 512), (128, 512)]],
                        dtypes=[torch.float32, torch.bfloat16])

runs the kernel and its reference on the same random inputs (normal, seeded)
for every case (one shape per kernel argument) and dtype, and compares the
outputs with torch.testing.assert_close at the dtype's tolerance. A
mismatch raises AssertionError naming the kernel, the shapes and the dtype;
otherwise returns one dict per case: shapes, dtype, max_abs_error, time_us
(the kernel's modelled time).
"""

import torch

# Tolerances per input dtype: the engines compute in float32 and round the
# results to the tile's dtype, as the reference does not always.
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (3e-2, 3e-2),
              torch.float16: (5e-3, 5e-3)}


def check(kernel, shapes, dtypes=(torch.float32,), make_inputs=None, seed=0,
          tolerances=None, **kwargs):
    """Compares `kernel` with kernel.reference over `shapes` x `dtypes`;
    `make_inputs(shapes, dtype, generator)` replaces the random inputs;
    `tolerances` ({dtype: (rtol, atol)}) replaces TOLERANCES' entries;
    `kwargs` go to both."""
    if kernel.reference is None:
        raise ValueError(f"nki.check: kernel {kernel.name} declares no reference "
                         f"(nki.jit(reference=...))")
    results = []
    for case in shapes:
        for dtype in dtypes:
            gen = torch.Generator().manual_seed(seed)
            inputs = (make_inputs(case, dtype, gen) if make_inputs else
                      [torch.randn(s, generator=gen).to(dtype) for s in case])
            run = kernel.run(*inputs, **kwargs)
            expected = kernel.reference(*inputs, **kwargs)
            tolerance = {**TOLERANCES, **(tolerances or {})}.get(dtype, (1e-4, 1e-4))
            results.append(_compare(kernel.name, case, dtype, run, expected, tolerance))
    return results


def _compare(name, case, dtype, run, expected, tolerance):
    got = run.outputs if isinstance(run.outputs, tuple) else (run.outputs,)
    want = expected if isinstance(expected, tuple) else (expected,)
    rtol, atol = tolerance
    error = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        try:
            torch.testing.assert_close(g.float().cpu(), w.float().cpu(), rtol=rtol, atol=atol)
        except AssertionError as e:
            raise AssertionError(f"nki.check: kernel {name} output {i} differs from its "
                                 f"reference for shapes {list(case)}, {dtype}: {e}") from None
        error = max(error, float((g.float().cpu() - w.float().cpu()).abs().max()))
    return {"shapes": [tuple(s) for s in case], "dtype": dtype, "max_abs_error": error,
            "time_us": run.time_us}
