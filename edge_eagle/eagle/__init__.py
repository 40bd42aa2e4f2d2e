"""The EAGLE-3 / EAGLE-3.1 drafter (drafter.EagleDrafter) and its parts; see drafter.py."""

from .drafter import EagleDrafter
from .norms import Norms, rms_norm
from .spec import Eagle3Spec, check_pair, layer_ids_problem
from .tree import TREE_BRANCH, TREE_BRANCH_MAX, top_logprobs

__all__ = ["EagleDrafter", "Eagle3Spec", "Norms", "check_pair", "layer_ids_problem", "rms_norm", "TREE_BRANCH",
           "TREE_BRANCH_MAX", "top_logprobs"]
