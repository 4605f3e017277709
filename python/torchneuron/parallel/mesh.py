"""The device mesh: process groups for tensor, data and pipeline parallelism.

Layout (neuron::parallel::MeshLayout, Megatron's order): tensor-parallel ranks
are contiguous, pipeline stages strided by tp x dp, data parallel the rest:
rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank. get_device_mesh() gives
the same layout as PyTorch's DeviceMesh of dims ("pp", "dp", "tp") over the
same groups, for fully_shard, parallelize_module, pipelining and DCP.
"""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from .. import _C

_AXES = ("tensor", "data", "pipeline")
_state = {}


class Layout:
    """The sizes and this rank's coordinates, and the members of its groups."""

    def __init__(self, world, tp, pp, dp, rank):
        self._layout = _C._MeshLayout(world, tp, pp, dp)
        self.world_size = world
        self.tp, self.dp, self.pp = (self._layout.size(a) for a in _AXES)
        self.rank = rank
        self.tp_rank, self.dp_rank, self.pp_rank = self._layout.coordinates(rank)

    def group_ranks(self, axis, rank=None):
        """Job ranks of the `axis` ("tensor", "data", "pipeline") group of `rank`."""
        return self._layout.group(axis, self.rank if rank is None else rank)

    def all_groups(self, axis):
        return self._layout.groups(axis)

    def rank_of(self, tp_rank, dp_rank, pp_rank):
        return self._layout.rank(tp_rank, dp_rank, pp_rank)

    def __repr__(self):
        return f"Layout({self._layout.describe()}, rank {self.rank})"


def initialize(tp=1, pp=1, dp=None, backend=None, timeout=None):
    """Builds the tensor-, data- and pipeline-parallel process groups.

    Collective: every rank of the default group calls it with the same sizes
    (torch.distributed must be initialized). dp defaults to world / (tp x pp);
    a world size that tp x pp does not divide raises InvalidUsageError.
    `backend` and `timeout` are passed to dist.new_group (default: the
    default group's). Returns the Layout.
    """
    if not dist.is_initialized():
        raise RuntimeError("torchneuron.parallel.initialize: call "
                           "torch.distributed.init_process_group first")
    if _state:
        raise RuntimeError("torchneuron.parallel.initialize: already initialized "
                           f"({_state['layout']}); call destroy() first")
    layout = Layout(dist.get_world_size(), tp, pp, dp or 0, dist.get_rank())
    kwargs = {}
    if backend is not None:
        kwargs["backend"] = backend
    if timeout is not None:
        kwargs["timeout"] = timeout
    groups = {}
    for axis in _AXES:  # every rank creates every group, in the same order
        for members in layout.all_groups(axis):
            group = dist.new_group(members, **kwargs)
            if layout.rank in members:
                groups[axis] = group
    _state.update(layout=layout, groups=groups)
    return layout


def get_device_mesh(device_type=None):
    """The layout as a torch DeviceMesh of shape (pp, dp, tp), dims named
    "pp", "dp" and "tp", over the groups initialize() made (no new group):
    mesh["dp"].get_group() is get_data_parallel_group(), and so on.
    `device_type` defaults to the current accelerator's ("neuron" once
    torchneuron is imported), else "cpu"; the mesh is made once per type.
    """
    state = _require()
    if device_type is None:
        accelerator = torch.accelerator.current_accelerator()
        device_type = accelerator.type if accelerator is not None else "cpu"
    meshes = state.setdefault("device_meshes", {})
    if device_type not in meshes:
        layout = state["layout"]
        ranks = torch.arange(layout.world_size, dtype=torch.int).reshape(layout.pp, layout.dp,
                                                                          layout.tp)
        groups = [state["groups"][axis] for axis in ("pipeline", "data", "tensor")]
        coordinates = (layout.pp_rank, layout.dp_rank, layout.tp_rank)
        for dim, group in enumerate(groups):  # each dim's row through this rank is its group
            row = list(coordinates)
            row[dim] = slice(None)
            along, members = ranks[tuple(row)].tolist(), dist.get_process_group_ranks(group)
            if along != members:
                raise RuntimeError(f"torchneuron.parallel.get_device_mesh: mesh dim {dim} "
                                   f"holds ranks {along}, its group {members}")
        meshes[device_type] = DeviceMesh.from_group(groups, device_type, mesh=ranks,
                                                    mesh_dim_names=("pp", "dp", "tp"))
    return meshes[device_type]


def is_initialized():
    return bool(_state)


def destroy():
    """Forgets the layout (the groups are destroyed with the default group)."""
    _state.clear()


def get_layout():
    return _require()["layout"]


def _require():
    if not _state:
        raise RuntimeError("torchneuron.parallel is not initialized: call "
                           "torchneuron.parallel.initialize(tp=, pp=) first")
    return _state


def _group(axis):
    return _require()["groups"][axis]


def get_tensor_parallel_group():
    return _group("tensor")


def get_data_parallel_group():
    return _group("data")


def get_pipeline_parallel_group():
    return _group("pipeline")


def get_tensor_parallel_rank():
    return get_layout().tp_rank


def get_data_parallel_rank():
    return get_layout().dp_rank


def get_pipeline_parallel_rank():
    return get_layout().pp_rank


def get_tensor_parallel_world_size():
    return get_layout().tp


def get_data_parallel_world_size():
    return get_layout().dp


def get_pipeline_parallel_world_size():
    return get_layout().pp
