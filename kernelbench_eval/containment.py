"""The sandbox's records: what the harness asks of a candidate's worker (`SandboxSpec`), what held around it
(`SandboxRecord`), and which attack classes each layer stops (`CONTAINMENT`).

One job apart from `records`: `isolation.sandbox` makes and reads these; a verdict or build record only carries
the `SandboxRecord` it was handed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

# attack class -> the record's layers, any one of which stops it where it held (see sandbox.py, README)
CONTAINMENT: dict[str, tuple[str, ...]] = {
    "signals": ("landlock_scopes", "seccomp_signals"),  # SIGSTOP/SIGKILL of the checker, the harness, others
    "scheduling": ("seccomp",),  # sched_setaffinity, setpriority, prlimit... of another process
    "memory": ("landlock_fs", "caps_dropped"),  # /proc/<pid>/mem of the checker, the harness, others
    "ptrace": ("seccomp", "landlock_fs", "caps_dropped"),
    "writes": ("landlock_fs",),  # results, caches, baselines, other candidates' folders
    "network": ("netns",),  # Landlock's TCP rules alone leave UDP open
    "survival": ("cgroup",),  # a daemon outliving its evaluation
}


class SandboxSpec(BaseModel):
    """What the harness asks of a candidate's worker: the layers to apply and where it may write."""

    writable: list[str] = Field(default_factory=list)
    cuda: Literal["none", "init", "context"] = "none"  # initialised before Landlock and seccomp
    layers: list[str] = Field(default_factory=list)  # of sandbox.LAYERS


class SandboxRecord(BaseModel):
    """What held around a candidate's processes (every worker that ran its code in this run)."""

    cgroup: bool = False  # a cgroup v2 leaf of its own, killed whole when its work ended
    netns: bool = False  # a network namespace of its own, with no interface up
    caps_dropped: bool = False  # no capability left, none regained by exec
    no_new_privs: bool = False
    landlock_abi: int = 0
    landlock_fs: bool = False  # writes only to its own folders; ptrace and /proc/<pid>/mem confined
    landlock_net: bool = False  # TCP bind and connect refused
    landlock_scopes: bool = False  # signals and abstract unix sockets confined to its own processes
    landlock_all_threads: bool = False  # also on threads CUDA started before it (Landlock ABI 8)
    seccomp: bool = False
    seccomp_signals: bool = False  # signals to other processes refused by seccomp (no Landlock scopes)
    missing: dict[str, str] = Field(default_factory=dict)  # layer -> why it did not hold
    contained: list[str] = Field(default_factory=list)  # attack classes a held layer stops (CONTAINMENT)
    uncontained: list[str] = Field(default_factory=list)

    def settle(self) -> SandboxRecord:
        """Fill `contained` and `uncontained` from the layers."""
        self.contained = [c for c, layers in CONTAINMENT.items() if any(getattr(self, n) for n in layers)]
        self.uncontained = [c for c in CONTAINMENT if c not in self.contained]
        return self

    def weakest(self, other: SandboxRecord | None) -> SandboxRecord:
        """What held in both this worker and `other` (a candidate's build and its evaluation)."""
        if other is None:
            return self
        merged = {name: getattr(self, name) and getattr(other, name)
                  for name, field in SandboxRecord.model_fields.items() if field.annotation in (bool, "bool")}
        return SandboxRecord(**merged, landlock_abi=min(self.landlock_abi, other.landlock_abi),
                             missing=other.missing | self.missing).settle()
