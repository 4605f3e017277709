"""Sharded checkpoints that load into any layout.

save_checkpoint writes, from every rank, the pieces of the full (unsharded)
tensors it owns: its tensor-parallel slice of each parameter and of its
optimizer state (gathered over the data-parallel group first when ZeRO
shards them; data-parallel rank 0 writes, tensor-parallel rank 0 writes the
unsplit ones), each pipeline stage its own layers. The files
(neuron::parallel checkpoint_io, C++) are written atomically under names
of their own, and a manifest listing them with checksums comes last,
renamed over the previous one: an interrupted save is never loaded and
leaves the previous checkpoint in the directory whole. load_checkpoint assembles each full tensor a rank needs from the
pieces and keeps the part its layout holds, so a checkpoint saved with one
(dp, tp, pp, ZeRO stage) loads into another. load_full_state_dict gives the
consolidated state dict in one process.

Tensors are named by `model`'s parameter and buffer names (optimizer state:
"name#key", e.g. "blocks.0.mlp.fc1.weight#exp_avg"); `parts` are the
modules this rank trains (pipeline chunks, FullyShardedDataParallel
wrappers, or the model itself), whose parameters are `model`'s.
"""
import os
import secrets

import torch
import torch.distributed as dist

from .. import _C
from . import mesh
from . import tensor_parallel
from .fsdp import FullyShardedDataParallel


def _coordinates():
    if mesh.is_initialized():
        layout = mesh.get_layout()
        return layout.dp_rank, layout.tp_rank, layout._layout.describe()
    return (dist.get_rank() if dist.is_initialized() else 0), 0, "data parallel"


class _Entry:
    """One local tensor: where it sits in its full tensor, and how to store it."""

    def __init__(self, name, local, like):
        self.name, self.local = name, local
        self.dim = getattr(like, "tensor_parallel_dim", None)
        self.full_shape = list(local.shape)
        if self.dim is not None:
            self.full_shape[self.dim] = like.tensor_parallel_full

    def piece(self, tp_rank):
        if self.dim is None:
            return (self.name, self.full_shape, -1, 0, self.local.detach())
        part = self.local.shape[self.dim]
        begin = tp_rank * part
        length = max(0, min(part, self.full_shape[self.dim] - begin))
        return (self.name, self.full_shape, self.dim, begin,
                self.local.detach().narrow(self.dim, 0, length))

    def local_part(self, full, tp_rank):
        """This rank's part of the assembled full tensor (padded like the local one)."""
        if self.dim is None:
            return full
        return tensor_parallel.slice_padded(full, self.dim, self.local.shape[self.dim], tp_rank)


def _plain_entries(name_of, part, optimizer):
    for p in part.parameters():
        name = name_of[id(p)]
        yield _Entry(name, p.detach(), p)
        state = optimizer.state.get(p, {}) if optimizer is not None else {}
        for key in sorted(state):
            value = state[key]
            if torch.is_tensor(value):
                yield _Entry(f"{name}#{key}", value, p if value.shape == p.shape else None)


def _unit_entries(name_of, unit, optimizer):
    """Entries of a ZeRO unit: full values gathered over the data-parallel
    group (collective, in the same order on every rank)."""
    shard = unit.core.shard
    for p, value in zip(unit.params, unit.core.full_parameters()):
        yield _Entry(name_of[id(p)], value, p)
    state = optimizer.state.get(shard, {}) if optimizer is not None else {}
    for key in sorted(state):
        value = state[key]
        if torch.is_tensor(value) and value.shape == shard.shape:
            for p, v in zip(unit.params, unit.core.unshard(value)):
                yield _Entry(f"{name_of[id(p)]}#{key}", v, p)
        elif torch.is_tensor(value):
            for p in unit.params:
                yield _Entry(f"{name_of[id(p)]}#{key}", value, None)


def _units(part):
    return part._all_units()


def _entries(model, parts, optimizer):
    name_of = {id(t): n for n, t in model.named_parameters()}
    name_of.update({id(t): n for n, t in model.named_buffers()})
    for part in parts:
        if isinstance(part, FullyShardedDataParallel):
            for unit in _units(part):
                yield from _unit_entries(name_of, unit, optimizer)
            module = part.module
        else:
            yield from _plain_entries(name_of, part, optimizer)
            module = part
        persistent = set(module.state_dict().keys())
        for n, b in module.named_buffers():
            if n in persistent and id(b) in name_of:
                yield _Entry(name_of[id(b)], b, None)


def save_checkpoint(directory, model, parts=None, optimizer=None, step=0):
    """Collective over the default group: saves `parts` (default [model]) and
    `optimizer`'s state into `directory`."""
    parts = parts if parts is not None else [model]
    rank = dist.get_rank() if dist.is_initialized() else 0
    dp_rank, tp_rank, layout = _coordinates()
    # This save's files have names of their own: the previous checkpoint in
    # `directory` stays whole (and is what loads) until the new manifest
    # replaces its manifest in one rename.
    # Rank 0 names the save only once the directory exists: the broadcast
    # of the name is the others' sign that they may write into it.
    save = None
    if rank == 0:
        os.makedirs(directory, exist_ok=True)
        save = f"{step:08d}-{secrets.token_hex(4)}"
    save = _broadcast(save)
    pieces, infos = [], []
    for e in _entries(model, parts, optimizer):
        if dp_rank == 0 and (e.dim is not None or tp_rank == 0):
            pieces.append(e.piece(tp_rank))
            infos.append((e.name, e.full_shape, str(e.local.dtype).replace("torch.", "")))
    name = f"shard-{rank:05d}-{save}.bin"
    digest = _C._write_shard_file(os.path.join(directory, name), pieces)
    everything = _all_gather((name, digest, infos))
    if rank == 0:
        files = [(n, *d) for n, d, _ in everything]
        tensors = {}
        for _, _, info in everything:
            for n, shape, dtype in info:
                tensors.setdefault(n, (n, shape, dtype))
        # The manifest replaces the previous one; then the previous save's files go.
        _C._write_manifest(directory, step, layout, files, sorted(tensors.values()))
    _barrier()


def _broadcast(obj):
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _all_gather(obj):
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _barrier():
    if dist.is_initialized():
        dist.barrier()


class _Pieces:
    """Every piece of a checkpoint, by tensor name (all files read, checked)."""

    def __init__(self, directory):
        self.directory = directory
        self.manifest = _C._read_manifest(directory)
        self.shapes = {n: shape for n, shape, _ in self.manifest["tensors"]}
        self.by_name = {}
        for f in self.manifest["files"]:
            for piece in _C._read_shard_file(directory, f):
                self.by_name.setdefault(piece[0], []).append(piece)

    def full(self, name, want_shape):
        if name not in self.shapes:
            raise KeyError(f"checkpoint {self.directory}: no tensor '{name}' (saved from "
                           f"{self.manifest['layout']}: another model?)")
        if list(self.shapes[name]) != list(want_shape):
            raise ValueError(f"checkpoint {self.directory}: tensor '{name}' has shape "
                             f"{list(self.shapes[name])} in the checkpoint but "
                             f"{list(want_shape)} in the model")
        return _C._assemble_full(name, list(want_shape), self.by_name.get(name, []),
                                 self.directory)


class _OptimizerStateCheck:
    """Whether the checkpoint holds all the optimizer state a load replaces:
    every key it holds for any parameter, for each parameter `optimizer`
    trains. A checkpoint without optimizer state, or with some of it missing
    (an entry dropped from its manifest), is a ValueError naming what is
    missing unless `allow_missing` (then a parameter gets what there is, and
    starts afresh for the rest)."""

    def __init__(self, pieces, optimizer, allow_missing):
        self.pieces, self.allow_missing = pieces, allow_missing
        self.trained = {id(p) for g in optimizer.param_groups for p in g["params"]}
        self.keys = sorted({n.split("#", 1)[1] for n in pieces.shapes if "#" in n})

    def state_keys(self, name):
        prefix = name + "#"
        return sorted(n[len(prefix):] for n in self.pieces.shapes if n.startswith(prefix))

    def check(self, name, param):
        """The keys to load for parameter `name` (`param`, in the optimizer or not)."""
        keys = self.state_keys(name)
        if self.allow_missing or id(param) not in self.trained or (keys and keys == self.keys):
            return keys
        where = f"checkpoint {self.pieces.directory}"
        fix = ("; pass allow_missing_optimizer_state=True to load it anyway (the "
               "missing state starts afresh), or optimizer=None to load the model only")
        if not self.keys:
            raise ValueError(f"{where} holds no optimizer state (it was saved without "
                             f"an optimizer, or before its first step){fix}")
        missing = ", ".join(k for k in self.keys if k not in keys)
        raise ValueError(f"{where} lacks the optimizer state {missing} of parameter "
                         f"'{name}' (it holds {', '.join(self.keys)} for other parameters: "
                         f"an entry dropped from its manifest, or a parameter that had no "
                         f"gradient when it was saved){fix}")


def load_checkpoint(directory, model, parts=None, optimizer=None,
                    allow_missing_optimizer_state=False):
    """Loads a checkpoint saved by save_checkpoint, from any layout, into
    `parts` (default [model]) and `optimizer` (its state is replaced).
    Returns the saved step. Every rank reads the manifest and the files it
    needs; nothing is modified before every tensor was found and matched.
    Optimizer state the checkpoint lacks, wholly or for some parameter, is
    a ValueError unless allow_missing_optimizer_state."""
    parts = parts if parts is not None else [model]
    pieces = _Pieces(directory)
    _, tp_rank, _ = _coordinates()
    name_of = {id(t): n for n, t in model.named_parameters()}
    name_of.update({id(t): n for n, t in model.named_buffers()})
    writes = []  # (function, args), applied once everything resolved
    if optimizer is not None:
        checked = _OptimizerStateCheck(pieces, optimizer, allow_missing_optimizer_state)

    def value(entry_name, like_tensor, like_param):
        e = _Entry(entry_name, like_tensor, like_param)
        return e.local_part(pieces.full(entry_name, e.full_shape), tp_rank)

    for part in parts:
        if isinstance(part, FullyShardedDataParallel):
            for unit in _units(part):
                names = [name_of[id(p)] for p in unit.params]
                shapes = [p_shape for p_shape in unit.shapes]
                values = [value(n, torch.empty(s), p)
                          for n, s, p in zip(names, shapes, unit.params)]
                writes.append((unit.core.load_full_parameters, (values,)))
                if optimizer is not None and names:
                    state = {}
                    for n in names[1:]:
                        checked.check(n, unit.core.shard)
                    for key in checked.check(names[0], unit.core.shard):
                        saved_shape = pieces.shapes[f"{names[0]}#{key}"]
                        if len(saved_shape) > 0:  # shaped like the parameters (moments)
                            per = [value(f"{n}#{key}", torch.empty(s), p)
                                   for n, s, p in zip(names, shapes, unit.params)]
                            state[key] = unit.core.shard_of([v.to(torch.float32) for v in per])
                        else:
                            state[key] = pieces.full(f"{names[0]}#{key}", saved_shape)
                    writes.append((_set_state, (optimizer, unit.core.shard, state)))
            module = part.module
        else:
            for p in part.parameters():
                name = name_of[id(p)]
                writes.append((_copy, (p, value(name, p.detach(), p))))
                if optimizer is not None:
                    state = {}
                    for key in checked.check(name, p):
                        saved_shape = pieces.shapes[f"{name}#{key}"]
                        like = p if len(saved_shape) > 0 else None  # moments, or a step
                        state[key] = value(f"{name}#{key}", p.detach() if like is not None
                                           else torch.empty(saved_shape), like)
                    writes.append((_set_state, (optimizer, p, state)))
            module = part
        persistent = set(module.state_dict().keys())
        for n, b in module.named_buffers():
            if n in persistent and id(b) in name_of:
                writes.append((_copy, (b, value(name_of[id(b)], b, None))))
    for fn, args in writes:
        fn(*args)
    return pieces.manifest["step"]


def _copy(dst, src):
    with torch.no_grad():
        dst.copy_(src)


def _set_state(optimizer, param, state):
    optimizer.state[param] = {k: v.clone() for k, v in state.items()}


def load_full_state_dict(directory):
    """The consolidated state dict of a sharded checkpoint (parameters and
    buffers, not optimizer state), in one process, without torch.distributed."""
    pieces = _Pieces(directory)
    return {n: pieces.full(n, shape) for n, shape in sorted(pieces.shapes.items())
            if "#" not in n}
