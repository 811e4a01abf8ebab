"""Where and how wide a distributed batch engine runs (`--address`, `--workers`, `--gpus-per-worker`), each value
checked here, once, before anything starts or is written."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ootd.errors import UsageError

AUTO = "auto"  # the cluster this machine belongs to (`ray start` ran here)
CLIENT_SCHEME = "ray://"  # Ray Client addresses: ray://HOST:PORT


@dataclass(frozen=True)
class ClusterOptions:
    """Where and how wide a distributed engine runs (the local engine ignores these)."""

    address: str | None = None  # None: start a private instance on this machine; "auto" or HOST:PORT: join one
    workers: int | None = None  # None: one per GPU the cluster has (one on a machine without GPUs)
    gpus_per_worker: float | None = None  # None: 1 when the cluster has GPUs, else 0 (CPU workers)
    retries: int = 2  # how many times a pair whose worker died is tried again before it is reported as an error

    def validate(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise UsageError.about("workers", "{@workers} must be at least 1, got {value}", value=self.workers)
        gpus = self.gpus_per_worker
        if gpus is not None and (not math.isfinite(gpus) or gpus < 0):
            raise UsageError.about("gpus_per_worker", "{@gpus_per_worker} must be a number of GPUs, 0 or more (e.g. 1 "
                                   "or 0.5), got {value}", value=gpus)
        if self.retries < 0:
            raise UsageError(f"retries must be 0 or more, got {self.retries}")
        self.endpoint()

    def endpoint(self) -> tuple[str, int] | None:
        """(host, port) of an address given as HOST:PORT (or ray://HOST:PORT); None for none or `auto`. A
        malformed address is a usage error."""
        address = self.address
        if address is None or address.strip().lower() == AUTO:
            return None
        text = address.strip()
        if text.lower().startswith(CLIENT_SCHEME):
            text = text[len(CLIENT_SCHEME):]
        host, _, port = text.rpartition(":")
        if host.startswith("[") and host.endswith("]"):  # an IPv6 address: [::1]:6379
            host = host[1:-1]
        elif ":" in host:
            host = ""
        plain = host and not any(c.isspace() or c in "/?#@[]" for c in host)
        if not plain or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError.about("address", "bad {@address} {value!r}: use auto or HOST:PORT (e.g. 10.0.0.5:6379, "
                                   "the head's GCS port), or ray://HOST:PORT", value=address)
        return host, int(port)
