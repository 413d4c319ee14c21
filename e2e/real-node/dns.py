#!/usr/bin/env python3
"""The cluster DNS of the real-node run (firsthour.sh): what CoreDNS answers for Services, no more.

Usage: dns.py <listen address> <kubectl> ; KUBECONFIG in the environment.

A real cluster resolves `<service>.<namespace>.svc.cluster.local`, and the chart's kube-scheduler calls
the extender by that name. The run has no cluster DNS, so this answers A queries for Service names
with their cluster IP, read from the API server (kubectl, cached 2 s); every other name is NXDOMAIN,
any other type of a Service name an empty answer. UDP only, as pods' resolvers ask first.
"""
import socket
import struct
import subprocess
import sys
import time

listen, kubectl = sys.argv[1], sys.argv[2]
cache = {}


def cluster_ip(svc, ns):
    hit = cache.get((svc, ns))
    if hit and time.time() - hit[1] < 2:
        return hit[0]
    r = subprocess.run([kubectl, "-n", ns, "get", "service", svc, "-o", "jsonpath={.spec.clusterIP}"],
                       capture_output=True, text=True, timeout=10)
    ip = r.stdout.strip() if r.returncode == 0 and r.stdout.strip() not in ("", "None") else None
    cache[(svc, ns)] = (ip, time.time())
    return ip


def answer(q):
    (qid, flags, qd), off, labels = struct.unpack("!HHH", q[:6]), 12, []
    while q[off]:
        labels.append(q[off + 1:off + 1 + q[off]].decode("ascii", "replace").lower())
        off += 1 + q[off]
    qtype, _ = struct.unpack("!HH", q[off + 1:off + 5])
    question = q[12:off + 5]
    ip = None
    if len(labels) in (3, 5) and labels[2] == "svc" and labels[3:] in ([], ["cluster", "local"]):
        ip = cluster_ip(labels[0], labels[1])
    rd = flags & 0x0100
    if ip is None:
        return struct.pack("!HHHHHH", qid, 0x8083 | rd, 1, 0, 0, 0) + question  # NXDOMAIN
    if qtype != 1:
        return struct.pack("!HHHHHH", qid, 0x8480 | rd, 1, 0, 0, 0) + question  # no record of this type
    rr = struct.pack("!HHHIH", 0xC00C, 1, 1, 5, 4) + socket.inet_aton(ip)
    return struct.pack("!HHHHHH", qid, 0x8480 | rd, 1, 1, 0, 0) + question + rr


s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((listen, 53))
print(f"dns: answering Service names on {listen}:53", flush=True)
while True:
    data, peer = s.recvfrom(512)
    try:
        reply = answer(data)
        rcode = {0: "answer" if reply[7] else "no record", 3: "NXDOMAIN"}[reply[3] & 0xF]
        print(f"dns: {peer[0]}: {rcode}", flush=True)
        s.sendto(reply, peer)
    except Exception as e:  # a malformed query: no answer, as a server would drop it
        print(f"dns: {peer[0]}: {e}", flush=True)
