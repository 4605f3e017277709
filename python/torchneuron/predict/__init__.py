"""torchneuron.predict: what `neuronrun predict` runs to capture one training
step of a full-size decoder on fake tensors (capture.py, step.py). The
pricing, the memory estimate and the replay over the cluster are C++
(neuron::parallel's step prediction; docs/scaling.md, "Predicting a
full-size job")."""
from .step import StepSpec, capture_step  # noqa: F401
