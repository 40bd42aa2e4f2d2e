"""Where a checkpoint comes from: a local directory, or a Hugging Face repo fetched with
huggingface-hub (HF_HUB_OFFLINE and the local cache honoured, --revision pinned).
Weights: safetensors (single or sharded with an index) or pytorch_model.bin, read by
torch_zip without unpickling anything. File names taken from a checkpoint's index must be
plain relative names inside its directory."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_eagle.errors import EdgeEagleError

WEIGHT_PATTERNS = ["config.json", "*.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                   "pytorch_model.bin.index.json"]


@dataclass
class Checkpoint:
    source: str
    revision: str | None
    directory: Path
    config: dict[str, Any]
    tensors: dict[str, np.ndarray]


def _resolve_dir(src: str, revision: str | None) -> tuple[Path, str | None]:
    path = Path(src)
    if path.is_dir():
        return path, revision
    if path.exists() or src.startswith((".", "/")) or src.count("/") != 1:
        raise EdgeEagleError(f"{src} is neither a checkpoint directory nor a Hugging Face repo id (owner/name); "
                             "check the path.")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise EdgeEagleError("Fetching from the Hugging Face Hub needs huggingface-hub; "
                             "run `pip install huggingface-hub` or pass a local directory.") from None
    try:
        # read the environment now, not at huggingface_hub's import
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        local = snapshot_download(src, revision=revision, allow_patterns=WEIGHT_PATTERNS,
                                  cache_dir=os.environ.get("HF_HUB_CACHE") or None, local_files_only=offline)
    except LocalEntryNotFoundError:
        raise EdgeEagleError(f"{src} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
                             "download it first or pass a local directory.") from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise EdgeEagleError(f"Could not fetch {src} from the Hugging Face Hub ({type(e).__name__}); "
                             "check the repo id, --revision and your network.") from None
    return Path(local), revision


def _within(directory: Path, name: str) -> Path:
    """A file named by the checkpoint's own index must stay inside the checkpoint directory.
    Checked on the name itself, not on resolved links: a Hugging Face cache snapshot is made
    of links into the cache's blob store, which is fine; '..', absolute paths and drive or
    backslash tricks in the name are not."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise EdgeEagleError("The checkpoint index names an empty or invalid file; re-download the checkpoint.")
    parts = Path(name.replace("\\", "/")).parts
    if Path(name).is_absolute() or name.startswith(("/", "\\")) or ":" in name or ".." in parts:
        raise EdgeEagleError(f"The checkpoint index names '{name}', outside its directory; refusing to read it.")
    return directory / Path(*parts)


def _load_safetensors(files: list[Path]) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError, safe_open

    out: dict[str, np.ndarray] = {}
    for f in files:
        try:
            with safe_open(f, framework="pt") as st:
                for name in st.keys():
                    t = st.get_tensor(name)
                    out[name] = t.float().numpy() if t.is_floating_point() else t.numpy()
        except (SafetensorError, OSError, RuntimeError, ValueError) as e:
            raise EdgeEagleError(f"{f.name} is not a readable safetensors file ({str(e).splitlines()[0][:80]}); "
                                 "re-download it.") from None
    return out


def _load_bin(files: list[Path]) -> dict[str, np.ndarray]:
    from .torch_zip import load_torch_zip

    out: dict[str, np.ndarray] = {}
    for f in files:
        out.update(load_torch_zip(f))
    return out


def load_checkpoint(src: str | os.PathLike[str], revision: str | None = None) -> Checkpoint:
    directory, revision = _resolve_dir(os.fspath(src), revision)
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise EdgeEagleError(f"{directory} has no config.json; point at the drafter checkpoint's directory.")
    try:
        config = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EdgeEagleError(f"{cfg_path} is not valid JSON ({e.msg if hasattr(e, 'msg') else e}); "
                             "fix or re-download it.") from None
    if not isinstance(config, dict):
        raise EdgeEagleError(f"{cfg_path} is not a JSON object; fix or re-download it.")

    for index_name, loader in (("model.safetensors.index.json", _load_safetensors),
                               ("pytorch_model.bin.index.json", _load_bin)):
        index = directory / index_name
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                files = sorted({_within(directory, v) for v in weight_map.values()})
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                raise EdgeEagleError(f"{index} is not a valid shard index; re-download the checkpoint.") from None
            missing = [f.name for f in files if not f.is_file()]
            if missing:
                raise EdgeEagleError(f"Shard {missing[0]} named by {index_name} is missing; "
                                     "re-download the checkpoint.")
            return Checkpoint(os.fspath(src), revision, directory, config, loader(files))
    st_files = sorted(directory.glob("*.safetensors"))
    if st_files:
        return Checkpoint(os.fspath(src), revision, directory, config, _load_safetensors(st_files))
    if (directory / "pytorch_model.bin").is_file():
        return Checkpoint(os.fspath(src), revision, directory, config, _load_bin([directory / "pytorch_model.bin"]))
    raise EdgeEagleError(f"{directory} has no model.safetensors or pytorch_model.bin; point at the drafter "
                         "checkpoint's directory.")
