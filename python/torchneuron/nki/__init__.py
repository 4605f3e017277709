"""torchneuron.nki: a tile-level kernel language for the simulated NeuronCore,
after AWS NKI (docs/nki.md).

    import torchneuron.nki as nki
    import torchneuron.nki.language as nl     # tiles, loads/stores, engine ops
    import torchneuron.nki.isa as nisa        # single engine instructions

    @nki.jit(reference=lambda a, b: a + b)
    def add_kernel(a, b): ...

    y = add_kernel(x1, x2)                    # runs for real, priced per instruction
    run = add_kernel.run(x1, x2)              # run.time_us, run.timelines()
    nki.check(add_kernel, shapes=[[(128, 64)] * 2], dtypes=[torch.float32])
    op = nki.as_op(add_kernel, "mylib::add")  # a torch operator on "neuron"

Shipped: flash attention, forward and backward kernels (torchneuron.nki.attention,
attention_backward) and operators (attention_op.attention, torch.ops.nki.flash_attention_*);
Mamba's selective scan, forward and backward kernels (torchneuron.nki.selective_scan,
selective_scan_backward) and operators (selective_scan_op.selective_scan,
torch.ops.nki.selective_scan*).
"""

from . import isa, language
from .checks import check
from .errors import KernelError
from .kernel import Kernel, KernelRun, jit, spec
from .op import as_op
from . import attention, attention_backward, attention_op  # noqa: E402  (torch.ops.nki.*)
from . import selective_scan, selective_scan_backward, selective_scan_op  # noqa: E402

__all__ = ["Kernel", "KernelError", "KernelRun", "as_op", "attention", "attention_backward",
           "attention_op", "check", "isa", "jit",
           "language", "selective_scan", "selective_scan_backward", "selective_scan_op",
           "spec"]
