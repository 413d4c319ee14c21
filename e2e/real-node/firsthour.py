#!/usr/bin/env python3
"""A user's first hour, from the docs: the marked command blocks of README.md and charts/carma/README.md.

    firsthour.py list FILE...          # every marked block's commands, in order, with their marks
    firsthour.py run WORK FILE...      # run them (firsthour.sh, inside the real-node run)
    firsthour.py scan                  # every carma object in the cluster, as JSON lines

A fenced block is marked by an HTML comment on the line before it (markdown does not render it):

    <!-- first-hour: run -->          each command of the block is run, verbatim, in this order
    <!-- first-hour: skip: REASON -->  not run here; the reason is printed

In a `bash`/`sh` block every line is a command (a trailing backslash continues it; comment lines are
skipped; a trailing comment goes to bash with the command). In a `console` block, `$ ` starts a
command and the lines after it, up to the next `$ `, are the output the docs show: the command's
output must match them (runs of spaces are one space; `…` stands for any text). A command that exits
non-zero fails. Each file is one pass (its own install to uninstall), run in the order given.
"""
import json
import os
import re
import subprocess
import sys
import time

MARK = re.compile(r"^<!--\s*first-hour:\s*(run|skip)(?::\s*(.*?))?\s*-->\s*$")


def blocks(path):
    """(mark, reason, lang, first line, [lines]) of each marked fenced block, and unmarked command blocks."""
    lines = open(path).read().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)", lines[i])
        if not m:
            i += 1
            continue
        lang, start, body = m.group(1), i + 1, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        prev = lines[start - 2] if start >= 2 else ""
        mk = MARK.match(prev)
        out.append((mk.group(1) if mk else None, (mk.group(2) or "") if mk else "", lang, start, body))
    return out


def commands(lang, body):
    """[(command, expected output lines or None)] of a block."""
    cmds = []
    if lang == "console":
        for line in body:
            if line.startswith("$ "):
                cmds.append([line[2:], []])
            elif cmds:
                cmds[-1][1].append(line)
        return [(c, e) for c, e in cmds]
    cur = ""
    for line in body:
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur += line
        if line.endswith("\\"):
            cur += "\n"
            continue
        cmds.append((cur, None))
        cur = ""
    if cur:
        cmds.append((cur, None))
    return cmds


def plan(paths):
    """Every marked command of the files, in order, and every command block left unmarked."""
    steps, unmarked = [], []
    for p in paths:
        rel = os.path.relpath(p, os.environ.get("ROOT", "."))
        for mark, reason, lang, line, body in blocks(p):
            if lang not in ("bash", "sh", "console"):
                continue
            if mark is None:
                unmarked.append(f"{rel}:{line}")
                continue
            for cmd, expected in commands(lang, body):
                steps.append({"file": rel, "line": line, "mark": mark, "reason": reason,
                              "cmd": cmd, "expected": expected})
    return steps, unmarked


def matches(expected, actual):
    """The docs' output against the command's: blank lines dropped, runs of spaces one space, `…` any
    text (a line that is only `…`, any number of lines)."""
    def line_pat(e):
        e = re.sub(r"\s*…\s*", "…", e.strip())
        return "".join(".*" if t == "…" else r"\s+" if t.isspace() else re.escape(t)
                       for t in re.split(r"(…|\s+)", e) if t)
    pats = [r"(?:[^\n]*\n)*" if e.strip() == "…" else line_pat(e) + r"\n" for e in expected if e.strip()]
    act = "".join(l.strip() + "\n" for l in actual.splitlines() if l.strip())
    return re.fullmatch("".join(pats), act) is not None


GROUP_SKIP = {"events", "events.events.k8s.io", "bindings", "componentstatuses", "tokenreviews.authentication.k8s.io"}


def scan():
    """Every object that is carma's: group carma.io, in namespace carma-system, named carma*, labelled or
    annotated carma.io/*, app.kubernetes.io/{name,instance,part-of}=carma, owned by a carma kind, or a
    ResourceSlice of carma's DRA driver. Events are not counted (they expire on their own)."""
    kc = os.environ["KUBECTL"]
    kinds = subprocess.run([kc, "api-resources", "--verbs=list", "-o", "name"], capture_output=True,
                           text=True, check=True).stdout.split()
    kinds = [k for k in kinds if k not in GROUP_SKIP]
    r = subprocess.run([kc, "get", ",".join(kinds), "-A", "-o", "json"], capture_output=True, text=True)
    items = json.loads(r.stdout)["items"] if r.returncode == 0 else []
    if r.returncode != 0:  # one kind the server cannot list: ask kind by kind
        for k in kinds:
            r = subprocess.run([kc, "get", k, "-A", "-o", "json"], capture_output=True, text=True)
            if r.returncode == 0:
                items += json.loads(r.stdout)["items"]
    out = []
    for o in items:
        md = o.get("metadata", {})
        labels, ann = md.get("labels") or {}, md.get("annotations") or {}
        why = None
        if o.get("apiVersion", "").split("/")[0].endswith("carma.io"):
            why = "carma.io kind"
        elif md.get("namespace") == "carma-system":
            why = "in carma-system"
        elif "carma" in md.get("name", "") and o.get("kind") != "Node":
            why = "named carma"
        elif any(labels.get(k) == "carma" for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/part-of")):
            why = "carma's labels"
        elif o.get("kind") != "Node" and any(k.startswith("carma.io/") for k in list(labels) + list(ann)):
            why = "carma.io/ label or annotation"
        elif any(r.get("apiVersion", "").startswith("carma.io/") for r in md.get("ownerReferences") or []):
            why = "owned by a carma object"
        elif o.get("kind") == "ResourceSlice" and o.get("spec", {}).get("driver") == "gpu.carma.io":
            why = "carma's DRA driver"
        if why:
            out.append({"kind": o.get("kind"), "namespace": md.get("namespace", ""), "name": md.get("name"),
                        "uid": md.get("uid"), "why": why})
    return out


def run(work, paths):
    steps, unmarked = plan(paths)
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(env["KUBECTL"]) + ":" + env["PATH"]
    plant = env.get("CARMA_RN_PLANT") == "firsthour"
    planted = False
    baseline = {o["uid"] for o in scan()}
    results, hooks = [], {"pending": None, "namespace": None}
    log = open(f"{work}/firsthour.log", "w")
    for s in steps:
        if s["mark"] == "skip":
            results.append({**s, "rc": None})
            continue
        cmd = s["cmd"]
        if plant and not planted and "placement.memoryMarginMiB" in cmd:
            cmd = cmd.replace("placement.memoryMarginMiB", "placement.memoryMarginMB")
            planted = True
            print(f"first-hour: PLANTED a wrong value key: {cmd}", flush=True)
        t0 = time.time()
        print(f"first-hour: $ {cmd}", flush=True)
        try:
            p = subprocess.run(["bash", "-c", cmd], cwd=env["ROOT"], env=env, capture_output=True, text=True,
                               timeout=300)
            rc, stdout, stderr = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, stdout, stderr = 124, e.stdout or "", (e.stderr or "") + "\n(timed out after 300 s)"
            stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
            stderr = stderr.decode() if isinstance(stderr, bytes) else stderr
        differs = s["expected"] is not None and not matches(s["expected"], stdout)
        log.write(f"==== {s['file']}:{s['line']} rc {rc} in {time.time() - t0:.1f} s\n$ {cmd}\n{stdout}{stderr}\n")
        log.flush()
        for line in (stdout + stderr).splitlines()[-6:]:
            print(f"first-hour:     {line[:200]}", flush=True)
        if rc != 0:
            print(f"first-hour: FAILED (exit {rc}) {s['file']}:{s['line']}", flush=True)
        if differs:
            print(f"first-hour: OUTPUT DIFFERS {s['file']}:{s['line']}: the docs show {s['expected']!r}", flush=True)
        results.append({**s, "cmd": cmd, "rc": rc, "differs": differs})
        # what the run observes between the documented commands
        if hooks["namespace"] is None and re.search(r"^helm install .*-n carma-system", cmd) and rc == 0:
            r = subprocess.run([env["KUBECTL"], "get", "namespace", "carma-system", "-o",
                                "jsonpath={.metadata.labels.pod-security\\.kubernetes\\.io/enforce}"],
                               capture_output=True, text=True)
            hooks["namespace"] = r.stdout.strip() or "unlabelled"
        if hooks["pending"] is None and cmd.startswith("kubectl describe tt resnet18-cifar100") and rc == 0:
            hooks["pending"] = pending(env)
        if re.match(r"kubectl delete namespace carma-system", cmd):
            hooks.setdefault("left", []).append(left_after(baseline, s["file"]))
    json.dump({"results": results, "unmarked": unmarked, "hooks": hooks, "planted": planted},
              open(f"{work}/firsthour.json", "w"), indent=1)


WHY = ("Unschedulable", "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError")

TOO_BIG = """apiVersion: carma.io/v1alpha1
kind: TrainingTask
metadata: {name: first-hour-unplaceable, namespace: default}
spec:
  gpus: 8
  gpuMemory: 1Gi
  template:
    spec:
      containers:
        - name: train
          image: busybox
          command: ["true"]
"""


def pending(env):
    """A TrainingTask no node can hold (8 GPUs on one node, where the simulated nodes have 4 GPUs and
    32 carma.io/gpu replicas, so kube-scheduler's own filters pass and carma's extender, reached by
    its Service's DNS name, refuses): seconds from its creation until its status says why it waits,
    and the reason and message it gives."""
    kc = env["KUBECTL"]
    # once the kubelets advertise the device plugins' replicas (their next node status after the
    # plugins registered), so that the scheduler's resource filter passes and carma's extender decides
    t0, alloc = time.time(), []
    while time.time() - t0 < 60:
        r = subprocess.run([kc, "get", "nodes", "-o", "jsonpath={.items[*].status.allocatable.carma\\.io/gpu}"],
                           capture_output=True, text=True)
        alloc = r.stdout.split()
        if alloc and all(int(a) >= 8 for a in alloc):
            break
        time.sleep(1)
    print(f"first-hour: nodes' allocatable carma.io/gpu {alloc}; a TrainingTask of 8 GPUs", flush=True)
    p = subprocess.run([kc, "create", "-f", "-"], input=TOO_BIG, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        return {"error": p.stderr.strip()}
    t0 = time.time()
    while time.time() - t0 < 120:
        r = subprocess.run([kc, "get", "trainingtask", "first-hour-unplaceable", "-n", "default", "-o", "json"],
                           capture_output=True, text=True)
        tt = json.loads(r.stdout) if r.returncode == 0 else {}
        st = tt.get("status", {})
        # the why: the scheduler's reason (Unschedulable) or kubelet's (operator/src/waiting.rs), which
        # the operator copies from the pod; WaitingForScheduler and NotScheduled only say it waits
        conds = [c for c in st.get("conditions", []) if c.get("status") == "False"
                 and c.get("reason") in WHY and c["type"] in ("Scheduled", "AttemptStarted")]
        if st.get("message") and conds:
            print(f"first-hour: first-hour-unplaceable (8 GPUs): phase {st.get('phase')}, condition "
                  f"{conds[0]['type']}={conds[0]['status']} reason {conds[0]['reason']}, message {st['message']!r}", flush=True)
            return {"seconds": round(time.time() - t0, 1), "phase": st.get("phase"), "reason": conds[0]["reason"],
                    "message": st["message"]}
        time.sleep(0.5)
    return {"error": f"no reason in 120 s (status {json.dumps(st)[:300]})"}


def left_after(baseline, file):
    """Carma objects the uninstall left (not there before the first command); waits up to 90 s for the
    garbage collector and the namespace controller."""
    t0 = time.time()
    while True:
        left = [o for o in scan() if o["uid"] not in baseline]
        if not left or time.time() - t0 > 90:
            break
        time.sleep(2)
    for o in left:
        print(f"first-hour: left after uninstall ({file}): {o['kind']} {o['namespace']}/{o['name']} ({o['why']})", flush=True)
    return {"file": file, "left": left, "waited": round(time.time() - t0, 1)}


if __name__ == "__main__":
    if sys.argv[1] == "list":
        steps, unmarked = plan(sys.argv[2:])
        for s in steps:
            print(f"{s['file']}:{s['line']} {s['mark']}{': ' + s['reason'] if s['reason'] else ''}: {s['cmd']}"
                  + (f"  => {s['expected']}" if s["expected"] is not None else ""))
        for u in unmarked:
            print(f"UNMARKED command block {u}")
        sys.exit(1 if unmarked else 0)
    elif sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3:])
    elif sys.argv[1] == "scan":
        for o in scan():
            print(json.dumps(o))
