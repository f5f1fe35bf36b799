"""A benchmark run's progress on disk, so a run of hours survives an interruption.

The full benchmark (50 questions x 10 systems x 6 apps, bounds, Poisson sweeps) takes
hours on a small machine. After every question (all its systems), every bound and every
Poisson sweep the runner saves what it has; ``teola bench --resume`` continues where it
stopped, with the settings the run started with. Systems are compared question by
question (each question runs under every system back to back), so a resumed run still
compares them side by side; the page lists the segments with their dates, machine load
and code version. Every number must come from the same code: a resume whose package source
differs from the run's (by content hash, whatever the commit) is refused; resume from a
checkout of the recorded commit, e.g. a ``git worktree``.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path("out/bench/checkpoint.json")
VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be started over or resumed as asked; the message says why."""


def code_identity() -> str:
    """A hash of the package's source files as they are on disk: what decides the numbers,
    whatever the commit, the docs or the tests (and with or without git)."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha1()
    for path in sorted(package.rglob("*.py")):
        digest.update(f"{path.relative_to(package).as_posix()}\0".encode())
        digest.update(hashlib.sha1(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def code_version() -> str:
    """For people: the git commit of this checkout (``+edits`` when the package source has
    uncommitted changes), else the installed version."""
    repo = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
        edited = subprocess.run(["git", "-C", str(repo), "diff", "--quiet", "HEAD", "--", "src"],
                                capture_output=True, timeout=30).returncode != 0
        return head + ("+edits" if edited else "")
    except (OSError, subprocess.SubprocessError):
        from importlib.metadata import version

        return f"teola_plugin {version('teola_plugin')}"


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that an interruption mid-write leaves the previous file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


class Checkpoint:
    """The JSON file of one run: its settings, finished apps, the app in progress, segments."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data
        self._t0 = time.perf_counter()

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    def start(cls, path: Path, config: dict[str, Any], fresh: bool = False) -> Checkpoint:
        """A new run. An unfinished run's checkpoint is not overwritten unless ``fresh``."""
        if path.exists() and not fresh:
            old = cls._read(path)
            if not old.get("finished"):
                done = sorted(old.get("apps", {}))
                started = (old.get("segments") or [{}])[0].get("started")
                raise CheckpointError(
                    f"{path} holds an unfinished benchmark run (started {started}, "
                    f"apps done: {done or 'none'}, in progress: {(old.get('current') or {}).get('app')}); "
                    "pass --resume to continue it, or --fresh to discard it")
        data = {"version": VERSION, "config": config, "code": code_version(), "code_identity": code_identity(),
                "finished": False, "apps": {}, "current": None, "segments": []}
        return cls(path, data)

    @classmethod
    def resume(cls, path: Path) -> Checkpoint:
        if not path.exists():
            raise CheckpointError(f"no benchmark checkpoint at {path} to resume")
        data = cls._read(path)
        if data.get("version") != VERSION:
            raise CheckpointError(f"{path} was written by another checkpoint format ({data.get('version')})")
        if data.get("finished"):
            raise CheckpointError(f"the run in {path} has finished; its results were written (start a new one)")
        if code_identity() != data.get("code_identity"):
            recorded = data.get("code", "?")
            raise CheckpointError(
                f"the run in {path} started on code {recorded}, whose package source differs from this "
                f"checkout's ({code_version()}): every number of a run must come from the same code; resume "
                f"from a checkout of it (git worktree add ../bench-run {recorded.removesuffix('+edits')}"
                f"{', with the same uncommitted edits' if recorded.endswith('+edits') else ''})")
        for seg in data["segments"]:
            if not seg.get("open"):
                continue
            if seg.get("host") == socket.gethostname() and seg.get("pid") and _alive(seg["pid"]):
                raise CheckpointError(f"the run in {path} is still running (pid {seg['pid']}); stop it first")
            seg["open"] = False  # a process killed outright: its time runs to its last save
            seg["killed"] = True
        return cls(path, data)

    @staticmethod
    def _read(path: Path) -> dict[str, Any]:
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"cannot read the benchmark checkpoint {path}: {exc}") from exc

    @property
    def config(self) -> dict[str, Any]:
        return self.data["config"]

    # -- segments (one per process that worked on the run) ---------------------------------------
    def begin_segment(self, machine: str = "") -> None:
        self.data["segments"].append({"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                      "code": code_version(), "machine": machine, "host": socket.gethostname(),
                                      "pid": os.getpid(), "load_avg_start": list(os.getloadavg()),
                                      "wall_s": 0.0, "open": True})
        self._t0 = time.perf_counter()
        self.save()

    def end_segment(self) -> None:
        segments = self.data["segments"]
        if not segments or not segments[-1].get("open"):
            return
        self._stamp_segment()
        segments[-1]["open"] = False
        self.save()

    def _stamp_segment(self) -> None:
        """Every save dates the open segment, so a process killed outright leaves its time."""
        segments = self.data["segments"]
        if segments and segments[-1].get("open"):
            segments[-1].update(ended=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                load_avg_end=list(os.getloadavg()), wall_s=round(time.perf_counter() - self._t0, 1))

    # -- apps ------------------------------------------------------------------------------------
    def finished_app(self, name: str) -> dict[str, Any] | None:
        return self.data["apps"].get(name)

    def app_state(self, name: str) -> dict[str, Any]:
        """What the app in progress has done (a fresh state for another app)."""
        cur = self.data.get("current")
        if not cur or cur.get("app") != name:
            cur = self.data["current"] = {"app": name, "questions_done": 0, "runs": [], "bounds": [],
                                          "poisson": []}
        return cur

    def finish_app(self, name: str, result: dict[str, Any]) -> None:
        self.data["apps"][name] = result
        self.data["current"] = None
        self.save()

    def finish(self) -> None:
        self.data["finished"] = True
        self.save()

    def save(self) -> None:
        """Atomically: an interruption mid-write leaves the previous state."""
        self._stamp_segment()
        write_atomically(self.path, json.dumps(self.data, default=str))
