"""ZeRO stages 1, 2 and 3: FSDP-style sharded data parallelism.

Each wrapped unit (chosen by `wrap_policy`; the rest of the model is the
root unit) is a neuron::parallel::ShardedUnit: its parameters flattened into
one fp32 vector, padded to a multiple of the data-parallel size, of which
each rank keeps and optimizes its slice. Before a unit's forward its full
parameters are all-gathered (the next unit's gather is started early:
prefetch); stage 3 frees them after the forward and gathers them again when
the gradient reaches the unit's outputs. Gradients are all-reduced (stage 1)
or reduce-scattered (stages 2, 3) from hooks as soon as a unit's backward is
done, summed in rank order on "neuron" and divided by the group size: with
fp32 throughout, training matches DDP (and a single process summing the
same way) bitwise.

    model = FullyShardedDataParallel(model, stage=3,
                                     wrap_policy=module_type_policy(Block),
                                     mixed_precision=MixedPrecision(torch.bfloat16))
    opt = torch.optim.AdamW(model.parameters())   # the shards: optimizer state is sharded
"""
import contextlib
import dataclasses
import functools
import weakref

import torch
import torch.nn as nn
from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                   register_optimizer_step_pre_hook)

from .. import _C
from . import clip
from .ddp import _default_group
from .tensor_parallel import sequence_parallel_group


@dataclasses.dataclass(frozen=True)
class MixedPrecision:
    """param_dtype: the gathered parameters and the computation (inputs are cast
    to it); reduce_dtype: the gradient reduction, and the precision the
    shard gradients are kept in (a bf16 reduce_dtype halves the gradient
    memory, as ZeRO counts it; the optimizer's step sees them upcast to
    fp32, a copy that lives for the step). Master weights and optimizer
    state stay fp32."""
    param_dtype: torch.dtype = torch.float32
    reduce_dtype: torch.dtype = torch.float32


@dataclasses.dataclass(frozen=True)
class CPUOffload:
    """Keep the fp32 master shards, their gradients and the optimizer state in
    host memory (ZeRO-Offload; on a "neuron" module they are CPU tensors,
    moved to the device for each gather and back for each gradient): they
    leave the device's model-state memory,
    and every step charges the rank's modelled time with moving the shard
    gradients to the host and the updated shards back over a host link of
    `host_gbps` GB/s (an assumption: the device spec has no host link yet)."""
    host_gbps: float = 32.0


def module_type_policy(*types):
    """Wrap every submodule that is an instance of one of `types`."""
    return lambda m: isinstance(m, types)


def size_policy(min_params):
    """Wrap every outermost submodule with at least `min_params` parameters."""
    return lambda m: sum(p.numel() for p in m.parameters()) >= min_params


def _name(dtype):
    return str(dtype).replace("torch.", "")


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _cast(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


def _sequence_parallel(params, unit):
    """Which of `params` were used on a sequence shard (mark_sequence_parallel)
    of a group of several ranks, and that group (None when none were): the
    unit sums their gradients over it before it reduces its own."""
    flags, groups = [], {}
    for p in params:
        group = sequence_parallel_group(p)
        flags.append(group is not None)
        if group is not None:
            groups[id(group)] = group
    if len(groups) > 1:
        raise ValueError(f"FullyShardedDataParallel: unit {unit!r} has sequence-parallel "
                         f"parameters of {len(groups)} different groups; wrap them apart")
    return flags, next(iter(groups.values()), None)


def _upcast_gradients(optimizer, args, kwargs):
    """Optimizer step pre-hook (every optimizer): a master shard whose
    gradient is kept in a lower precision (MixedPrecision.reduce_dtype) gets
    it upcast to its own dtype for the step, as DeepSpeed's bf16 path does:
    PyTorch's optimizers need the gradient in the parameter's dtype. The
    post-hook puts the kept gradient back."""
    stash = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            g = p.grad
            if g is not None and g.dtype != p.dtype and getattr(p, "_neuron_shard", False):
                stash.append((p, g))
                p.grad = None
                p.grad = g.to(p.dtype)
    optimizer._neuron_kept_gradients = stash


def _restore_gradients(optimizer, args, kwargs):
    for p, g in getattr(optimizer, "_neuron_kept_gradients", ()):
        _C._set_grad(p, g)
    optimizer._neuron_kept_gradients = []


register_optimizer_step_pre_hook(_upcast_gradients)
register_optimizer_step_post_hook(_restore_gradients)


class _Unit:
    def __init__(self, name, named_params, group, stage, precision, offload=False):
        self.name = name
        self.param_names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.in_backward = False  # the gradient reached the unit's outputs
        self.order = None  # its place in the forward order (learnt on the first forward)
        self.shapes = [tuple(p.shape) for _, p in named_params]
        flags, sp_group = _sequence_parallel(self.params, name or "<root>")
        self.core = _C._ShardedUnit(self.params, group, stage,
                                    _name(precision.param_dtype), _name(precision.reduce_dtype),
                                    name or "<root>", offload, flags, sp_group)
        self.core.shard._neuron_shard = True  # see _upcast_gradients


class FullyShardedDataParallel(nn.Module):
    """Shards `module`'s parameters, gradients (stage >= 2) and optimizer state
    over `process_group` (default: torchneuron.parallel's data-parallel group,
    else the default group; the backend needs _allgather_base and
    _reduce_scatter_base, as "neuron" has).

    parameters() yields the fp32 shards, one per unit: build the optimizer
    from them. full_state_dict() / load_full_state_dict() give and take the
    module's ordinary state dict (collective). clip_grad_norm_() clips over
    all shards. no_sync() accumulates gradients without reducing them.
    Parameters marked sequence-parallel get their gradients summed over
    their tensor-parallel group (by the unit, one all-reduce). At construction every rank's module is made
    equal to the group's rank 0's.
    """

    def __init__(self, module, stage=3, process_group=None, wrap_policy=None,
                 mixed_precision=None, prefetch=True, cpu_offload=None):
        super().__init__()
        if stage not in (1, 2, 3):
            raise ValueError(f"FullyShardedDataParallel: stage must be 1, 2 or 3, got {stage!r}")
        self.module = module
        self.stage = stage
        self.process_group = process_group if process_group is not None else _default_group()
        self.mixed_precision = mixed_precision or MixedPrecision()
        self.prefetch = prefetch
        self.cpu_offload = cpu_offload
        self._offload_steps = 0
        self._state_keys = list(module.state_dict().keys())
        state = [p.detach() for p in module.parameters()] + list(module.buffers())
        if state:
            _C._broadcast_coalesced(state, self.process_group, 0, 25 << 20)
        names = {id(p): n for n, p in module.named_parameters()}
        claimed = set()
        units, unit_modules = [], []

        def claim(m):
            out = []
            for p in m.parameters():
                if p.requires_grad and id(p) not in claimed:
                    claimed.add(id(p))
                    out.append((names[id(p)], p))
            return out

        def visit(prefix, m):
            for child_name, child in m.named_children():
                full = prefix + child_name
                if wrap_policy is not None and wrap_policy(child):
                    units.append(_Unit(full, claim(child), self.process_group, stage,
                                       self.mixed_precision, cpu_offload is not None))
                    unit_modules.append(child)
                else:
                    visit(full + ".", child)

        visit("", module)
        self._root = _Unit("", claim(module), self.process_group, stage,
                           self.mixed_precision, cpu_offload is not None)
        self._units = units
        self._order = []  # non-root units in forward order, learnt on the first forward
        self._order_known = False
        # The hooks hold the wrapper weakly: the wrapped module outlives it
        # without keeping its units (and their memory) alive.
        me = weakref.ref(self)
        for i, (unit, unit_module) in enumerate(zip(units, unit_modules)):
            unit_module.register_forward_pre_hook(
                lambda m, inputs, i=i: me() and me()._pre_forward(me()._units[i], m, inputs))
            unit_module.register_forward_hook(
                lambda m, inputs, out, i=i: me() and me()._post_forward(me()._units[i], m,
                                                                        inputs, out))

    # -- the hooks ------------------------------------------------------------

    def _all_units(self):
        """The wrapped units, then the root's (its unwrapped parameters)."""
        return self._units + [self._root]
    def _neighbour(self, unit, step):
        if not (self.prefetch and self._order_known) or unit.order is None:
            return None
        i = unit.order + step
        return self._order[i] if 0 <= i < len(self._order) else None

    def _pre_forward(self, unit, module, inputs):
        unit.core.gather()
        if not self._order_known and unit.order is None:
            unit.order = len(self._order)
            self._order.append(unit)
        following = self._neighbour(unit, +1)
        if following is not None:
            following.core.start_gather()

    def _post_forward(self, unit, module, inputs, output):
        if unit.in_backward:
            return  # recomputed by activation checkpointing: backward needs the parameters
        if self.stage == 3:
            unit.core.free()
        self._hook_outputs(unit, output)

    def _hook_outputs(self, unit, output):
        if not torch.is_grad_enabled():
            return
        for t in _tensors(output):
            if t.requires_grad:
                t.register_hook(functools.partial(self._pre_backward, unit))

    def _pre_backward(self, unit, grad):
        unit.in_backward = True
        unit.core.gather()
        previous = self._neighbour(unit, -1)  # the next unit backward reaches
        if previous is not None:
            previous.core.start_gather()

    # -- nn.Module ------------------------------------------------------------
    def _charge_offload(self):
        """Modelled time of one step's host traffic: shard gradients to the
        host after backward, updated shards back before the gathers."""
        if self.cpu_offload is None or not torch.is_grad_enabled():
            return
        if self._offload_steps > 0:
            grad_size = self.mixed_precision.reduce_dtype.itemsize
            param_size = self.mixed_precision.param_dtype.itemsize
            elements = sum(u.core.shard_numel for u in self._all_units())
            _C._advance_compute(elements * (grad_size + param_size) /
                                (self.cpu_offload.host_gbps * 1e3))
        self._offload_steps += 1

    def forward(self, *args, **kwargs):
        self._charge_offload()
        for unit in self._all_units():
            unit.in_backward = False
            if torch.is_grad_enabled():
                unit.core.prepare_for_backward()
        dtype = self.mixed_precision.param_dtype
        if dtype != torch.float32:
            args, kwargs = _cast(args, dtype), _cast(kwargs, dtype)
        self._root.core.gather()
        out = self.module(*args, **kwargs)
        self._order_known = True
        if self.stage == 3:
            self._root.core.free()
        self._hook_outputs(self._root, out)
        return out

    def zero_grad(self, set_to_none=True):
        """Clears the shards' gradients and what no_sync() accumulated."""
        for unit in self._all_units():
            unit.core.discard_accumulated_gradients()
        super().zero_grad(set_to_none)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters():
            yield p

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        for unit in self._all_units():
            if unit.core.numel == 0:
                continue  # a root without parameters of its own
            name = unit.name + ".flat_shard" if unit.name else "flat_shard"
            yield (prefix + ("." if prefix else "") + name, unit.core.shard)

    def units(self):
        """(name, parameter names, padded flat size) of each unit, the root last."""
        return [(u.name, list(u.param_names), u.core.padded_numel)
                for u in self._all_units()]

    # -- state ----------------------------------------------------------------
    def full_state_dict(self):
        """The wrapped module's state dict with full fp32 parameters (collective:
        every rank of the group calls it and gets it)."""
        values = {}
        for unit in self._all_units():
            values.update(zip(unit.param_names, unit.core.full_parameters()))
        full = self.module.state_dict()
        return {k: values[k] if k in values else full[k].detach().clone()
                for k in self._state_keys}

    def load_full_state_dict(self, state_dict):
        """Loads a full state dict (as full_state_dict() or the unwrapped module's
        state_dict() gives) on every rank; the shards take their slices."""
        missing = [k for k in self._state_keys if k not in state_dict]
        unexpected = [k for k in state_dict if k not in self._state_keys]
        if missing or unexpected:
            raise KeyError(f"load_full_state_dict: missing keys {missing[:5]}, unexpected keys "
                           f"{unexpected[:5]}")
        for unit in self._all_units():
            for name, shape in zip(unit.param_names, unit.shapes):
                got = tuple(state_dict[name].shape)
                if got != shape:
                    raise ValueError(f"load_full_state_dict: {name} has shape {list(shape)} in "
                                     f"the model but {list(got)} in the state dict")
            unit.core.load_full_parameters(
                [state_dict[n].detach().to(torch.float32) for n in unit.param_names])
        sharded = {n for u in self._all_units() for n in u.param_names}
        with torch.no_grad():
            own = self.module.state_dict(keep_vars=True)
            for k in self._state_keys:
                if k not in sharded:
                    own[k].copy_(state_dict[k])

    def clip_grad_norm_(self, max_norm):
        """Scales every shard's gradient so that the global gradient's 2-norm is
        at most max_norm; returns the norm before clipping (collective; with
        tensor or pipeline parallelism, the norm of the whole model: see
        torchneuron.parallel.clip_grad_norm_, which also takes several parts)."""
        return clip.clip_grad_norm_([self], max_norm)

    def _local_grad_squares(self, tp_rank):
        """Sum of grad^2 over this rank's shards, a tensor-parallel replica's
        elements only on tensor-parallel rank 0."""
        return sum(u.core.local_grad_squared_norm([clip.counted(p, tp_rank) for p in u.params])
                   for u in self._all_units())

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation without communication: backwards inside add
        their full gradients up locally (memory: a full gradient per unit, in
        reduce_dtype); the first backward after it reduces the sum. With fp32
        throughout the result equals DistributedDataParallel.no_sync's bitwise.
        The accumulated gradients are not .grad yet: the optimizer's
        zero_grad() does not see them; this module's zero_grad() discards
        them (an abandoned accumulation)."""
        units = self._all_units()
        for unit in units:
            unit.core.set_require_gradient_sync(False)
        try:
            yield
        finally:
            for unit in units:
                unit.core.set_require_gradient_sync(True)


def model_state_memory():
    """This process's model-state memory in bytes, as ZeRO's formulas count it:
    every sharded unit's parameters (master shard, gathered full parameters)
    and gradients (full while being reduced, shard) plus the optimizer state
    last reported with record_optimizer_state; not activations. Returns
    {"current": ..., "peak": ...} (peak since reset_model_state_peak())."""
    current, peak = _C._model_state_memory()
    return {"current": current, "peak": peak}


def record_optimizer_state(optimizer, offloaded=False):
    """Reports the bytes of `optimizer`'s state tensors as device memory (call
    after each step: they appear at the first); 0 when `offloaded` (CPUOffload:
    the state lives in host memory). Returns the state's bytes."""
    total = sum(v.numel() * v.element_size() for state in optimizer.state.values()
                for v in state.values() if torch.is_tensor(v))
    _C._set_optimizer_state_bytes(0 if offloaded else total)
    return total


def reset_model_state_peak():
    _C._reset_model_state_peak()
