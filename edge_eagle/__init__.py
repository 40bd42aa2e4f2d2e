"""edge-eagle: EAGLE-3 / EAGLE-3.1 speculative decoding for GGUF models through llama.cpp."""

__version__ = "0.1.0"

from ._llama import live_handles  # noqa: E402
from .api import EdgeEagle, Generation, Token  # noqa: E402
from .drafter import Drafter, NgramDrafter  # noqa: E402
from .errors import EdgeEagleError  # noqa: E402
from .proposal import Proposal  # noqa: E402
from .sampling import SamplingParams  # noqa: E402
from .stats import SpecStats  # noqa: E402

__all__ = ["EdgeEagle", "Generation", "Token", "Drafter", "NgramDrafter", "Proposal", "EdgeEagleError",
           "SamplingParams", "SpecStats", "live_handles"]
