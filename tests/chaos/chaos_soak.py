#!/usr/bin/env python3
"""The storage cluster's chaos soak (run it with run_chaos_soak.sh).

Three coio-storage-servers on loopback, two targets each, three chains of
two replicas (CHAINS.md's example), verified load from three
coio-storage-bench --cluster clients (one hedging), and on a schedule:

  1. kill -9 of server A, restarted once down
  2. SIGSTOP of server B, SIGCONT 3 s later
  3. a byte corrupted in 4 chunks of one replica (target 32 on server C)
  4. a client killed (kill -9) in the middle of its requests
  5. a client that sends requests to server C and stops reading
  6. server B drained with SIGTERM, restarted once it exited

Every chain keeps a live, intact replica throughout (A is killed before the
corruption, whose other replica is on A; B is only faulted afterwards), so
no IO may fail and no byte may be wrong. Prints IOs served and failed,
bytes wrong, retries and failovers, the p99 batch latency before, during
and after each fault, and each server's RSS and read-buffer pool occupancy
at the end (no buffer may be in use), and checks that no process is left.
Exits 1 if a figure is off.
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

CHUNKS = 1536
CHUNK = 16 * 1024
PER_FILE = 64
SEND_TIMEOUT_MS = 3000
WINDOW = 3.0  # seconds of samples before and after a fault
SERVERS = ["A", "B", "C"]
TARGETS = {"A": (11, 12), "B": (21, 22), "C": (31, 32)}
CHAINS = [(1, [("A", 11), ("B", 21)]), (2, [("B", 22), ("C", 31)]), (3, [("C", 32), ("A", 12)])]


def now():
    return time.time()


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


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

    def start_client(self, name, duration, hedge=False):
        out = os.path.join(self.work, f"client-{name}.json")
        lat = os.path.join(self.work, f"client-{name}.lat")
        argv = [os.path.join(self.bin, "coio-storage-bench"), "--cluster", self.table, "--verify", "--json",
                "--duration", str(duration), "--io-size", "16K", "--batch", "8", "--depth", "4",
                "--request-timeout-ms", "1000", "--latency-log", lat, "--reactor", self.args.reactor]
        if hedge:
            argv += ["--hedge-ms", "50"]
        proc = subprocess.Popen(argv, stdout=open(out, "w"), stderr=open(out + ".log", "w"))
        return proc, out, lat

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
        for name in SERVERS:
            self.start_server(name)

    # ---- faults ----------------------------------------------------------
    def kill_and_restart(self):
        proc = self.servers["A"]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(1.0)  # down for a while: its reads go elsewhere
        self.start_server("A")

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
            s.sendall(struct.pack("<IHHQII", 0x4F494F43, 4, 1, rid, len(payload), 0) + payload)  # protocol version 4
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
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.problems.append("server B did not exit within 15 s of SIGTERM")
            proc.kill()
            code = proc.wait()
        if code != 0:
            self.problems.append(f"server B exited with {code} after SIGTERM")
        self.start_server("B")

    # ---- the run ---------------------------------------------------------
    def soak(self):
        duration = self.args.duration
        faults = [("kill -9 server A, restart", self.kill_and_restart),
                  ("SIGSTOP server B 3 s, SIGCONT", self.stop_and_continue),
                  ("corrupt 4 chunks of target 32 (C)", self.corrupt),
                  ("kill -9 a client mid-request", self.kill_client),
                  ("a client stops reading (server C)", self.stuck_client),
                  ("SIGTERM server B (drain), restart", self.drain)]
        self.start = now()
        for i in range(3):
            self.clients.append((str(i),) + self.start_client(str(i), duration, hedge=(i == 0)))
        for i, (name, fault) in enumerate(faults):
            at = self.start + duration * (i + 1) / (len(faults) + 1)
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

    def stop_servers(self):
        for name, proc in self.servers.items():
            proc.send_signal(signal.SIGTERM)
        for name, proc in self.servers.items():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.problems.append(f"server {name} hung on SIGTERM: killed")
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
        if not window:
            return None
        return window[min(len(window) - 1, int(p * (len(window) - 1) + 0.5))]

    def report(self, figures):
        totals = {"ios": 0, "failed": 0, "wrong": 0, "content": 0, "retries": 0, "failovers": 0, "hedges": 0,
                  "hedge_wins": 0, "corrupt": 0}
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
            totals["failed"] += e["io_status"] + e["checksum"]
            totals["content"] += e["content"]
            totals["wrong"] += e["wrong_bytes"]
            for key, field in (("retries", "retries"), ("failovers", "failovers"), ("hedges", "hedges"),
                               ("hedge_wins", "hedge_wins"), ("corrupt", "corrupt_replicas")):
                totals[key] += c[field]
        print()
        print(f"chaos soak: {self.args.duration} s, 3 servers x 2 targets, 3 chains x 2 replicas, 3 verifying clients")
        print(f"  IOs served            {totals['ios']}")
        print(f"  IOs failed            {totals['failed']}")
        print(f"  bytes wrong           {totals['wrong']} (in {totals['content']} IOs)")
        print(f"  retries               {totals['retries']} IOs read from another replica")
        print(f"  failovers             {totals['failovers']} times a server was marked down")
        print(f"  hedges                {totals['hedges']} (won {totals['hedge_wins']})")
        print(f"  corrupt replicas      {totals['corrupt']} found (and not used)")
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
                  f"send timeouts {stats['send_timeouts']}")
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
        if figures["C"][0] is not None and figures["C"][0]["send_timeouts"] == "0":
            self.problems.append("server C never dropped the client that stopped reading")

    def leftovers(self):
        procs = [p for _, p, _, _ in self.clients] + list(self.servers.values()) + self.others
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
    args = parser.parse_args()
    if args.duration < 30:
        parser.error("--duration: at least 30 s (six faults)")
    soak = Soak(args)
    figures = {}
    try:
        soak.setup()
        soak.soak()
        figures = soak.server_figures()
    except Exception as error:  # noqa: BLE001 - any failure is reported, processes still cleaned up
        soak.problems.append(f"the soak itself failed: {error!r}")
    finally:
        soak.stop_servers()
    if figures:
        soak.report(figures)
    soak.leftovers()
    if not args.keep and not soak.problems:
        shutil.rmtree(soak.work, ignore_errors=True)
    if soak.problems:
        print("\nchaos soak: FAILED (work directory kept: " + soak.work + ")")
        for p in soak.problems:
            print("  - " + p)
        return 1
    print("\nchaos soak: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
