#!/usr/bin/env python3
"""A TCP proxy to kube-apiserver that can be told to hang.

    hangproxy.py <listen port> <upstream port> <flag file>

It relays every connection on 127.0.0.1:<listen port> to 127.0.0.1:<upstream port> byte for byte (TLS
passes through untouched). While <flag file> exists it still accepts connections, and reads what the
client sends, but relays nothing in either direction: to the client, an API server that accepted its
request and never answers. Removing the file lets the held bytes through. The control-plane run puts
one in front of each operator replica to hang the leader's API server.
"""

import os
import socket
import sys
import threading
import time


def hung(flag: str) -> bool:
    return os.path.exists(flag)


def pump(src: socket.socket, dst: socket.socket, flag: str) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            while hung(flag):
                time.sleep(0.05)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(listen: int, upstream: int, flag: str) -> None:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", listen))
    srv.listen(128)
    while True:
        client, _ = srv.accept()
        try:
            up = socket.create_connection(("127.0.0.1", upstream))
        except OSError:
            client.close()
            continue
        threading.Thread(target=pump, args=(client, up, flag), daemon=True).start()
        threading.Thread(target=pump, args=(up, client, flag), daemon=True).start()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: hangproxy.py <listen port> <upstream port> <flag file>")
    serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
