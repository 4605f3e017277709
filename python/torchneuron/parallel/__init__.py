"""torchneuron.parallel: what users train with on the "neuron" backend.

The layout of a job's ranks (tensor x data x pipeline parallel), data
sharding and data parallelism. The cores are C++ (neuron::parallel, usable
from libtorch trainers); this package is their Python face.

    import torchneuron.parallel as tp
    tp.initialize(tp=2, pp=2)                     # dp = world / 4
    mesh = tp.get_device_mesh()                   # torch DeviceMesh ("pp", "dp", "tp")
    sampler = tp.DistributedSampler(dataset)      # shards over the data-parallel group
    model = tp.DistributedDataParallel(model)     # averages grads over it
    # or ZeRO: model = tp.FullyShardedDataParallel(model, stage=3)

Mixture-of-Experts layers and expert parallelism over a DeviceMesh's "ep"
dimension: torchneuron.parallel.moe.
"""
from .data import DistributedSampler, SyntheticTokenDataset
from .ddp import DistributedDataParallel, average_gradients
from . import tensor_parallel
from .tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)
from . import checkpoint, moe, pipeline
from .clip import clip_grad_norm_
from .checkpoint import load_checkpoint, load_full_state_dict, save_checkpoint
from .pipeline import PipelineEngine
from .fsdp import (
    CPUOffload,
    FullyShardedDataParallel,
    MixedPrecision,
    model_state_memory,
    module_type_policy,
    record_optimizer_state,
    reset_model_state_peak,
    size_policy,
)
from .mesh import (
    Layout,
    destroy,
    get_data_parallel_group,
    get_data_parallel_rank,
    get_data_parallel_world_size,
    get_device_mesh,
    get_layout,
    get_pipeline_parallel_group,
    get_pipeline_parallel_rank,
    get_pipeline_parallel_world_size,
    get_tensor_parallel_group,
    get_tensor_parallel_rank,
    get_tensor_parallel_world_size,
    initialize,
    is_initialized,
)

__all__ = [
    "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
    "tensor_parallel", "vocab_parallel_cross_entropy", "pipeline", "PipelineEngine",
    "checkpoint", "moe", "clip_grad_norm_", "load_checkpoint", "load_full_state_dict", "save_checkpoint",
    "DistributedDataParallel", "DistributedSampler", "average_gradients", "FullyShardedDataParallel", "Layout",
    "MixedPrecision", "CPUOffload", "SyntheticTokenDataset", "module_type_policy", "size_policy",
    "model_state_memory", "record_optimizer_state", "reset_model_state_peak",
    "destroy", "get_data_parallel_group", "get_device_mesh", "get_data_parallel_rank",
    "get_data_parallel_world_size", "get_layout", "get_pipeline_parallel_group",
    "get_pipeline_parallel_rank", "get_pipeline_parallel_world_size",
    "get_tensor_parallel_group", "get_tensor_parallel_rank", "get_tensor_parallel_world_size",
    "initialize", "is_initialized",
]
