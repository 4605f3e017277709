"""The phases of one training step, captured (see capture.py) for the
layout `neuronrun predict` asks for, and their sizes: the parameters each
stage holds and the activation bytes each layer keeps for backward.

    spec = StepSpec(model=DecoderConfig(...), tp=8, seq=4096, micro_batch=1, ...)
    result = capture_step(spec)   # {"phases": {...}, "sizes": {...}}
"""
import dataclasses

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..models.decoder import Decoder, DecoderConfig
from ..parallel import tensor_parallel as tp
from .capture import Recorder, _flash_attention

DTYPES = ("bf16-mixed", "bf16", "fp32")
DEVICE = "neuron"  # fake tensors of the device the step runs on


@dataclasses.dataclass
class StepSpec:
    model: DecoderConfig
    tp: int = 1
    seq: int = 4096
    micro_batch: int = 1
    sequence_parallel: bool = False
    checkpointing: str = "none"     # none | selective | full
    recompute_mlp: bool = False     # selective also recomputes the whole MLP
    attention: str = "flash"        # flash | core
    dtype: str = "bf16-mixed"       # bf16-mixed | bf16 | fp32
    stage_layers: tuple = (2,)      # decoder layers per pipeline stage
    dp: int = 1
    zero: int = 0
    ep: int = 1                     # expert parallel, of the dp ranks (a Mixture of Experts)

    def check(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"predict: --dtype must be one of {', '.join(DTYPES)}")
        if self.attention not in ("flash", "core"):
            raise ValueError("predict: attention must be flash or core")
        if self.sequence_parallel and self.seq % self.tp:
            raise ValueError(f"predict: sequence parallelism needs tp ({self.tp}) to divide "
                             f"the sequence length {self.seq}")
        if self.ep < 1 or (self.ep > 1 and not self.model.experts):
            raise ValueError(f"predict: ep {self.ep} needs a Mixture of Experts (experts > 0)")
        if self.model.experts % self.ep or self.dp % self.ep:
            raise ValueError(f"predict: ep {self.ep} must divide the {self.model.experts} "
                             f"experts and dp {self.dp}")


def _param_dtype(spec):
    return torch.float32 if spec.dtype == "fp32" else torch.bfloat16


def _saved_bytes(module):
    """A saved_tensors_hooks pair that adds up the distinct storages autograd
    keeps, the module's parameters aside (what its activations cost), and
    the counter."""
    seen, total = {p.untyped_storage()._cdata for p in module.parameters()}, [0]

    def pack(t):
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in seen:
            seen.add(key)
            total[0] += storage.nbytes()
        return t
    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), total


def _parameters(module):
    return sum(p.numel() for p in module.parameters())


def _expert_parameters(module):
    """The parameters of `module`'s experts (moe.GroupedExperts marks them)."""
    return sum(p.numel() for p in module.parameters() if getattr(p, "expert_parallel", False))


class _Capture:
    """Builds each part of the model on fake tensors and records its phases."""

    def __init__(self, spec, recorder):
        self.spec, self.recorder = spec, recorder
        self.group = tp.CapturedGroup(spec.tp, recorder) if spec.tp > 1 else False
        self.ep_group = tp.CapturedGroup(spec.ep, recorder) if spec.ep > 1 else False
        self.layer_experts = 0  # the expert parameters of one layer (layer())
        self.dtype = _param_dtype(spec)
        self.tokens_local = spec.seq // spec.tp if spec.sequence_parallel else spec.seq

    def build(self, **kw):
        """The part of the model `kw` selects, its parameters in the compute
        dtype (made so: fake parameters cannot be converted in place)."""
        s = self.spec
        saved = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(DEVICE):
                return Decoder(s.model, tp_group=self.group,
                               sequence_parallel=s.sequence_parallel,
                               checkpointing=s.checkpointing, recompute_mlp=s.recompute_mlp,
                               attention=s.attention, ep_group=self.ep_group, **kw)
        finally:
            torch.set_default_dtype(saved)

    def hidden(self):
        """A layer's input: [seq(/tp), batch, hidden], requiring grad."""
        s = self.spec
        return torch.empty(self.tokens_local, s.micro_batch, s.model.hidden,
                           dtype=self.dtype, device=DEVICE).requires_grad_()

    def tokens(self):
        s = self.spec
        return torch.zeros(s.micro_batch, s.seq, dtype=torch.long, device=DEVICE)

    def accumulate(self, module):
        """Gradient accumulation: bf16-mixed adds each bf16 gradient into an
        fp32 buffer (NxD's fp32 accumulation); the others accumulate in the
        parameters' own .grad (autograd's add, captured with backward)."""
        if self.spec.dtype != "bf16-mixed":
            return
        for p in module.parameters():
            torch.empty(p.shape, dtype=torch.float32, device=DEVICE).add_(p.grad)

    def run(self, name, module, forward, grad_fn=None):
        """Records `name`_forward and `name`_backward of `module` (its
        gradients allocated beforehand: a later microbatch); returns its
        parameters and the activation bytes its forward saved. `grad_fn`
        runs backward from the output (default: a gradient of its shape)."""
        grad_fn = grad_fn or (lambda y: y.backward(torch.empty_like(y)))
        out = forward()                     # first microbatch: allocates .grad
        grad_fn(out)
        hooks, saved = _saved_bytes(module)
        with self.recorder.phase(f"{name}_forward"), hooks:
            out = forward()
        with self.recorder.phase(f"{name}_backward"):
            grad_fn(out)
            self.accumulate(module)
        return _parameters(module), saved[0]

    def layer(self):
        layer = self.build(layers=1, first=False, last=False).layers[0]
        self.layer_experts = _expert_parameters(layer)
        x = self.hidden()
        return self.run("layer", layer, lambda: layer(x))

    def embed(self):
        model = self.build(layers=0, first=True, last=False)
        tokens = self.tokens()
        return self.run("embed", model, lambda: model(tokens))

    def head(self):
        model = self.build(layers=0, first=False, last=True)
        x, targets = self.hidden(), self.tokens()
        return self.run("head", model, lambda: model(x, targets), lambda loss: loss.backward())

    def optimizer(self, name, parameters, experts=0):
        """AdamW over this rank's shard of `parameters` in fp32 (bf16 for
        pure bf16 training), after gradient-norm clipping (the norm's
        all-reduce is the data-parallel one, recorded by the job). ZeRO
        shards the `experts` of them over their dp / ep replicas, the rest
        over dp."""
        s = self.spec
        dense = parameters - experts
        n = -(-dense // s.dp) + -(-experts // (s.dp // s.ep)) if s.zero >= 1 else parameters
        dtype = torch.bfloat16 if s.dtype == "bf16" else torch.float32
        p, grad, m, v = (torch.empty(n, dtype=dtype, device=DEVICE) for _ in range(4))
        with self.recorder.phase(name):
            norm = torch.linalg.vector_norm(grad)
            grad.mul_((1.0 / (norm + 1e-6)).clamp(max=1.0))
            _adamw(p, grad, m, v)
            if s.dtype == "bf16-mixed":  # the bf16 copy the model computes with
                torch.empty(n, dtype=torch.bfloat16, device=DEVICE).copy_(p)


def _adamw(p, grad, m, v, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, step=10):
    """torch.optim.AdamW's update of one tensor (its single-tensor path, the
    bias corrections as host scalars): what the step runs per parameter."""
    p.mul_(1 - lr * weight_decay)
    m.lerp_(grad, 1 - betas[0])
    v.mul_(betas[1]).addcmul_(grad, grad, value=1 - betas[1])
    correction1, correction2 = 1 - betas[0] ** step, (1 - betas[1] ** step) ** 0.5
    denom = (v.sqrt() / correction2).add_(eps)
    p.addcdiv_(m, denom, value=-lr / correction1)


def capture_step(spec):
    """The step's phases and sizes for `spec` (a StepSpec): a dict
    {"phases": {name: [entry, ...]}, "sizes": {...}} that __main__ writes
    as a StepCapture text proto."""
    spec.check()
    spec.model.check(spec.tp)
    recorder = Recorder()
    with FakeTensorMode(allow_non_fake_inputs=False), recorder, _flash_attention(recorder):
        c = _Capture(spec, recorder)
        layer_params, layer_saved = c.layer()
        embed_params, embed_saved = c.embed()
        head_params, head_saved = c.head()
        stages, experts = [], [layers * c.layer_experts for layers in spec.stage_layers]
        last = len(spec.stage_layers) - 1
        for i, layers in enumerate(spec.stage_layers):
            n = layers * layer_params + (embed_params if i == 0 else 0) + \
                (head_params if i == last else 0)
            stages.append(n)
        for n, e in sorted(set(zip(stages, experts))):
            c.optimizer(f"optimizer_{n}", n, e)
    sizes = {"layer_parameters": layer_params, "embed_parameters": embed_params,
             "head_parameters": head_params, "layer_activation_bytes": layer_saved,
             "embed_activation_bytes": embed_saved, "head_activation_bytes": head_saved,
             "stage_parameters": stages}
    if spec.model.experts:
        sizes.update(layer_expert_parameters=c.layer_experts, stage_expert_parameters=experts)
    return {"phases": recorder.phases, "sizes": sizes}
