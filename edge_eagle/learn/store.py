"""The opt-in store of finished requests, for adapting the drafter to a user's own traffic.

What is stored: for each finished request, the token ids of its prompt (chat-formatted, as the
target saw it) and of its answer, the time it finished, and nothing else. Token ids are the
text: anyone who can read the store can read the conversations. Nothing is stored unless the
user opts in (`--learn`, `EdgeEagle(learn=True)`).

Where: one SQLite database per target and drafter pair,
($XDG_CACHE_HOME or ~/.cache)/edge-eagle/learn/<target>--<drafter>-<hash>/requests.sqlite
($EDGE_EAGLE_LEARN_DIR replaces .../learn), with store.json naming the pair.

Bounds: at most `max_tokens` tokens (prompt and answer together, default 2,000,000, about 8 MB
of ids); when a new request passes the cap, the oldest requests go first. A request longer than
the cap alone is not kept.

Safety: SQLite in WAL mode, each request one transaction, so two processes can use one store
at once (writers wait up to 30 s for each other) and a process killed mid-write leaves the
store as it was before that request. A store that SQLite finds damaged when it opens is renamed
aside (requests.sqlite.corrupt-<time>), reported in one line (`LearnStore.recovered`), and
started afresh.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sqlite3
import time
from array import array
from contextlib import closing
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import EdgeEagleError
from ..fsutil import atomic_write, cache_dir
from ..options import LEARN_TOKENS

log = logging.getLogger("edge_eagle.learn")

DEFAULT_MAX_TOKENS = LEARN_TOKENS
BUSY_TIMEOUT_S = 30.0
DB_NAME = "requests.sqlite"
WORK = "work"  # adaptation's features of the requests (learn/adapt.py): derived from the text
META_NAME = "store.json"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    finished REAL NOT NULL,
    prompt BLOB NOT NULL,
    answer BLOB NOT NULL,
    n_tokens INTEGER NOT NULL
);
"""


def learn_root() -> Path:
    """The folder that holds every pair's store."""
    explicit = os.environ.get("EDGE_EAGLE_LEARN_DIR")
    return Path(explicit).expanduser() if explicit else cache_dir() / "learn"


def _identity(path: str | os.PathLike[str] | None) -> tuple[str, str]:
    """(a readable name, an identity string) of a model file, or of a drafter kind ('none', 'ngram')."""
    if path is None:
        return "none", "none"
    p = Path(path)
    if not p.is_file():
        return p.name or str(path), str(path)
    return p.stem, f"{p.name}:{p.stat().st_size}"


def store_dir(target: str | os.PathLike[str], drafter: str | os.PathLike[str] | None) -> Path:
    """The folder of the store for this target and drafter (the same model files under another
    folder share it: the name and size identify a file)."""
    (t_name, t_id), (d_name, d_id) = _identity(target), _identity(drafter)
    digest = hashlib.sha256(f"{t_id}\n{d_id}".encode()).hexdigest()[:12]
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{t_name}--{d_name}")
    return learn_root() / f"{safe[:80]}-{digest}"


def _pack(ids: Sequence[int]) -> bytes:
    return array("i", [int(t) for t in ids]).tobytes()


def _unpack(blob: bytes) -> list[int]:
    out = array("i")
    out.frombytes(blob)
    return out.tolist()


class LearnStore:
    """One target and drafter pair's finished requests (see the module's docstring)."""

    def __init__(self, directory: str | os.PathLike[str], *, max_tokens: int = DEFAULT_MAX_TOKENS,
                 meta: dict[str, Any] | None = None):
        if max_tokens < 1:
            raise EdgeEagleError(f"The learn store's cap must be at least 1 token, got {max_tokens}.")
        self.directory = Path(directory)
        self.path = self.directory / DB_NAME
        self.max_tokens = max_tokens
        #: one line when the store was found damaged and set aside at open (None: it was fine)
        self.recovered: str | None = None
        self.directory.mkdir(parents=True, exist_ok=True)
        meta_path = self.directory / META_NAME
        if meta and not meta_path.exists():
            atomic_write(meta_path, json.dumps(meta, indent=1) + "\n")
        self._open_checked()

    @classmethod
    def for_models(cls, target: str | os.PathLike[str], drafter: str | os.PathLike[str] | None,
                   **kwargs: Any) -> "LearnStore":
        meta = {"target": os.path.realpath(target),
                "drafter": None if drafter is None else (os.path.realpath(drafter) if os.path.isfile(drafter)
                                                         else str(drafter)),
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        return cls(store_dir(target, drafter), meta=meta, **kwargs)

    # --- opening ----------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # WAL: a killed process loses nothing committed
        return db

    def _open_checked(self) -> None:
        try:
            with closing(self._connect()) as db:
                ok = db.execute("PRAGMA quick_check").fetchone()
                if not ok or ok[0] != "ok":
                    raise sqlite3.DatabaseError(str(ok[0]) if ok else "no answer")
                db.executescript(_SCHEMA)
                db.execute("SELECT id, finished, prompt, answer, n_tokens FROM requests LIMIT 1").fetchall()
        except sqlite3.DatabaseError as e:
            aside = self.path.with_name(f"{DB_NAME}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
            for suffix in ("", "-wal", "-shm"):
                part = Path(str(self.path) + suffix)
                if part.exists():
                    os.replace(part, Path(str(aside) + suffix))
            self.recovered = (f"The learn store {self.path} was damaged ({e}); it was moved to {aside.name} "
                              "and a new one started.")
            log.warning(self.recovered)
            with closing(self._connect()) as db:
                db.executescript(_SCHEMA)

    # --- writing ----------------------------------------------------------------------------

    def add(self, prompt: Sequence[int], answer: Sequence[int], *, finished: float | None = None) -> bool:
        """Keep one finished request (False: it alone is longer than the cap, so it is not kept).
        The oldest requests go while the store holds more than its cap."""
        n = len(prompt) + len(answer)
        if not answer or n > self.max_tokens:
            return False
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("INSERT INTO requests (finished, prompt, answer, n_tokens) VALUES (?, ?, ?, ?)",
                           (time.time() if finished is None else finished, _pack(prompt), _pack(answer), n))
                total = db.execute("SELECT COALESCE(SUM(n_tokens), 0) FROM requests").fetchone()[0]
                if total > self.max_tokens:
                    self._evict(db, total - self.max_tokens)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return True

    @staticmethod
    def _evict(db: sqlite3.Connection, excess: int) -> None:
        """Delete the oldest requests until `excess` tokens are gone."""
        last, freed = None, 0
        for rid, n in db.execute("SELECT id, n_tokens FROM requests ORDER BY id"):
            if freed >= excess:
                break
            last, freed = rid, freed + n
        if last is not None:
            db.execute("DELETE FROM requests WHERE id <= ?", (last,))

    def reset(self) -> int:
        """Forget every stored request, and the features adaptation extracted from them (work/);
        returns how many requests there were. Adapted drafter versions stay (learn rollback)."""
        with closing(self._connect()) as db:
            n = db.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
            db.execute("DELETE FROM requests")
            db.execute("VACUUM")
        shutil.rmtree(self.directory / WORK, ignore_errors=True)
        return int(n)

    # --- reading ----------------------------------------------------------------------------

    def requests(self, *, newest_first: bool = False,
                 limit: int | None = None) -> Iterator[tuple[list[int], list[int], float]]:
        """(prompt ids, answer ids, finish time) of the stored requests, oldest first (or newest
        first), at most `limit` of them."""
        order = "DESC" if newest_first else "ASC"
        sql = f"SELECT prompt, answer, finished FROM requests ORDER BY id {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with closing(self._connect()) as db:
            rows = db.execute(sql).fetchall()
        for prompt, answer, finished in rows:
            yield _unpack(prompt), _unpack(answer), float(finished)

    def added(self) -> int:
        """Requests ever kept in this store (the id sequence): unlike the count, it keeps growing
        once the cap evicts the oldest, so it tells how many are new since some moment."""
        with closing(self._connect()) as db:
            row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'requests'").fetchone()
        return int(row[0]) if row else 0

    def status(self) -> dict[str, Any]:
        with closing(self._connect()) as db:
            n, tokens, first, last = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(n_tokens), 0), MIN(finished), MAX(finished) FROM requests").fetchone()
        size = sum(p.stat().st_size for p in self.directory.glob(DB_NAME + "*") if p.is_file())
        meta_path = self.directory / META_NAME
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}

        def stamp(t: float | None) -> str | None:
            return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))

        return {"path": str(self.path), "target": meta.get("target"), "drafter": meta.get("drafter"),
                "requests": int(n), "tokens": int(tokens), "max_tokens": self.max_tokens, "bytes": size,
                "oldest": stamp(first), "newest": stamp(last)}


def all_stores() -> list[Path]:
    """The folders of every pair's store under learn_root()."""
    root = learn_root()
    return sorted(p for p in root.iterdir() if (p / DB_NAME).exists()) if root.is_dir() else []
