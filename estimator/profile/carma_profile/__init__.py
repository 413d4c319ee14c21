"""carma_profile: the `carma.io/model-profile` of a PyTorch model.

    >>> import carma_profile
    >>> carma_profile.describe(model, batch_size=128, input_size=(3, 32, 32))
    {'family': 'cnn', 'batchSize': 128, 'parameters': ..., 'activations': ..., ...}

    >>> carma_profile.trace_step(torchvision.models.resnet50, batch_size=32, input_size=(3, 224, 224))
    {'forwardMiB': ..., 'backwardMiB': ..., 'optimizerStepMiB': ..., 'largestTensorMiB': ...}

See `core.py` for the definitions, `trace.py` for what a traced step counts, and `python -m carma_profile --help` for the CLI.
"""

from .core import FAMILIES, ProfileError, describe
from .trace import trace_step

__all__ = ["describe", "trace_step", "ProfileError", "FAMILIES"]
__version__ = "0.1.0"
