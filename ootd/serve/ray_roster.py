"""Which replicas of `ootd serve --engine ray` run, for /api/health: from the replicas' own answers and Ray
Serve's public status, never from Ray's private modules (so a Ray upgrade cannot silently empty the list).

The roster is a small Ray actor (no CPU of its own) started with the deployment and handed to every replica.
Each replica reports itself - its id, node, process, start time, device words, the models it holds, its count
of try-ons - when it starts and at each of Ray Serve's health checks (every `health_check_period_s`), and says
goodbye when Serve stops it. The ingress reads the roster every REFRESH_S: a replica not heard from for
`ALIVE_PERIODS` health periods is listed as not alive (killed, its node lost), and left out after
`LISTED_PERIODS`; one whose request failed because it died is left out at once. `serve.status()` adds the
deployment's own status and its count of replicas per state.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

ALIVE_PERIODS = 2.5  # health periods without a report before a replica is said not to be alive
LISTED_PERIODS = 6.0  # ... and before it is left out of the list
SLACK_S = 1.0  # a busy node's report may be late by this much
READ_TIMEOUT_S = 5.0


class Roster:
    """What each replica last said of itself, and when (this actor's clock)."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self.heard: dict[str, tuple[float, dict[str, Any]]] = {}

    def report(self, about: dict[str, Any]) -> None:
        self.heard[about["replica"]] = (time.monotonic(), about)

    def gone(self, replica: str) -> None:
        self.heard.pop(replica, None)

    def replicas(self) -> list[dict[str, Any]]:
        """The replicas heard from lately, oldest first, each with `alive` and how long ago it was heard."""
        now, listed = time.monotonic(), []
        for replica, (when, about) in list(self.heard.items()):
            age = now - when
            if age > LISTED_PERIODS * self.period_s + SLACK_S:
                del self.heard[replica]
                continue
            listed.append({**about, "alive": age <= ALIVE_PERIODS * self.period_s + SLACK_S,
                           "heard_s_ago": round(age, 1)})
        return sorted(listed, key=lambda about: (about.get("started") or 0.0, about["replica"]))


def start_roster(ray: Any, period_s: float) -> Any:
    """The roster actor of one deployment (it goes with this process: not detached)."""
    return ray.remote(num_cpus=0, max_restarts=0)(Roster).remote(period_s)


def report(roster: Any, about: dict[str, Any]) -> None:
    """A replica's report, sent without waiting (a roster that is gone with its ingress is no replica's failure)."""
    if roster is not None:
        with contextlib.suppress(Exception):
            roster.report.remote(about)


def forget(roster: Any, replica: str) -> None:
    if roster is not None:
        with contextlib.suppress(Exception):
            roster.gone.remote(replica)


def list_replicas(ray: Any, roster: Any) -> list[dict[str, Any]]:
    """Each replica as health lists it: id, state, alive, node, process, start time, then what it reported."""
    heard = ray.get(roster.replicas.remote(), timeout=READ_TIMEOUT_S)
    return [{"id": about["replica"], "state": "RUNNING" if about["alive"] else "UNRESPONSIVE",
             "alive": about["alive"], "node_ip": about.get("node_ip"), "pid": about.get("pid"),
             "started": about.get("started"), "heard_s_ago": about["heard_s_ago"], "about": about}
            for about in heard]


def deployment_status(app: str, deployment: str) -> dict[str, Any] | None:
    """Ray Serve's public status of the deployment: its status and its replicas per state (None: not known)."""
    from ray import serve

    try:
        found = serve.status().applications.get(app)
        status = found.deployments.get(deployment) if found is not None else None
    except Exception:  # noqa: BLE001 - a controller busy replacing a replica answers next time
        return None
    if status is None:
        return None
    return {"status": str(getattr(status.status, "value", status.status)),
            "replicas": {str(getattr(state, "value", state)): count for state, count in status.replica_states.items()}}
