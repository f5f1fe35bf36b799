"""Starting Ray for a ``Runtime``: an embedded single-node instance closed to the network, or
a connection to a cluster the user names.

Embedded (``ray_address=None``): a new local instance with no dashboard, sized to this
machine, every Ray process listening on 127.0.0.1 only (:func:`loopback_node`), token
authentication on with a fresh per-process token unless ``RAY_AUTH_MODE`` says otherwise
(docs/reliability.md). A cluster address is checked for a listener first (``ray.init``
itself retries for about two minutes) and joined with authentication left to the cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
from collections.abc import Iterator

from ..errors import ConfigError


def check_reachable(address: str, timeout_s: float = 3.0) -> None:
    """Fail fast on an address nothing listens on: ray.init itself retries for ~2 minutes."""
    import socket

    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"ray_address must look like 'host:port', 'ray://host:port' or 'auto', got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(f"cannot reach the Ray cluster at {address!r}: {exc}") from exc


@contextlib.contextmanager
def loopback_node() -> Iterator[None]:
    """A Ray node whose every process listens on 127.0.0.1 only (measured: GCS, raylet,
    workers, the driver's core worker, the runtime-env agent, the autoscaler's metrics).

    Ray binds its servers to the node address, but on Linux it replaces a loopback
    ``_node_ip_address`` with the machine's address (``resolve_ip_for_localhost``: a node
    must be reachable by others) unless multi-node clusters are off
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``). An embedded runtime is one node, so they are
    turned off while it starts: in Ray's constants for this process, and in the environment
    its processes start with (set back afterwards; a user's own value wins)."""
    from ray._private import ray_constants

    name = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    before_env, before_const = os.environ.get(name), ray_constants.ENABLE_RAY_CLUSTER
    if before_env is None:
        os.environ[name] = "0"
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if before_env is None:
            os.environ.pop(name, None)
            ray_constants.ENABLE_RAY_CLUSTER = before_const


class _NoSignalHandlerNotice(logging.Filter):
    """Ray warns that it installs no SIGTERM handler when ``ray.init`` runs off the main
    thread, which is where a runtime started in the background (``TeolaExecutor()``) runs
    it. Nothing is lost without it: SIGTERM ends the process as it would any Python
    program, and Ray's own processes share the driver's fate."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("SIGTERM handler is not set")


_connecting = threading.Lock()  # runtimes start Ray on threads of their own: one check-then-init at a time


def connect_ray(ray_address: str | None) -> bool:
    """Start or join Ray for a runtime; True when this call started (or joined) it, so the
    runtime stops it at shutdown; False when this process was already connected (another
    runtime, even one starting at the same moment, or the user connected it)."""
    with _connecting:
        return _connect_ray(ray_address)


def _connect_ray(ray_address: str | None) -> bool:
    import ray

    worker_log = logging.getLogger("ray._private.worker")
    if not any(isinstance(f, _NoSignalHandlerNotice) for f in worker_log.filters):
        worker_log.addFilter(_NoSignalHandlerNotice())
    if ray_address is not None:
        check_reachable(ray_address)
    if ray.is_initialized():
        # One process joins one cluster: another Runtime (or the user) connected it.
        current = ray.get_runtime_context().gcs_address
        if ray_address not in (None, "auto") and ray_address.split("://")[-1] != current:
            raise ConfigError(f"this process is already connected to the Ray cluster at {current!r}; "
                              f"it cannot also join {ray_address!r}")
        return False
    if ray_address is None and "RAY_AUTH_MODE" not in os.environ:
        # Ray's gRPC servers listen on every interface whatever the node address, and
        # ray.init turns token authentication on for a new local cluster when the mode
        # is unset. The token: a fresh one per process, kept in this process's
        # environment (inherited by Ray's workers) rather than ~/.ray/auth_token.
        os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    elif ray_address is not None:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray_address is not None:
        try:
            ray.init(address=ray_address, ignore_reinit_error=True, log_to_driver=False)
        except Exception as exc:
            raise ConfigError(f"cannot connect to the Ray cluster at {ray_address!r}: {exc}") from exc
    else:
        # Embedded: a new local instance ("local": without it ray.init joins whatever
        # cluster `ray start` last left in /tmp/ray, someone else's included), no
        # dashboard, sized to the machine, every process on loopback only. Its workers at
        # the driver's priority: Ray's raylet starts them at nice 15, which suits tasks that
        # should yield, not engines that are the app's compute (any nice-0 process on the
        # host, the app's own model server included, would take their cores first).
        os.environ.setdefault("RAY_worker_niceness", "0")
        with loopback_node():
            ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
                     _node_ip_address="127.0.0.1", log_to_driver=False, ignore_reinit_error=True)
    return True
