"""The last metre of the real-node run (lastmetre.sh): what each GPU container printed from inside
(its environment and the /dev/nvidia* nodes it has) against what carma assigned it, as the API server
has it (the pod's carma.io/assigned-gpus and carma.io/estimate annotations, the GpuNode's index of each
UUID). Run by lastmetre.sh; `python3 -m unittest lastmetre` runs its own tests.

The line a container prints (LM_PRINT in lastmetre.sh), one line, values without spaces:
    carma-last-metre env CARMA_ASSIGNED_GPUS=GPU-a NVIDIA_VISIBLE_DEVICES=void ... dev /dev/nvidia0 /dev/nvidiactl end

The line the stand-in memory-limit hook writes per call (LM_HOOK in lastmetre.sh), from the container's
OCI state and config:
    carma-hook args=apply-cuda-memory-limits id=<container id> request=<bytes> limit=<bytes>
"""

import copy
import json
import os
import re
import sys
import unittest

MARK = "carma-last-metre"
GPU_RESOURCE = "carma.io/gpu"
MIB = 1 << 20


def parse_inside(log):
    """(env, devices) from the container's last-metre line, or None when it printed none."""
    for line in (log or "").splitlines():
        words = line.split()
        if len(words) < 2 or words[0] != MARK or words[1] != "env":
            continue
        env, devs, part = {}, [], "env"
        for w in words[2:]:
            if w in ("dev", "end"):
                part = w
            elif part == "env" and "=" in w:
                k, v = w.split("=", 1)
                env[k] = v
            elif part == "dev":
                devs.append(w)
        return env, sorted(devs)
    return None


HOOK_MARK = "carma-hook"
HOOK_ARGS = "apply-cuda-memory-limits"


def parse_hook_log(text):
    """{container id: [{"args", "request", "limit"}]} from the stand-in hook's log."""
    out = {}
    for line in (text or "").splitlines():
        words = line.split()
        if not words or words[0] != HOOK_MARK:
            continue
        call = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        out.setdefault(call.get("id", ""), []).append(
            {"args": call.get("args", ""), "request": call.get("request", ""), "limit": call.get("limit", "")})
    return out


def container_id(pod, names):
    """The runtime's id of the pod's first started container among `names` ('' when none)."""
    for c in pod.get("status", {}).get("containerStatuses", []):
        if c["name"] in names and c.get("containerID"):
            return c["containerID"].split("://", 1)[-1]
    return ""


def judge_hook(rec, calls):
    """'' when the hook ran on the record's container with the values the container saw and the API's
    reservation as the request, else why not."""
    if not rec.get("cid"):
        return "no container id in the pod's status"
    mine = calls.get(rec["cid"], [])
    if not mine:
        return f"the hook never ran on container {rec['cid'][:12]}"
    env = (rec["inside"] or ({}, []))[0]
    want = {"args": HOOK_ARGS, "request": env.get("NVIDIA_GPU_MEMORY_REQUEST"),
            "limit": env.get("NVIDIA_GPU_MEMORY_LIMIT")}
    if rec["mib"] is not None and want["request"] != str(rec["mib"] * MIB):
        return f"request {want['request']!r} inside, reservation {rec['mib'] * MIB}"
    if any(c == want for c in mine):
        return ""
    return f"hook calls {mine}, container's {want}"


def hook_canary(rec, calls):
    """Whether a doctored hook record (its limit one MiB higher) is rejected."""
    if not rec.get("cid") or rec["cid"] not in calls:
        return False
    doctored = {rec["cid"]: [dict(c, limit=str(int(c["limit"] or 0) + MIB)) for c in calls[rec["cid"]]]}
    return bool(judge_hook(rec, doctored))


def gpu_index(gpunodes):
    """{node: {uuid: index}} from the GpuNodes (one per node, named after it)."""
    out = {}
    for g in gpunodes:
        out[g["metadata"]["name"]] = {x["uuid"]: x["index"] for x in g.get("status", {}).get("gpus", [])}
    return out


def gpu_containers(pod):
    """Names of the pod's containers that ask for carma.io/gpu."""
    return [c["name"] for c in pod["spec"]["containers"]
            if GPU_RESOURCE in (c.get("resources", {}).get("limits") or {})]


def records(pods, logs, gpunodes):
    """One record per GPU container that has run: the pod's assignment from the API and what the
    container printed. `logs` maps a pod name to its log text."""
    index = gpu_index(gpunodes)
    out = []
    for p in pods:
        names = gpu_containers(p)
        if not names or not p.get("spec", {}).get("nodeName"):
            continue
        started = [c for c in p.get("status", {}).get("containerStatuses", [])
                   if c["name"] in names and (c.get("state", {}).get("running") or c.get("state", {}).get("terminated"))]
        if not started:
            continue
        ann = p["metadata"].get("annotations", {})
        try:
            mib = json.loads(ann.get("carma.io/estimate", "{}")).get("mib")
        except ValueError:
            mib = None
        node = p["spec"]["nodeName"]
        out.append({
            "pod": f"{p['metadata']['namespace']}/{p['metadata']['name']}",
            "node": node,
            "assigned": [u for u in ann.get("carma.io/assigned-gpus", "").split(",") if u],
            "mib": mib,
            "index": index.get(node, {}),
            "inside": parse_inside(logs.get(p["metadata"]["name"], "")),
            "cid": container_id(p, names),
        })
    return out


def judge(rec):
    """'' when the container saw exactly its GPUs and reservation, else what differs."""
    if rec["inside"] is None:
        return "printed no last-metre line"
    env, devs = rec["inside"]
    bad = []
    if not rec["assigned"]:
        bad.append("no carma.io/assigned-gpus in the API")
    missing = [u for u in rec["assigned"] if u not in rec["index"]]
    if missing:
        bad.append(f"assigned {missing} not on {rec['node']}'s GpuNode")
    want_dev = sorted(f"/dev/nvidia{rec['index'][u]}" for u in rec["assigned"] if u in rec["index"])
    got_dev = sorted(d for d in devs if re.fullmatch(r"/dev/nvidia\d+", d))
    if got_dev != want_dev:
        bad.append(f"device nodes {got_dev}, assignment {want_dev}")
    if "/dev/nvidiactl" not in devs:
        bad.append("no /dev/nvidiactl (the spec's common edits)")
    if env.get("NVIDIA_VISIBLE_DEVICES") != "void":
        bad.append(f"NVIDIA_VISIBLE_DEVICES={env.get('NVIDIA_VISIBLE_DEVICES')!r}, the spec's 'void' not applied")
    if sorted(env.get("CARMA_ASSIGNED_GPUS", "").split(",")) != sorted(rec["assigned"]):
        bad.append(f"CARMA_ASSIGNED_GPUS={env.get('CARMA_ASSIGNED_GPUS')!r}, assignment {rec['assigned']}")
    mib = rec["mib"]
    if mib is None:
        bad.append("no carma.io/estimate in the API")
    else:
        if env.get("CARMA_RESERVED_MIB") != str(mib):
            bad.append(f"CARMA_RESERVED_MIB={env.get('CARMA_RESERVED_MIB')!r}, estimate {mib}")
        if env.get("NVIDIA_GPU_MEMORY_REQUEST") != str(mib * MIB):
            bad.append(f"NVIDIA_GPU_MEMORY_REQUEST={env.get('NVIDIA_GPU_MEMORY_REQUEST')!r}, estimate {mib * MIB}")
    limit = env.get("NVIDIA_GPU_MEMORY_LIMIT", "")
    if not limit.isdigit() or int(limit) <= 0 or int(limit) % MIB:
        bad.append(f"NVIDIA_GPU_MEMORY_LIMIT={limit!r}, not a positive whole number of MiB in bytes")
    return "; ".join(bad)


def canaries(recs):
    """Doctored copies of the first record that the comparison must reject: its assignment moved to
    another GPU of its node, and its reservation one MiB higher. [(what, rejected)]."""
    out = []
    if not recs:
        return out
    r = recs[0]
    other = [u for u in sorted(r["index"], key=r["index"].get) if u not in r["assigned"]]
    if other and r["assigned"]:
        d = copy.deepcopy(r)
        d["assigned"] = [other[0]] + d["assigned"][1:]
        out.append((f"{r['pod']} assigned {other[0]} instead of {r['assigned'][0]}", bool(judge(d))))
    if r["mib"] is not None:
        d = copy.deepcopy(r)
        d["mib"] = r["mib"] + 1
        out.append((f"{r['pod']} reservation {r['mib'] + 1} MiB instead of {r['mib']}", bool(judge(d))))
    return out


def quantity_mib(q):
    """A Kubernetes quantity of memory (7Gi, 7168Mi, bytes) in MiB, or None."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", str(q or ""))
    if not m:
        return None
    n = int(m.group(1)) * {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}[m.group(2)]
    return n // MIB if n % MIB == 0 else None


def dra_records(items, slices, logs, driver):
    """One record per pod with a claim of `driver`: the UUID of each device its claim was allocated
    (the ResourceSlice's uuid attribute) and the memory it consumes, and what the container printed."""
    uuid = {}
    for sl in slices:
        if sl["spec"].get("driver") != driver:
            continue
        for d in sl["spec"].get("devices", []):
            uuid[(sl["spec"]["pool"]["name"], d["name"])] = ((d.get("attributes") or {}).get("uuid") or {}).get("string")
    claims = {c["metadata"]["name"]: c for c in items if c["kind"] == "ResourceClaim"}
    out = []
    for p in items:
        if p["kind"] != "Pod" or p["metadata"]["name"] not in logs:
            continue
        results = []
        for st in p.get("status", {}).get("resourceClaimStatuses", []):
            c = claims.get(st.get("resourceClaimName") or "", {})
            results += [r for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
                        if r.get("driver") == driver]
        mibs = {quantity_mib((r.get("consumedCapacity") or {}).get("memory")) for r in results}
        out.append({
            "pod": f"{p['metadata']['namespace']}/{p['metadata']['name']}",
            "node": p["spec"].get("nodeName"),
            "assigned": [uuid.get((r["pool"], r["device"])) for r in results],
            "mib": max(mibs) if mibs and None not in mibs else None,
            "inside": parse_inside(logs[p["metadata"]["name"]]),
            "cid": container_id(p, [c["name"] for c in p["spec"].get("containers", [])]),
        })
    return out


def judge_dra(rec):
    """'' when a DRA container saw exactly its claim's GPUs and reservation through carma's per-claim CDI
    spec (env only: the chart's dra.nvidiaCdi is off, so no nvidia.com/gpu name and no device node)."""
    if rec["inside"] is None:
        return "printed no last-metre line"
    env, devs = rec["inside"]
    bad = []
    if not rec["assigned"] or None in rec["assigned"]:
        bad.append(f"claim's devices {rec['assigned']} without a UUID in the ResourceSlice")
    want = ",".join(sorted(u or "" for u in rec["assigned"]))
    for k in ("CARMA_ASSIGNED_GPUS", "NVIDIA_VISIBLE_DEVICES"):
        if ",".join(sorted(env.get(k, "").split(","))) != want:
            bad.append(f"{k}={env.get(k)!r}, claim {want}")
    if rec["mib"] is None:
        bad.append("no consumed memory in the claim's allocation")
    else:
        if env.get("CARMA_RESERVED_MIB") != str(rec["mib"]):
            bad.append(f"CARMA_RESERVED_MIB={env.get('CARMA_RESERVED_MIB')!r}, claim {rec['mib']}")
        if env.get("NVIDIA_GPU_MEMORY_REQUEST") != str(rec["mib"] * MIB):
            bad.append(f"NVIDIA_GPU_MEMORY_REQUEST={env.get('NVIDIA_GPU_MEMORY_REQUEST')!r}, claim {rec['mib'] * MIB}")
    limit = env.get("NVIDIA_GPU_MEMORY_LIMIT", "")
    if not limit.isdigit() or int(limit) <= 0 or int(limit) % MIB:
        bad.append(f"NVIDIA_GPU_MEMORY_LIMIT={limit!r}, not a positive whole number of MiB in bytes")
    nodes = [d for d in devs if re.fullmatch(r"/dev/nvidia[0-9]+", d)]
    if nodes:
        bad.append(f"device nodes {nodes} without an nvidia.com/gpu CDI name")
    return "; ".join(bad)


HOOK_NOTE = ("containerd ran the stand-in nvidia-cdi-hook with args apply-cuda-memory-limits on the container, "
             "and the NVIDIA_GPU_MEMORY_REQUEST/LIMIT of its OCI config equal what the container printed, the "
             "request its reservation; a stand-in (no driver, no NVML): what it would limit is not shown")


def read_hook_log(work):
    """The stand-in hook's calls copied to <work>/lm-hook.log (none when missing)."""
    path = os.path.join(work, "lm-hook.log")
    return parse_hook_log(open(path, errors="replace").read() if os.path.exists(path) else "")


def main_dra(argv):
    """argv: <work dir> <containerd version> <driver>; reads lm-dra.json (claims and pods), lm-dra-slices.json
    and lm-dra-logs/<pod>.log."""
    work, runtime, driver = argv
    items = json.load(open(os.path.join(work, "lm-dra.json")))["items"]
    slices = json.load(open(os.path.join(work, "lm-dra-slices.json")))["items"]
    logdir = os.path.join(work, "lm-dra-logs")
    logs = {f[:-4]: open(os.path.join(logdir, f), errors="replace").read() for f in os.listdir(logdir) if f.endswith(".log")}
    recs = dra_records(items, slices, logs, driver)
    verdicts = [(r, judge_dra(r)) for r in recs]
    good = [r for r, v in verdicts if not v]
    calls = read_hook_log(work)
    hooked = [(r, judge_hook(r, calls)) for r in recs]
    cans = []
    if recs and recs[0]["assigned"]:
        d = copy.deepcopy(recs[0])
        d["assigned"] = ["GPU-00000000-0000-0000-0000-000000000000"]
        cans.append(bool(judge_dra(d)))
        d = copy.deepcopy(recs[0])
        d["mib"] = (d["mib"] or 0) + 1
        cans.append(bool(judge_dra(d)))
        cans.append(hook_canary(recs[0], calls))
    ex = (f" (e.g. {good[0]['pod']} on {good[0]['node']}: {','.join(good[0]['assigned'])}, {good[0]['mib']} MiB)"
          if good else "")
    print(f"last-metre DRA: {len(good)} of {len(recs)} containers saw exactly their claim's GPU and reservation "
          f"(CDI spec gpu.carma.io/claim via containerd {runtime}), "
          f"{sum(1 for _, v in hooked if not v)} memory limits applied by the hook{ex}: CARMA_ASSIGNED_GPUS and NVIDIA_VISIBLE_DEVICES "
          f"= the UUID of the device in the claim's allocation (its ResourceSlice), CARMA_RESERVED_MIB and "
          f"NVIDIA_GPU_MEMORY_REQUEST = its consumed memory; device nodes: none (the chart's dra.nvidiaCdi is off, "
          f"so no nvidia.com/gpu name reaches the runtime); the hook: {HOOK_NOTE}; "
          f"canaries caught {sum(cans)} of {len(cans)}")
    for r, v in verdicts:
        if v:
            print(f"  last-metre DRA: {r['pod']} on {r['node']}: {v}")
    for r, v in hooked:
        if v:
            print(f"  last-metre DRA hook: {r['pod']} on {r['node']}: {v}")
    return 0 if (recs and len(good) == len(recs) and not any(v for _, v in hooked)
                 and len(cans) == 3 and all(cans)) else 1


def main(argv):
    """argv: <work dir> <containerd version> <dra field>; reads lm-pods.json, lm-gpunodes.json,
    lm-logs/<pod>.log and lm-refused.json from the work directory."""
    work, runtime, dra = argv
    pods = json.load(open(os.path.join(work, "lm-pods.json")))
    gpunodes = json.load(open(os.path.join(work, "lm-gpunodes.json")))["items"]
    logdir = os.path.join(work, "lm-logs")
    logs = {f[:-4]: open(os.path.join(logdir, f), errors="replace").read()
            for f in os.listdir(logdir) if f.endswith(".log")}
    recs = records(pods, logs, gpunodes)
    verdicts = [(r, judge(r)) for r in recs]
    good = [r for r, v in verdicts if not v]
    cans = canaries(recs)
    calls = read_hook_log(work)
    hooked = [(r, judge_hook(r, calls)) for r in recs]
    if recs:
        cans.append((f"{recs[0]['pod']}'s hook call with its limit 1 MiB higher", hook_canary(recs[0], calls)))
    refused = json.load(open(os.path.join(work, "lm-refused.json")))
    adm_path = os.path.join(work, "admission.json")  # admission.sh's figures, read from the API server
    adm = json.load(open(adm_path)) if os.path.exists(adm_path) else None
    admission = (f"{adm['steered']} pods steered and {adm['refused']} refused at admission, "
                 f"{adm['otherScheduler']} placed by another scheduler" if adm else "admission not run")
    oc_path = os.path.join(work, "lm-overcommit.json")  # the over-commit watcher's report so far
    oc = json.load(open(oc_path)) if os.path.exists(oc_path) else None
    overcommit = (f"{len(oc['findings'])} over-committed GPUs in {oc['checks']} checks" if oc
                  else "over-commit not judged (no watcher report)")
    per = [f"{r['pod']} on {r['node']}: {','.join(r['assigned'])} -> "
           f"{' '.join(d for d in r['inside'][1] if re.fullmatch(r'/dev/nvidia[0-9]+', d))}"
           for r in good]
    example = f" (e.g. {per[0]})" if per else ""
    if refused.get("refused"):
        ref = (f"yes (pod {refused['pod']} on {refused['node']}, CDI name {refused['name']} not in its spec: "
               f"{refused['reason']} {refused['message'][:160]!r})")
    else:
        ref = f"NO ({refused.get('why', 'the pod was not refused')})"
    print(f"last-metre: {len(good)} of {len(recs)} containers saw exactly their GPUs and reservation "
          f"(CDI via containerd {runtime}), {sum(1 for _, v in hooked if not v)} memory limits applied by the hook, "
          f"{admission}, {overcommit}: "
          f"each had /dev/nvidia<index> of its assigned UUIDs only{example}, "
          f"injected from its node's stand-in nvidia.com/gpu spec by the CDI names of Allocate, and the spec's "
          f"common /dev/nvidiactl, /dev/nvidia-uvm and NVIDIA_VISIBLE_DEVICES=void; CARMA_ASSIGNED_GPUS, "
          f"CARMA_RESERVED_MIB and NVIDIA_GPU_MEMORY_REQUEST/LIMIT (bytes) equal to the API's assignment "
          f"and estimate; "
          f"canaries caught {sum(1 for _, c in cans if c)} of {len(cans)} ({'; '.join(w for w, _ in cans)}); "
          f"unresolvable CDI name refused: {ref}; "
          f"the hook: {HOOK_NOTE}; DRA containers: {dra}")
    for r, v in verdicts:
        if v:
            print(f"  last-metre: {r['pod']} on {r['node']}: {v}")
    for r, v in hooked:
        if v:
            print(f"  last-metre hook: {r['pod']} on {r['node']}: {v}")
    ok = (len(recs) >= 3 and len(good) == len(recs) and not any(v for _, v in hooked)
          and len(cans) == 3 and all(c for _, c in cans) and refused.get("refused")
          and (adm is None or (adm["steered"] >= 1 and adm["refused"] >= 1 and adm["otherScheduler"] == 0))
          and oc is not None and oc["checks"] > 0 and not oc["findings"])
    for f in (oc or {}).get("findings", []):
        print(f"  last-metre over-commit: {f['id']}: {f['detail']} (first seen {f['first']})")
    return 0 if ok else 1


class Tests(unittest.TestCase):
    def rec(self, **kw):
        r = {"pod": "default/p", "node": "n1", "assigned": ["GPU-b"], "mib": 2000,
             "index": {"GPU-a": 0, "GPU-b": 1},
             "inside": ({"NVIDIA_VISIBLE_DEVICES": "void", "CARMA_ASSIGNED_GPUS": "GPU-b",
                         "CARMA_RESERVED_MIB": "2000", "NVIDIA_GPU_MEMORY_REQUEST": str(2000 * MIB),
                         "NVIDIA_GPU_MEMORY_LIMIT": str(2000 * MIB)}, ["/dev/nvidia1", "/dev/nvidiactl"])}
        r.update(kw)
        return r

    def test_parse(self):
        env, devs = parse_inside("x\ncarma-last-metre env A=1 B=x=y dev /dev/nvidia1 /dev/nvidiactl end\n")
        self.assertEqual(env, {"A": "1", "B": "x=y"})
        self.assertEqual(devs, ["/dev/nvidia1", "/dev/nvidiactl"])
        self.assertIsNone(parse_inside("hello"))
        self.assertEqual(parse_inside("carma-last-metre env dev end"), ({}, []))

    def test_judge(self):
        self.assertEqual(judge(self.rec()), "")
        self.assertIn("device nodes", judge(self.rec(inside=(self.rec()["inside"][0], ["/dev/nvidia0", "/dev/nvidiactl"]))))
        self.assertIn("void", judge(self.rec(inside=(dict(self.rec()["inside"][0], NVIDIA_VISIBLE_DEVICES="GPU-b"),
                                                     self.rec()["inside"][1]))))
        self.assertIn("CARMA_RESERVED_MIB", judge(self.rec(mib=2001)))
        self.assertIn("no last-metre", judge(self.rec(inside=None)))
        self.assertIn("not on", judge(self.rec(assigned=["GPU-z"])))

    def test_dra(self):
        items = [
            {"kind": "ResourceClaim", "metadata": {"name": "c1"}, "status": {"allocation": {"devices": {"results": [
                {"driver": "gpu.carma.io", "pool": "n1", "device": "gpu-1", "consumedCapacity": {"memory": "7Gi"}}]}}}},
            {"kind": "Pod", "metadata": {"name": "p", "namespace": "default"}, "spec": {"nodeName": "n1"},
             "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c1"}]}}]
        slices = [{"spec": {"driver": "gpu.carma.io", "pool": {"name": "n1"}, "devices": [
            {"name": "gpu-1", "attributes": {"uuid": {"string": "GPU-b"}}}]}}]
        env = {"CARMA_ASSIGNED_GPUS": "GPU-b", "NVIDIA_VISIBLE_DEVICES": "GPU-b", "CARMA_RESERVED_MIB": "7168",
               "NVIDIA_GPU_MEMORY_REQUEST": str(7168 * MIB), "NVIDIA_GPU_MEMORY_LIMIT": str(7168 * MIB)}
        line = "carma-last-metre env " + " ".join(f"{k}={v}" for k, v in env.items()) + " dev end"
        recs = dra_records(items, slices, {"p": line}, "gpu.carma.io")
        self.assertEqual(len(recs), 1)
        self.assertEqual(judge_dra(recs[0]), "")
        self.assertIn("CARMA_RESERVED_MIB", judge_dra(dict(recs[0], mib=7169)))
        self.assertIn("claim", judge_dra(dict(recs[0], assigned=["GPU-a"])))
        self.assertEqual(quantity_mib("7Gi"), 7168)
        self.assertIsNone(quantity_mib("1.5Gi"))

    def test_hook(self):
        log = ("noise\ncarma-hook args=apply-cuda-memory-limits id=c1 request=%d limit=%d\n"
               "carma-hook args=apply-cuda-memory-limits id=c2 request=1 limit=2\n") % (2000 * MIB, 2000 * MIB)
        calls = parse_hook_log(log)
        self.assertEqual(sorted(calls), ["c1", "c2"])
        self.assertEqual(judge_hook(self.rec(cid="c1"), calls), "")
        self.assertIn("never ran", judge_hook(self.rec(cid="c3"), calls))
        self.assertIn("container id", judge_hook(self.rec(cid=""), calls))
        self.assertIn("hook calls", judge_hook(self.rec(cid="c2"), calls))
        wrong = parse_hook_log(log.replace("limit=%d" % (2000 * MIB), "limit=%d" % (2001 * MIB)))
        self.assertIn("hook calls", judge_hook(self.rec(cid="c1"), wrong))
        skipped = parse_hook_log(log.replace("args=apply-cuda-memory-limits id=c1", "args= id=c1"))
        self.assertIn("hook calls", judge_hook(self.rec(cid="c1"), skipped))
        self.assertTrue(hook_canary(self.rec(cid="c1"), calls))
        self.assertFalse(hook_canary(self.rec(cid="c3"), calls))
        pod = {"status": {"containerStatuses": [{"name": "x", "containerID": "containerd://abc"}]}}
        self.assertEqual(container_id(pod, ["x"]), "abc")
        self.assertEqual(container_id(pod, ["y"]), "")

    def test_canaries(self):
        cans = canaries([self.rec()])
        self.assertEqual(len(cans), 2)
        self.assertTrue(all(c for _, c in cans))


if __name__ == "__main__":
    if sys.argv[1:2] == ["dra"]:
        sys.exit(main_dra(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
