"""A stand-in DNS server for tests: answers A records for names the test sets, on a UDP port of
127.0.0.1 (the router's --dns-server), as a Kubernetes cluster's DNS answers headless Services.
And the teardown such a test's processes need."""
import os
import socket
import struct
import threading


class StandInDns:
    """Answers A queries for the names in `records` (AAAA: no data; other names: NXDOMAIN). A name
    matches a record also with a search domain appended (`tandem-decode.default.svc.cluster.local`
    for `tandem-decode`), as a cluster's DNS answers a Service's short name."""

    def __init__(self):
        self.records = {}
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.queries = 0
        threading.Thread(target=self.serve, daemon=True).start()

    def set(self, name, addresses):
        with self.lock:
            self.records[name] = list(addresses)

    def serve(self):
        while True:
            try:
                data, peer = self.sock.recvfrom(512)
            except OSError:
                return
            if len(data) < 12:
                continue
            qid = data[:2]
            i, labels = 12, []
            while i < len(data) and data[i] != 0:
                n = data[i]
                labels.append(data[i + 1:i + 1 + n].decode("ascii", "replace"))
                i += 1 + n
            question = data[12:i + 5]
            qtype = struct.unpack(">H", data[i + 1:i + 3])[0]
            name = ".".join(labels).lower().rstrip(".")
            with self.lock:
                self.queries += 1
                addresses = self.records.get(name)
                if addresses is None:
                    addresses = next((a for key, a in self.records.items() if name.startswith(key + ".")), None)
            if addresses is None:
                rcode, answers = 3, []
            else:
                rcode, answers = 0, addresses if qtype == 1 else []
            header = qid + struct.pack(">HHHHH", 0x8180 | rcode, 1, len(answers), 0, 0)
            body = b"".join(struct.pack(">HHHIH", 0xC00C, 1, 1, 1, 4) + socket.inet_aton(a) for a in answers)
            self.sock.sendto(header + question + body, peer)


def stop_and_report(procs, work, failures):
    """Kills what still runs of `procs`, and when anything failed prints the tail of each *.log in
    `work`."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()
    if failures:
        for name in sorted(os.listdir(work)):
            if name.endswith(".log"):
                print(f"--- {name} (tail)")
                print(open(os.path.join(work, name)).read()[-1500:])
