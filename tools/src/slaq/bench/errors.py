"""Errors of the benchmark, one tree:

    BenchError                  anything the benchmark refuses, with what to fix
    ├── TraceError              a trace file that cannot be read (path, row, column named)
    ├── ProfileError            a pool profile (step-time model parameters) that does not validate
    ├── WorkloadError           workload options that make no sense (mix, load, request count)
    ├── PolicyUnavailable       a policy name that is unknown or whose implementation is not importable
    ├── SimulationError         the simulated engine reached a state it cannot leave
    └── LiveError               the live benchmark could not talk to the endpoint
"""

from __future__ import annotations


class BenchError(Exception):
    """Base of every error the benchmark raises on purpose."""


class TraceError(BenchError):
    pass


class ProfileError(BenchError):
    pass


class WorkloadError(BenchError):
    pass


class PolicyUnavailable(BenchError):
    pass


class SimulationError(BenchError):
    pass


class LiveError(BenchError):
    pass
