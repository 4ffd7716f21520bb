#!/usr/bin/env python3
"""The storage cluster's chaos soak (run it with run_chaos_soak.sh).

Three coio-storage-servers on loopback, two targets each, three chains of
two replicas (CHAINS.md's example), verified load from three
coio-storage-bench --cluster clients (one hedging; two reading whole 16 KiB
chunks, one partial ranges of 6000 bytes at random offsets, so that the
corruption meets both kinds of read), and on a schedule:

  1. kill -9 of server A, restarted once down
  2. SIGSTOP of server B, SIGCONT 3 s later
  3. a byte corrupted in 4 chunks of one replica (target 32 on server C)
  4. a client killed (kill -9) in the middle of its requests
  5. a client that sends requests to server C and stops reading
  6. server B drained with SIGTERM, restarted once it exited

Every chain keeps a live, intact replica throughout (A is killed before the
corruption, whose other replica is on A; B is only faulted afterwards), so
no IO may fail (the clients keep trying an IO every replica failed for
RETRY_MS: a loaded machine may stall every process past the 1 s request
deadline) and no byte may be wrong, and the corrupt replica must be
found by the partial reads too (the server checks every 4 KiB block a read
covers: a partial read that covers a corrupt byte is answered `corrupt`, the
client reads the other replica). Prints IOs served and failed,
bytes wrong, retries and failovers, the p99 batch latency before, during
and after each fault, and each server's RSS and read-buffer pool occupancy
at the end (no buffer may be in use), and checks that no process is left.
Exits 1 if a figure is off.

--etcd: the cluster's state in etcd (docs/storage-example.md). A three-member
etcd on loopback (data in the work directory) holds the chain table
(`cluster load`), two `mgmtd`s manage it, the servers register with
--etcd and the clients follow the routing with --etcd (every member's URL)
instead of --cluster FILE. Server A stays down after its kill -9 until
every client has applied the routing with its targets offline (its lease
expires: --ttl), then comes back and is waited for serving again before
the next fault (B's stop needs chain 1's other replica, on A); the drain
too is waited for offline, then serving. Two faults more, between the
others, neither touching a replica:

  7. kill -9 of the leading mgmtd (the /coio/leader key names it), restarted
     once the other leads
  8. kill -9 of etcd member 0 (every process's first endpoint), restarted
     on its data 3 s later (it rejoins)
  9. SIGSTOP of etcd member 0 for 2 x TTL + 1 s, then SIGCONT: it accepts
     connections and never answers, the way a wedged member fails; while it
     is stopped no lease may be lost (no server logs a lost lease) and the
     leading mgmtd stays the same; no chain may change version until TTL +
     1 s after the SIGCONT (a member that led may then revoke the leases it
     saw expire, etcd issue 15247: everyone registers again)

and three figures more, from the clients' --routing-log (each routing a
client puts in use, with its wall-clock time) and their reports: the time
from a server's death (kill -9 of A, SIGTERM of B: the signal's time) to
each client's first routing with all of its targets offline, p50/p99 over
deaths x clients; IOs sent to a target offline in the routing the client
held at that moment (ClusterStats::offlineIos: requests, hedges and probes;
it covers every IO to a dead server after the client applied its change),
which must be 0; and how long after its kill the other mgmtd led.

One file, though long: one schedule (Soak) over one set of processes whose
state every fault and every check reads; a script run by itself, with no
other user of its parts.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from base64 import b64decode, b64encode

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from free_ports import free_ports  # noqa: E402 (tests/free_ports.py)

# How long a client keeps trying an IO every replica failed: a loaded CI
# machine once stalled every process for over a second (both replicas of a
# chain missed the 1 s deadline, their IOs failed); a real client rides that
# out the same way (ClusterOptions::retryFor).
RETRY_MS = 3000
CHUNKS = 1536
CHUNK = 16 * 1024
PER_FILE = 64
SEND_TIMEOUT_MS = 3000
WINDOW = 3.0  # seconds of samples before and after a fault
PARTIAL_CLIENT = 2  # the client that reads partial ranges: PARTIAL_IO bytes at random (unaligned) offsets
PARTIAL_IO = "6000"
SERVERS = ["A", "B", "C"]
TARGETS = {"A": (11, 12), "B": (21, 22), "C": (31, 32)}
CHAINS = [(1, [("A", 11), ("B", 21)]), (2, [("B", 22), ("C", 31)]), (3, [("C", 32), ("A", 12)])]
ETCD_MEMBERS = 3
MGMTDS = ["m1", "m2"]
TTL = 3  # seconds: the servers' and mgmtds' leases
ROUTING_WAIT = 20.0  # seconds a routing change may take to reach every client (a lease's expiry, an election)


def now():
    return time.time()


def wait_until(predicate, seconds):
    """Polls `predicate` until it is true or `seconds` pass; its last value."""
    deadline = now() + seconds
    while not predicate():
        if now() > deadline:
            return predicate()
        time.sleep(0.05)
    return True


class Etcd:
    """A three-member etcd on loopback, each member's data in the work
    directory (a member started again rejoins with it), and reads through
    its JSON gateway from whichever member answers."""

    def __init__(self, work):
        ports = free_ports(2 * ETCD_MEMBERS)
        self.work = work
        self.client_ports, self.peer_ports = ports[:ETCD_MEMBERS], ports[ETCD_MEMBERS:]
        self.procs = [None] * ETCD_MEMBERS

    def url(self, i):
        return f"http://127.0.0.1:{self.client_ports[i]}"

    def urls(self):
        return ",".join(self.url(i) for i in range(ETCD_MEMBERS))

    def start(self, i):
        cluster = ",".join(f"e{j}=http://127.0.0.1:{self.peer_ports[j]}" for j in range(ETCD_MEMBERS))
        peer = f"http://127.0.0.1:{self.peer_ports[i]}"
        argv = ["etcd", "--name", f"e{i}", "--data-dir", os.path.join(self.work, f"etcd-{i}"),
                "--listen-client-urls", self.url(i), "--advertise-client-urls", self.url(i),
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", cluster,
                "--initial-cluster-token", os.path.basename(self.work),
                # Elections in about a second, and no spurious ones on a loaded machine.
                "--heartbeat-interval", "100", "--election-timeout", "1000", "--logger", "zap", "--log-level", "warn"]
        log = open(os.path.join(self.work, f"etcd-{i}.log"), "a")
        self.procs[i] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def healthy(self, i):
        try:
            with urllib.request.urlopen(self.url(i) + "/health", timeout=2) as reply:
                return json.load(reply).get("health") == "true"
        except (OSError, ValueError):
            return False

    def wait_healthy(self, i):
        if not wait_until(lambda: self.healthy(i) or self.procs[i].poll() is not None, 30) or not self.healthy(i):
            raise RuntimeError(f"etcd member {i} is not healthy (see {self.work}/etcd-{i}.log)")

    def get(self, key, prefix=False):
        """[(key, value)] of `key` (every key under it, if `prefix`) from
        the first running member that answers; None if none does."""
        body = {"key": b64encode(key.encode()).decode()}
        if prefix:
            body["range_end"] = b64encode(key[:-1].encode() + bytes([ord(key[-1]) + 1])).decode()
        for i, proc in enumerate(self.procs):
            if proc is None or proc.poll() is not None:
                continue
            request = urllib.request.Request(self.url(i) + "/v3/kv/range", data=json.dumps(body).encode(), method="POST")
            try:
                with urllib.request.urlopen(request, timeout=2) as reply:
                    kvs = json.load(reply).get("kvs", [])
            except (OSError, ValueError):
                continue
            return [(b64decode(kv["key"]).decode(), b64decode(kv.get("value", "")).decode()) for kv in kvs]
        return None

    def leader(self):
        """The id of the mgmtd that leads (the /coio/leader key), or None."""
        found = self.get("/coio/leader")
        return found[0][1] if found else None


class Soak:
    def __init__(self, args):
        self.args = args
        self.bin = args.bin
        self.work = tempfile.mkdtemp(prefix="coio-chaos-", dir=args.tmpdir)
        self.ports = dict(zip(SERVERS, free_ports(len(SERVERS))))
        self.servers = {}      # name -> Popen
        self.clients = []      # (name, Popen, json path, latency path)
        self.others = []       # every other process started
        self.faults = []       # (name, t0, t1)
        self.problems = []
        self.table = os.path.join(self.work, "chains.txt")
        self.etcd = Etcd(self.work) if args.etcd else None
        self.mgmtds = {}       # id -> Popen
        self.deaths = []       # (server, time of the signal, {client: time it applied the change})
        self.takeovers = []    # seconds from the leading mgmtd's kill to another's leading

    # ---- processes -----------------------------------------------------
    def log(self, text):
        print(f"[{now() - self.start:6.1f} s] {text}" if hasattr(self, "start") else text, flush=True)

    def run(self, argv):
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)

    def start_server(self, name):
        log = open(os.path.join(self.work, f"server-{name}.log"), "a")
        argv = [os.path.join(self.bin, "coio-storage-server"), "serve", "--listen", f"127.0.0.1:{self.ports[name]}",
                "--reactor", self.args.reactor, "--pool", "32M", "--piece-size", "16K",
                "--send-timeout-ms", str(SEND_TIMEOUT_MS)]
        for t in TARGETS[name]:
            argv += ["--target", f"{t}={os.path.join(self.work, f't{t}')}"]
        if self.etcd:
            argv += ["--etcd", self.etcd.urls(), "--ttl", str(TTL)]
        mark = os.path.getsize(log.name)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.servers[name] = proc
        deadline = now() + 20
        while now() < deadline:
            with open(log.name) as f:
                f.seek(mark)
                if "listening on" in f.read():
                    return
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"server {name} did not start (see {log.name})")

    def start_client(self, name, duration, hedge=False, io_size="16K"):
        out = os.path.join(self.work, f"client-{name}.json")
        lat = os.path.join(self.work, f"client-{name}.lat")
        argv = [os.path.join(self.bin, "coio-storage-bench"), "--verify", "--json",
                "--duration", str(duration), "--io-size", io_size, "--batch", "8", "--depth", "4",
                "--request-timeout-ms", "1000", "--retry-ms", str(RETRY_MS), "--latency-log", lat,
                "--reactor", self.args.reactor]
        if self.etcd:
            argv += ["--etcd", self.etcd.urls(), "--routing-log", self.routing_log(name)]
        else:
            argv += ["--cluster", self.table]
        if hedge:
            argv += ["--hedge-ms", "50"]
        proc = subprocess.Popen(argv, stdout=open(out, "w"), stderr=open(out + ".log", "w"))
        return proc, out, lat

    def start_mgmtd(self, name):
        log = open(os.path.join(self.work, f"mgmtd-{name}.log"), "a")
        self.mgmtds[name] = subprocess.Popen(
            [os.path.join(self.bin, "coio-storage-server"), "mgmtd", "--etcd", self.etcd.urls(), "--id", name,
             "--ttl", str(TTL)], stdout=log, stderr=subprocess.STDOUT)

    # ---- routing as the clients applied it (--etcd) ------------------------
    def routing_log(self, name):
        return os.path.join(self.work, f"client-{name}.routing")

    def routings(self, name):
        """[(time, offline targets)], each routing client `name` put in use."""
        found = []
        try:
            with open(self.routing_log(name)) as f:
                for line in f:
                    parts = line.split()
                    if line.endswith("\n") and len(parts) >= 2 and parts[1] == "offline":
                        found.append((float(parts[0]) / 1000, {int(t) for t in parts[2:]}))
        except OSError:
            pass
        return found

    def applied(self, targets, offline, since):
        """{client: when it first put in use, at `since` or later, a routing
        with every one of `targets` offline (or every one serving); None if
        it has not yet}."""
        def matches(down):
            return set(targets) <= down if offline else not set(targets) & down
        return {name: next((t for t, down in self.routings(name) if t >= since and matches(down)), None)
                for name, _, _, _ in self.clients}

    def wait_applied(self, server, offline, since):
        """Waits until every client has applied `server`'s targets offline
        (or serving) since `since`; their times."""
        state = "offline" if offline else "serving"
        times = {}

        def done():
            times.update(self.applied(TARGETS[server], offline, since))
            return all(t is not None for t in times.values())
        if not wait_until(done, ROUTING_WAIT):
            late = [name for name, t in times.items() if t is None]
            self.problems.append(f"clients {late} did not apply server {server}'s targets {state} "
                                 f"within {ROUTING_WAIT:.0f} s")
        return times

    def death(self, server, when):
        """Server `server` died at `when`: waits for every client to have its
        targets offline, and records when each did."""
        self.deaths.append((server, when, self.wait_applied(server, True, when)))

    def back(self, server, since):
        """Waits for every client to have `server`'s targets serving again,
        and for the clients' probes to find it (a few probe periods)."""
        self.wait_applied(server, False, since)
        time.sleep(0.5)

    # ---- setup -----------------------------------------------------------
    def setup(self):
        lines = ["# written by chaos_soak.py", "coio-chains 1", f"chunks {CHUNKS}", "chunk-size 16K"]
        for cid, replicas in CHAINS:
            lines.append(f"chain {cid} " + " ".join(f"127.0.0.1:{self.ports[s]}/{t}" for s, t in replicas))
        with open(self.table, "w") as f:
            f.write("\n".join(lines) + "\n")
        for name in SERVERS:
            for t in TARGETS[name]:
                self.run([os.path.join(self.bin, "coio-storage-server"), "init", "--chains", self.table, "--target",
                          str(t), "--dir", os.path.join(self.work, f"t{t}"), "--chunks-per-file", str(PER_FILE)])
        if self.etcd:
            for i in range(ETCD_MEMBERS):
                self.etcd.start(i)
            for i in range(ETCD_MEMBERS):
                self.etcd.wait_healthy(i)
            self.run([os.path.join(self.bin, "coio-storage-server"), "cluster", "load", self.table, "--etcd",
                      self.etcd.urls()])
        for name in SERVERS:
            self.start_server(name)
        if self.etcd:
            for name in MGMTDS:
                self.start_mgmtd(name)
            if not wait_until(self.cluster_ready, 30):
                raise RuntimeError("etcd never had a leading mgmtd, every server registered and every target serving")

    def cluster_ready(self):
        live = self.etcd.get("/coio/live/", prefix=True)
        chains = self.etcd.get("/coio/chains/", prefix=True)
        return (live is not None and len(live) == len(SERVERS) and bool(chains) and self.etcd.leader() in MGMTDS
                and all(t["state"] == "serving" for _, c in chains for t in json.loads(c)["targets"]))

    # ---- faults ----------------------------------------------------------
    def kill_and_restart(self):
        proc = self.servers["A"]
        killed = now()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if not self.etcd:
            time.sleep(1.0)  # down for a while: its reads go elsewhere
            self.start_server("A")
            return
        self.death("A", killed)  # down until its lease expired and every client moved away
        restarted = now()
        self.start_server("A")
        self.back("A", restarted)

    def stop_and_continue(self):
        proc = self.servers["B"]
        proc.send_signal(signal.SIGSTOP)
        time.sleep(3.0)
        proc.send_signal(signal.SIGCONT)

    def corrupt(self):
        # Target 32 holds chain 3's chunks (2, 5, 8, ...): slot s in data-(s / 64).
        directory = os.path.join(self.work, "t32")
        for slot in range(4):
            path = os.path.join(directory, f"data-{slot // PER_FILE}")
            where = (slot % PER_FILE) * CHUNK + 1000 + slot
            with open(path, "r+b") as f:
                f.seek(where)
                byte = f.read(1)
                f.seek(where)
                f.write(bytes([byte[0] ^ 0x5A]))
                f.flush()
                os.fsync(f.fileno())
        time.sleep(WINDOW)

    def kill_client(self):
        proc, _, _ = self.start_client("doomed", 30)
        self.others.append(proc)
        time.sleep(1.5)  # connected, requests in flight all the time
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(1.0)

    def stuck_client(self):
        # Eight granted requests of 1 MiB each (64 whole chunks of target
        # 31: chain 2's 1, 4, 7, ...), then nothing read: the server's
        # sends stall and it must drop the connection within 1.25 x its
        # send timeout, freeing the buffers.
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", self.ports["C"]))
        requested = 0
        for rid in range(1, 9):
            # Each IO: target 31, chain version 0 (no routing: never stale), chunk, offset, length, remote.
            ios = b"".join(struct.pack("<IIQIIQII", 31, 0, 1 + 3 * ((rid * 64 + i) % (CHUNKS // 3)), 0, CHUNK, 0, 0, 0)
                           for i in range(64))
            payload = struct.pack("<BBHI", 1, 1, 0, 64) + ios
            s.sendall(struct.pack("<IHHQII", 0x4F494F43, 5, 1, rid, len(payload), 0) + payload)  # protocol version 5
            requested += 64 * CHUNK
        time.sleep(SEND_TIMEOUT_MS / 1000 * 1.25 + 1.5)
        s.settimeout(3.0)
        received, ended = 0, False
        try:
            while True:
                data = s.recv(1 << 20)
                if not data:
                    ended = True
                    break
                received += len(data)
        except socket.timeout:
            pass  # still open: not dropped
        except ConnectionResetError:
            ended = True
        s.close()
        if not ended or received >= requested:
            self.problems.append(f"the client that stopped reading was not dropped (read {received} of {requested} bytes)")

    def drain(self):
        proc = self.servers["B"]
        stopped = now()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.problems.append("server B did not exit within 15 s of SIGTERM")
            proc.kill()
            code = proc.wait()
        if code != 0:
            self.problems.append(f"server B exited with {code} after SIGTERM")
        if self.etcd:
            self.death("B", stopped)  # its lease revoked before the drain: moved away at once
        restarted = now()
        self.start_server("B")
        if self.etcd:
            self.back("B", restarted)

    def kill_leading_mgmtd(self):
        leader = self.etcd.leader()
        if leader not in self.mgmtds:
            self.problems.append(f"no mgmtd leads before its kill (the leader key says {leader!r})")
            return
        killed = now()
        self.mgmtds[leader].send_signal(signal.SIGKILL)
        self.mgmtds[leader].wait()
        # Its lease expires (TTL), the key goes, the other takes it.
        if wait_until(lambda: self.etcd.leader() not in (None, leader), TTL + ROUTING_WAIT):
            self.takeovers.append(now() - killed)
        else:
            self.problems.append(f"no other mgmtd led within {TTL + ROUTING_WAIT:.0f} s of {leader}'s kill -9")
        self.start_mgmtd(leader)

    def freeze_etcd_member(self):
        chains = lambda: {k: json.loads(v)["version"] for k, v in self.etcd.get("/coio/chains/", prefix=True) or []}
        before, leader = chains(), self.etcd.leader()
        marks = {name: os.path.getsize(os.path.join(self.work, f"server-{name}.log")) for name in SERVERS}
        self.etcd.procs[0].send_signal(signal.SIGSTOP)
        time.sleep(2 * TTL + 1)
        # Still stopped, past twice the TTL: no lease lost, the same leading mgmtd.
        if self.etcd.leader() != leader:
            self.problems.append(f"the leading mgmtd changed while etcd member 0 was stopped: {leader} -> "
                                 f"{self.etcd.leader()}")
        for name, mark in marks.items():
            with open(os.path.join(self.work, f"server-{name}.log")) as f:
                f.seek(mark)
                if "the lease was lost" in f.read():
                    self.problems.append(f"server {name} lost its lease while etcd member 0 was stopped")
        self.etcd.procs[0].send_signal(signal.SIGCONT)
        # Resumed (a member that led may then revoke every lease it saw expire: etcd issue 15247, fixed in
        # 3.4.28; everyone registers again): no chain changes version, before or after.
        time.sleep(TTL + 1)  # a manager that took over would have acted by now
        after = chains()
        if not before or after != before:
            self.problems.append(f"chain versions changed while etcd member 0 was stopped or after: {before} -> {after}")

    def kill_etcd_member(self):
        self.etcd.procs[0].send_signal(signal.SIGKILL)
        self.etcd.procs[0].wait()
        time.sleep(3.0)
        self.etcd.start(0)
        self.etcd.wait_healthy(0)

    # ---- the run ---------------------------------------------------------
    def soak(self):
        duration = self.args.duration
        faults = [("kill -9 server A, restart", self.kill_and_restart),
                  ("SIGSTOP server B 3 s, SIGCONT", self.stop_and_continue),
                  ("corrupt 4 chunks of target 32 (C)", self.corrupt),
                  ("kill -9 a client mid-request", self.kill_client),
                  ("a client stops reading (server C)", self.stuck_client),
                  ("SIGTERM server B (drain), restart", self.drain)]
        slots = len(faults) + 1
        if self.etcd:
            faults[3:3] = [("kill -9 the leading mgmtd, restart", self.kill_leading_mgmtd)]
            faults[5:5] = [("kill -9 etcd member 0, restart", self.kill_etcd_member),
                           (f"SIGSTOP etcd member 0 {2 * TTL + 1} s, SIGCONT", self.freeze_etcd_member)]
            slots = len(faults) + 2  # the drain's waits end well before the clients do
        self.start = now()
        for i in range(3):
            partial = i == PARTIAL_CLIENT
            self.clients.append((str(i),) + self.start_client(str(i), duration, hedge=(i == 0),
                                                              io_size=PARTIAL_IO if partial else "16K"))
        for i, (name, fault) in enumerate(faults):
            at = self.start + duration * (i + 1) / slots
            time.sleep(max(0.0, at - now()))
            t0 = now()
            self.log(f"fault: {name}")
            fault()
            self.faults.append((name, t0, now()))
        for name, proc, _, _ in self.clients:
            try:
                proc.wait(timeout=duration + 60)
            except subprocess.TimeoutExpired:
                self.problems.append(f"client {name} still running long after its duration: killed")
                proc.kill()
                proc.wait()

    # ---- figures ---------------------------------------------------------
    def server_figures(self):
        figures = {}
        time.sleep(1.0)  # the clients' connections close
        for name in SERVERS:
            proc = self.servers[name]
            path = os.path.join(self.work, f"server-{name}.log")
            mark = os.path.getsize(path)
            proc.send_signal(signal.SIGUSR1)
            stats = None
            deadline = now() + 5
            while stats is None and now() < deadline:
                time.sleep(0.1)
                with open(path) as f:
                    f.seek(mark)
                    found = re.findall(r"^stats: (.*)$", f.read(), re.M)
                if found:
                    stats = dict(kv.split("=") for kv in found[-1].split())
            rss = None
            with open(f"/proc/{proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1]) / 1024
            figures[name] = (stats, rss)
        return figures

    def stop_all(self):
        """SIGTERMs the servers, then the mgmtds, then etcd (the others
        leave it first); each must exit within 15 s."""
        groups = [("server", self.servers), ("mgmtd", self.mgmtds)]
        if self.etcd:
            groups.append(("etcd member", {str(i): p for i, p in enumerate(self.etcd.procs) if p is not None}))
        for kind, procs in groups:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for name, proc in procs.items():
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.problems.append(f"{kind} {name} hung on SIGTERM: killed")
                    proc.kill()
                    proc.wait()

    def latencies(self):
        samples = []
        for _, _, _, lat in self.clients:
            with open(lat) as f:
                for line in f:
                    end, ms = line.split()
                    samples.append((float(end) / 1000, float(ms)))
        return samples

    @staticmethod
    def percentile(samples, begin, end, p):
        window = sorted(ms for t, ms in samples if begin <= t < end)
        return Soak.percentile_of(window, p) if window else None

    def report(self, figures):
        totals = {"ios": 0, "failed": 0, "wrong": 0, "content": 0, "retries": 0, "failovers": 0, "hedges": 0,
                  "hedge_wins": 0, "corrupt": 0, "offline_ios": 0, "updates": 0, "refreshes": 0, "bad_records": 0,
                  "partial_corrupt": 0, "retry_pauses": 0}
        failed_by_status = {}
        for name, proc, out, _ in self.clients:
            try:
                with open(out) as f:
                    r = json.load(f)
            except (OSError, ValueError):
                self.problems.append(f"client {name} wrote no report (exit {proc.returncode}; see {out}.log)")
                continue
            if proc.returncode != 0:
                self.problems.append(f"client {name} exited with {proc.returncode}")
            e, c = r["errors"], r["cluster"]
            totals["ios"] += r["ios"]
            totals["failed"] += e["io_status"]["total"] + e["checksum"]
            for status, n in e["io_status"]["by_status"].items():
                failed_by_status[status] = failed_by_status.get(status, 0) + n
            if name == str(PARTIAL_CLIENT):
                totals["partial_corrupt"] += c["corrupt_replicas"]
            totals["content"] += e["content"]
            totals["wrong"] += e["wrong_bytes"]
            for key, field in (("retries", "retries"), ("failovers", "failovers"), ("hedges", "hedges"),
                               ("hedge_wins", "hedge_wins"), ("corrupt", "corrupt_replicas"),
                               ("offline_ios", "offline_ios"), ("refreshes", "routing_refreshes"),
                               ("retry_pauses", "retry_pauses")):
                totals[key] += c[field]
            if self.etcd:
                totals["updates"] += c["etcd"]["updates"]
                totals["bad_records"] += c["etcd"]["bad_records"]
        print()
        print(f"chaos soak: {self.args.duration} s, 3 servers x 2 targets, 3 chains x 2 replicas, 3 verifying clients")
        print(f"  IOs served            {totals['ios']}")
        print(f"  IOs failed            {totals['failed']}" +
              (" (" + ", ".join(f"{s} {n}" for s, n in sorted(failed_by_status.items())) + ")" if failed_by_status else ""))
        print(f"  bytes wrong           {totals['wrong']} (in {totals['content']} IOs)")
        print(f"  retries               {totals['retries']} IOs read from another replica, "
              f"{totals['retry_pauses']} pauses before IOs every replica had failed went round again")
        print(f"  failovers             {totals['failovers']} times a server was marked down")
        print(f"  hedges                {totals['hedges']} (won {totals['hedge_wins']})")
        print(f"  corrupt replicas      {totals['corrupt']} found (and not used), "
              f"{totals['partial_corrupt']} of them by the partial reads ({PARTIAL_IO} bytes)")
        if self.etcd:
            self.report_etcd(totals)
        samples = self.latencies()
        print(f"  batch latency (ms): p99 {WINDOW:.0f} s before / p99 and max during / p99 {WINDOW:.0f} s after each fault")
        show = lambda v: "      -" if v is None else f"{v:7.2f}"
        for name, t0, t1 in self.faults:
            end = max(t1, t0 + 0.5)
            print(f"    {name:<38} {show(self.percentile(samples, t0 - WINDOW, t0, 0.99))}"
                  f" {show(self.percentile(samples, t0, end, 0.99))} {show(self.percentile(samples, t0, end, 1.0))}"
                  f" {show(self.percentile(samples, end, end + WINDOW, 0.99))}   ({t1 - t0:.1f} s)")
        print("  servers at the end:")
        for name in SERVERS:
            stats, rss = figures[name]
            if stats is None:
                self.problems.append(f"server {name} printed no stats on SIGUSR1")
                print(f"    {name}: no stats")
                continue
            print(f"    {name}: RSS {rss:.1f} MiB, read buffers in use {stats['buffers_in_use']} of {stats['buffers']}, "
                  f"connections {stats['connections']}, requests {stats['requests']}, "
                  f"send timeouts {stats['send_timeouts']}, corrupt IOs {stats.get('corrupt_ios', '-')}")
            if stats["buffers_in_use"] != "0":
                self.problems.append(f"server {name} still holds {stats['buffers_in_use']} read buffers")
        if totals["ios"] == 0:
            self.problems.append("no IO was served")
        if totals["failed"]:
            self.problems.append(f"{totals['failed']} IOs failed while a replica of each chain was alive")
        if totals["wrong"] or totals["content"]:
            self.problems.append(f"{totals['wrong']} bytes wrong")
        if totals["corrupt"] == 0:
            self.problems.append("the corrupted replica was never detected")
        if totals["partial_corrupt"] == 0:
            self.problems.append("the partial reads never met the corrupted replica")
        if figures["C"][0] is not None and figures["C"][0]["send_timeouts"] == "0":
            self.problems.append("server C never dropped the client that stopped reading")

    def report_etcd(self, totals):
        delays = sorted((seen - when) * 1000 for _, when, times in self.deaths for seen in times.values()
                        if seen is not None)
        print(f"  etcd: {ETCD_MEMBERS} members, {len(MGMTDS)} mgmtds, leases of {TTL} s")
        if delays:
            print(f"  death -> routing change applied by a client (ms): p50 {self.percentile_of(delays, 0.5):.0f}, "
                  f"p99 {self.percentile_of(delays, 0.99):.0f}, max {delays[-1]:.0f} "
                  f"({len(self.deaths)} deaths x {len(self.clients)} clients)")
        for server, when, times in self.deaths:
            shown = ", ".join("-" if t is None else f"{(t - when) * 1000:.0f}" for t in times.values())
            print(f"    server {server} at {when - self.start:5.1f} s: {shown} ms")
        print(f"  IOs to offline targets {totals['offline_ios']} (sent to a target the client's routing had offline)")
        print(f"  routing updates       {totals['updates']} applied from the watch, {totals['refreshes']} "
              f"refreshes on staleRouting, {totals['bad_records']} bad records")
        for took in self.takeovers:
            print(f"  mgmtd takeover        {took:.1f} s after the leader's kill -9")
        if len(self.deaths) != 2 or len(delays) != 2 * len(self.clients):
            self.problems.append("not every death was followed by a routing change in every client")
        if totals["offline_ios"]:
            self.problems.append(f"{totals['offline_ios']} IOs sent to targets offline in the client's routing")
        if totals["bad_records"]:
            self.problems.append(f"{totals['bad_records']} routing records refused by the clients")
        if len(self.takeovers) != 1:
            self.problems.append("the leading mgmtd's kill was not followed by another's leading")

    @staticmethod
    def percentile_of(ordered, p):
        return ordered[min(len(ordered) - 1, int(p * (len(ordered) - 1) + 0.5))]

    # A failed run's evidence where CI shows it (its work directory is
    # gone with the machine): what each client logged (servers down and
    # back, the first failed IOs), and how busy the machine was.
    def client_logs(self):
        with open("/proc/loadavg") as f:
            print(f"  load average at the end: {' '.join(f.read().split()[:3])}")
        for name, _, out, _ in self.clients:
            try:
                with open(out + ".log") as f:
                    lines = [line.rstrip() for line in f if line.startswith("coio-storage")]
            except OSError:
                continue
            print(f"  client {name} logged:")
            for line in lines[:40]:
                print("    " + line)

    def leftovers(self):
        procs = [p for _, p, _, _ in self.clients] + list(self.servers.values()) + self.others
        procs += list(self.mgmtds.values()) + ([p for p in self.etcd.procs if p is not None] if self.etcd else [])
        left = [p.pid for p in procs if p.poll() is None]
        print(f"  processes left        {len(left) or 'none'}")
        if left:
            self.problems.append(f"processes left running: {left}")
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", required=True, help="the directory of coio-storage-server and coio-storage-bench")
    parser.add_argument("--duration", type=int, default=60, help="seconds of load (at least 30)")
    parser.add_argument("--reactor", default="uring", choices=["uring", "epoll"])
    parser.add_argument("--tmpdir", default=os.environ.get("TMPDIR", "/var/tmp"))
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, latency samples)")
    parser.add_argument("--etcd", action="store_true",
                        help="the cluster's state in etcd: three members, two mgmtds, two faults more")
    args = parser.parse_args()
    if args.duration < (60 if args.etcd else 30):
        parser.error("--duration: at least 30 s (six faults), 60 s with --etcd (eight, and lease expiries)")
    soak = Soak(args)
    figures = {}
    try:
        soak.setup()
        soak.soak()
        figures = soak.server_figures()
    except Exception as error:  # noqa: BLE001 - any failure is reported, processes still cleaned up
        soak.problems.append(f"the soak itself failed: {error!r}")
    finally:
        soak.stop_all()
    if figures:
        soak.report(figures)
    soak.leftovers()
    if not args.keep and not soak.problems:
        shutil.rmtree(soak.work, ignore_errors=True)
    if soak.problems:
        print("\nchaos soak: FAILED (work directory kept: " + soak.work + ")")
        for p in soak.problems:
            print("  - " + p)
        soak.client_logs()
        return 1
    print("\nchaos soak: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
