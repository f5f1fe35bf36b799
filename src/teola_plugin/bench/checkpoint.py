"""A benchmark run's progress on disk, so a run of hours survives an interruption.

The full benchmark (50 questions x 10 systems x 6 apps, bounds, Poisson sweeps) takes
hours on a small machine. After every question (all its systems), every bound and every
Poisson sweep the runner saves what it has; ``teola bench --resume`` continues where it
stopped, with the settings the run started with. Systems are compared question by
question (each question runs under every system back to back), so a resumed run still
compares them side by side; the page lists the segments with their dates, machine load
and code version. Every number must come from the same code: resuming from another
commit is refused (resume from a checkout of the recorded one, e.g. a ``git worktree``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path("out/bench/checkpoint.json")
VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be started over or resumed as asked; the message says why."""


def code_version() -> str:
    """The git commit of this checkout, with ``-dirty-<hash of the diff>`` when tracked files
    changed (so two different sets of edits never compare equal); else the package version."""
    repo = Path(__file__).resolve().parents[3]

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30,
                              check=True).stdout

    try:
        head = git("rev-parse", "HEAD").strip()
        diff = git("diff", "HEAD")
        return head + (f"-dirty-{hashlib.sha1(diff.encode()).hexdigest()[:12]}" if diff else "")
    except (OSError, subprocess.SubprocessError):
        from importlib.metadata import version

        return f"teola_plugin {version('teola_plugin')}"


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
        data = {"version": VERSION, "config": config, "code": code_version(), "finished": False,
                "apps": {}, "current": None, "segments": []}
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
        here, recorded = code_version(), data["code"]
        if here != recorded:
            raise CheckpointError(
                f"the run in {path} started on code {recorded}, this checkout is {here}: every number of a run "
                f"must come from the same code; resume from a clean checkout of that commit "
                f"(git worktree add ../bench-run {recorded.split('-')[0]})")
        for seg in data["segments"]:  # a process killed outright left its segment open
            if seg.pop("open", False):
                seg["killed"] = True  # its time runs to its last save
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
    def begin_segment(self) -> None:
        self.data["segments"].append({"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                      "code": code_version(), "load_avg_start": list(os.getloadavg()),
                                      "wall_s": 0.0, "open": True})
        self._t0 = time.perf_counter()
        self.save()

    def end_segment(self) -> None:
        self._stamp_segment()
        self.data["segments"][-1]["open"] = False
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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, default=str))
        os.replace(tmp, self.path)
