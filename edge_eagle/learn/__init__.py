"""Adapting the drafter to a user's own traffic: the opt-in store of finished requests (store.py)."""

from .store import LearnStore, all_stores, learn_root, store_dir  # noqa: F401

__all__ = ["LearnStore", "all_stores", "learn_root", "store_dir"]
