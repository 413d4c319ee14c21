"""Crash-to-restart latency of a TrainingTask's attempts, read from its attempt pods.

tasks.sh (the device-plugin path) and dra.sh (the DRA path) both report it: for each attempt after
the first, the previous attempt's container `finishedAt` to this attempt's container `startedAt`
(running, or already terminated). Whole-second timestamps, as the kubelet reports them.
"""

import datetime


def _seconds(stamp):
    if not stamp:
        return None
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _container_times(pod):
    """(startedAt, finishedAt) of the pod's first container that has them, in seconds."""
    for c in (pod or {}).get("status", {}).get("containerStatuses", []):
        state = c.get("state", {})
        current = state.get("running") or state.get("terminated") or {}
        started = _seconds(current.get("startedAt"))
        finished = _seconds((state.get("terminated") or {}).get("finishedAt"))
        if started or finished:
            return started, finished
    return None, None


def restart_latencies(attempts, pods_by_name):
    """Seconds from each crashed attempt's container end to the next attempt's container start,
    for every consecutive pair whose pods show both."""
    out = []
    for prev, nxt in zip(attempts, attempts[1:]):
        _, finished = _container_times(pods_by_name.get(prev.get("pod", "")))
        started, _ = _container_times(pods_by_name.get(nxt.get("pod", "")))
        if finished and started:
            out.append(started - finished)
    return out


def describe(latencies):
    """`2 s, 3 s`, or `not observed`."""
    return ", ".join(f"{x:.0f} s" for x in latencies) or "not observed"
