"""Exposure: what the embedded Ray runtime opens, and that nothing loads code or pickles
from an untrusted path.

Closed by default: every process of the embedded runtime (the driver's core worker, GCS,
raylet, workers and engine actors with their vLLM processes, the runtime-env agent, the
autoscaler's metrics server) listens on loopback only, and Ray's token authentication is on
with a fresh per-process token (unless ``RAY_AUTH_MODE`` is set): a local process without
the token cannot join. The dashboard and the Ray Client server are not started.
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.reliability import repo_root

PROBE = textwrap.dedent("""
    import json, os, subprocess, sys
    import psutil
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
        os.environ.pop(k, None)  # as a user who set nothing
    from teola_plugin.runtime.runtime import Runtime, default_engine_specs
    rt = Runtime({"embedder": default_engine_specs()["embedder"]}).start()
    rt.run_sync(rt.start_engines("embedder"), timeout=300)  # an engine actor listens too
    import ray
    gcs = ray.get_runtime_context().gcs_address
    me = psutil.Process()
    mine = {me.pid} | {p.pid for p in me.children(recursive=True)}  # Ray's processes are ours
    listening = sorted({(c.laddr.ip, c.laddr.port) for c in psutil.net_connections("tcp")
                        if c.status == "LISTEN" and c.pid in mine})
    # A local process joins the loopback node as the runtime started it (multi-node off)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")},
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    joins = {}
    for name, extra in {"no token": {"RAY_AUTH_MODE": "disabled"},
                        "wrong token": {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},
                        "the token": {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.environ["RAY_AUTH_TOKEN"]}}.items():
        r = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address={gcs!r}); print('JOINED')"],
                           env={**env, **extra}, capture_output=True, text=True, timeout=240)
        joins[name] = "JOINED" in r.stdout
    print(json.dumps({"cluster_env": os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"),
                      "mode": os.environ["RAY_AUTH_MODE"], "token_len": len(os.environ.get("RAY_AUTH_TOKEN", "")),
                      "node_ip": ray.nodes()[0]["NodeManagerAddress"], "listening": listening, "joins": joins,
                      "token_file": os.path.exists(os.path.expanduser("~/.ray/auth_token"))}))
    rt.shutdown()
""")


def beyond_loopback(listening) -> list:
    return [(ip, port) for ip, port in listening if not ipaddress.ip_address(ip).is_loopback
            and not (ip.startswith("::ffff:") and ipaddress.ip_address(ip[7:]).is_loopback)]


@pytest.mark.slow
def test_embedded_ray_listens_on_loopback_only_requires_a_token_and_opens_no_dashboard_or_client_port():
    import json

    had_token_file = os.path.exists(os.path.expanduser("~/.ray/auth_token"))
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600, cwd=repo_root())
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    print(report)
    assert report["mode"] == "token" and report["token_len"] == 64
    # others cannot use the ports; with the token one can (so the refusals are the token's doing)
    assert report["joins"] == {"no token": False, "wrong token": False, "the token": True}
    ports = {port for _, port in report["listening"]}
    assert 8265 not in ports and 10001 not in ports  # no dashboard, no Ray Client server
    # GCS, raylet, driver, workers, the engine actor, runtime-env agent, metrics: all of them
    assert len(report["listening"]) >= 6 and beyond_loopback(report["listening"]) == []
    assert report["node_ip"] == "127.0.0.1"
    assert report["cluster_env"] is None  # the start-up switch is not left in the user's environment
    assert report["token_file"] == had_token_file  # the token lives in memory, not on disk


@pytest.mark.slow
def test_the_test_sessions_runtime_with_every_engine_listens_on_loopback_only(runtime):
    """The session's runtime: vLLM (its engine processes too), embedder, stores, reranker."""
    import psutil

    me = psutil.Process()
    mine = {me.pid} | {p.pid for p in me.children(recursive=True)}
    listening = sorted({(c.laddr.ip, c.laddr.port) for c in psutil.net_connections("tcp")
                        if c.status == "LISTEN" and c.pid in mine})
    assert len(listening) >= 6, listening  # Ray's servers, the driver and the engine actors
    assert beyond_loopback(listening) == []


RISKY = re.compile(r"\b(pickle\.loads?|cloudpickle\.loads?|torch\.load|joblib\.load|dill\.loads?|marshal\.loads|"
                   r"shelve\.open|eval\(|exec\(|trust_remote_code\s*=\s*True|__import__\()")


# The one unpickling allowed: an engine actor's direct channel reads frames only from a peer
# that presented the actor's secret (handed out over Ray), the trust Ray's own serialization
# between its processes has; tests/test_engine_channel.py sends a pickle that would write a
# file from a connection without the secret, and no file appears.
PEER_FRAMES = ("src/teola_plugin/runtime/engine_channel.py", "return call_id, pickle.loads(body)")


def test_the_library_never_unpickles_evals_or_trusts_remote_code():
    """Models load from safetensors; engine classes are imported by the "module:Class" name
    the user configured (EngineSpec), never from a path found in data."""
    found = []
    for path in (repo_root() / "src" / "teola_plugin").rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if RISKY.search(code) and ".eval()" not in code:
                found.append(f"{path.relative_to(repo_root())}:{n}: {line.strip()}")
    assert [f for f in found if not (f.startswith(PEER_FRAMES[0]) and f.endswith(PEER_FRAMES[1]))] == []
    assert len(found) == 1, found  # the channel's frame reader, the one allowed
