"""Adapting the drafter to a user's own traffic: the opt-in store of finished requests (store.py),
the drafter's weights read back from its GGUF (weights.py), fine-tuning with a candidate kept only
when it scores better (adapt.py), and the accepted versions (versions.py)."""

from .store import LearnStore, all_stores, learn_root, store_dir  # noqa: F401
from .versions import Versions  # noqa: F401

__all__ = ["LearnStore", "Versions", "all_stores", "learn_root", "store_dir"]
