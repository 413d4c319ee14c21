"""carma_profile: the `carma.io/model-profile` of a PyTorch model.

    >>> import carma_profile
    >>> carma_profile.describe(model, batch_size=128, input_size=(3, 32, 32))
    {'family': 'cnn', 'batchSize': 128, 'parameters': ..., 'activations': ..., ...}

See `core.py` for the definitions and `python -m carma_profile --help` for the CLI.
"""

from .core import FAMILIES, ProfileError, describe

__all__ = ["describe", "ProfileError", "FAMILIES"]
__version__ = "0.1.0"
