"""torchneuron: PyTorch distributed training on a simulated Trainium fabric.

neuronrun puts this directory's parent on PYTHONPATH, so ranks can
``import torchneuron`` without installing it. The "neuron" torch.distributed
backend, ``torchneuron.init()`` and the fabric statistics arrive with the
backend (see docs/architecture.md); today the package carries the version.
"""

__version__ = "0.1.0"
