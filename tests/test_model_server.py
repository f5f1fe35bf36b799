"""The model servers the tests and the benchmark start die with the process that started
them (``bench/model_server.py``): a test run killed by a timeout leaks no vLLM server. Shown
with a real parent process killed by SIGKILL (no cleanup of its own runs) and a real child."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from teola_plugin.bench.model_server import dying_with_parent

PARENT = """
import subprocess, sys, time
from teola_plugin.bench.model_server import dying_with_parent
child = subprocess.Popen(dying_with_parent([sys.executable, "-c", "import time; time.sleep(120)"]),
                         start_new_session=True)
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_started_server_command_ends_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    child = int(parent.stdout.readline())
    time.sleep(0.5)
    assert _alive(child)  # the command runs (the wrapper exec'd into it)
    with open(f"/proc/{child}/cmdline") as cmdline:
        assert cmdline.read().split("\0")[1:3] == ["-c", "import time; time.sleep(120)"]
    parent.kill()
    parent.wait(10)
    for _ in range(50):
        if not _alive(child):
            break
        time.sleep(0.1)
    assert not _alive(child)


def test_the_command_is_unchanged_but_for_the_wrapper():
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--port", "1"]
    wrapped = dying_with_parent(argv)
    assert wrapped[-len(argv):] == argv
    if sys.platform.startswith("linux"):
        assert wrapped[:2] == [sys.executable, "-c"] and wrapped[3] == str(os.getpid())
