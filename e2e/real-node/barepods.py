"""Checks the bare-pod step of the DRA run (bare.sh) from what it saved: the pods and claims, the
claim templates and slices as the API server listed them, and kubectl's output of the three creations.

usage: barepods.py <work dir> <driver> <memory> <dry-run memory>

Prints one `dra-admission:` line (and the faults, if any) and exits 1 unless every check holds. A
doctored copy of the records (the bare pod's claim consuming 1 GiB more than its template books) must
be rejected too, or the checker itself is not trusted.
"""

import copy
import json
import re
import sys

UNITS = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}


def qty(q):
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q))
    return int(float(m.group(1)) * UNITS[m.group(2)]) if m else None


def gpu_requests(pod):
    """Containers that still ask for carma.io/gpu."""
    out = []
    for c in pod["spec"].get("containers", []) + pod["spec"].get("initContainers", []):
        r = c.get("resources") or {}
        if any("carma.io/gpu" in (r.get(k) or {}) for k in ("limits", "requests")):
            out.append(c["name"])
    return out


def template_of(pod):
    claims = pod["spec"].get("resourceClaims") or []
    return claims[0].get("resourceClaimTemplateName") if len(claims) == 1 else None


def memory_of(template):
    req = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    return qty(((req.get("capacity") or {}).get("requests") or {}).get("memory", "0"))


def check(records, templates, driver, memory):
    """Faults of the bare pod's admission, and what it was given (for the summary)."""
    faults, seen = [], {}
    pods = {i["metadata"]["name"]: i for i in records if i["kind"] == "Pod"}
    claims = {i["metadata"]["name"]: i for i in records if i["kind"] == "ResourceClaim"}
    # Every bare pod the API server lists, and those it shows with a claim from an admission template.
    bare = [p for n, p in pods.items() if n.startswith("dra-bare")]
    seen["bare"] = len(bare)
    seen["claimed"] = sum(1 for p in bare if not gpu_requests(p) and (
        (templates.get(template_of(p)) or {}).get("metadata", {}).get("labels", {}).get("carma.io/made-by") == "admission"))
    pod = pods.get("dra-bare")
    if not pod:
        return ["the bare pod is not among the pods the API server listed"], seen
    if gpu_requests(pod):
        faults.append(f"containers {gpu_requests(pod)} still ask for carma.io/gpu")
    name = template_of(pod)
    seen["template"] = name
    if not name or not name.startswith(f"carma-gpu-g1-m{memory // 2**20}-"):
        faults.append(f"the pod's claim comes from template {name!r}, not carma-gpu-g1-m{memory // 2**20}-<hash>")
    try:
        estimate = json.loads((pod["metadata"].get("annotations") or {}).get("carma.io/estimate", "null"))
    except ValueError:
        estimate = None
    seen["estimate"] = estimate
    if not estimate or estimate.get("mib") != memory // 2**20:
        faults.append(f"carma.io/estimate is {estimate!r}, not {memory // 2**20} MiB")
    template = templates.get(name)
    if template is None:
        faults.append(f"no ResourceClaimTemplate {name!r} in the pod's namespace")
    else:
        labels = template["metadata"].get("labels") or {}
        if labels.get("carma.io/made-by") != "admission" or labels.get("app.kubernetes.io/managed-by") != "carma":
            faults.append(f"template {name} is not labelled as made by carma's admission: {labels}")
        if memory_of(template) != memory:
            faults.append(f"template {name} books {memory_of(template)} bytes, not {memory}")
    statuses = pod["status"].get("resourceClaimStatuses") or []
    claim = claims.get(statuses[0].get("resourceClaimName")) if statuses else None
    if claim is None:
        faults.append("the pod's ResourceClaim is not among the claims the API server listed")
    else:
        results = [r for r in ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
                   if r["driver"] == driver]
        consumed = [qty((r.get("consumedCapacity") or {}).get("memory", "0")) for r in results]
        seen["device"] = [f"{r['pool']}/{r['device']}" for r in results]
        seen["consumed"] = consumed
        if len(results) != 1 or consumed != [memory]:
            faults.append(f"the claim {claim['metadata']['name']} holds {seen['device']} consuming {consumed}, "
                          f"not one device of {driver} consuming {memory}")
        if template is not None and results and consumed[0] != memory_of(template):
            faults.append(f"the claim consumes {consumed[0]} where its template books {memory_of(template)}")
    if pod["status"].get("phase") != "Running":
        faults.append(f"the bare pod is {pod['status'].get('phase')}, not Running")
    return faults, seen


def main():
    work, driver, memory, dry_memory = sys.argv[1:]
    memory, dry_memory = qty(memory), qty(dry_memory)
    records = json.load(open(f"{work}/dra-bare.json"))["items"]
    templates = {t["metadata"]["name"]: t for t in json.load(open(f"{work}/dra-bare-templates.json"))["items"]}
    faults, seen = check(records, templates, driver, memory)

    created = open(f"{work}/dra-bare-create.log").read()
    if "carma: carma.io/gpu replaced by a claim" not in created:
        faults.append(f"kubectl printed no warning of the webhook: {created.strip()[:200]!r}")

    # 2. the dry run: patched, but no template made
    dry_note = "not answered"
    try:
        dry = json.load(open(f"{work}/dra-bare-dry.json"))
        dry_template = template_of(dry)
        dry_note = f"patched to {dry_template}"
        if not dry_template or not dry_template.startswith(f"carma-gpu-g1-m{dry_memory // 2**20}-") or gpu_requests(dry):
            faults.append(f"the dry run's answer is not patched to a {dry_memory // 2**20} MiB claim: {dry_template!r}")
        elif dry_template in templates:
            faults.append(f"the dry run made template {dry_template}")
        else:
            dry_note += " without making it"
    except (OSError, ValueError) as e:
        faults.append(f"the dry run gave no pod: {e}; {open(f'{work}/dra-bare-dry.log').read()[:200]!r}")

    # 3. the malformed annotation: refused, naming it
    bad = open(f"{work}/dra-bare-bad.log").read().strip()
    refused = int("denied the request" in bad and "carma.io/gpu-memory" in bad)
    if not refused:
        faults.append(f"the pod with a malformed carma.io/gpu-memory was not refused naming it: {bad[:200]!r}")

    # the checker's own planted fault
    doctored = copy.deepcopy(records)
    for item in doctored:
        if item["kind"] == "ResourceClaim":
            for r in ((item.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
                if "memory" in (r.get("consumedCapacity") or {}):
                    r["consumedCapacity"]["memory"] = f"{(memory + 2**30) // 2**20}Mi"
    caught = int(bool(check(doctored, templates, driver, memory)[0]))
    if not caught:
        faults.append("the checker accepted a claim consuming 1 GiB more than its template books")

    for f in faults:
        print(f"  dra-admission fault: {f}")
    est = seen.get("estimate") or {}
    message = re.sub(r"\s+", " ", bad.split("denied the request:", 1)[-1]).strip()[:120]
    print(f"dra-admission: {seen.get('claimed', 0)} of {seen.get('bare', 0)} bare pods given a claim from a template "
          f"made by admission; its size the one carma decided "
          f"({est.get('mib')} MiB, {est.get('source')}), ResourceClaimTemplate {seen.get('template')}, "
          f"allocated {[f'{c // 2**20}Mi' for c in seen.get('consumed', []) if c]} on {seen.get('device')}; "
          f"server-side dry run {dry_note}; {refused} refused at creation ({message!r}); "
          f"{caught} of 1 doctored records rejected")
    sys.exit(1 if faults else 0)


if __name__ == "__main__":
    main()
