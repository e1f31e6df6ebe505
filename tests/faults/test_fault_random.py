"""Randomized fault test: worker processes put, upsert (one key, or two own
keys with one group id in one call, or batches of tiny values that fill the
index before the data region), remove, get and hold BufferHandles on a pool small enough that eviction runs all the time, while a
seeded driver SIGKILLs and restarts the master (recovery, same pool and port)
and SIGKILLs, SIGSTOPs and SIGCONTs workers, some past --client_ttl and the
put timeouts so that the master reclaims them while they are stopped. Worker
1 has a DRAM segment (MC_CXL_DRAM_SEGMENT=1): its puts spill there past the
pool's watermark, and its death, reclaim or a master restart drops them
(misses; MCXL_FAULT_SEGMENT=0 turns it off); every seed SIGSTOPs it once
past --client_ttl a third into the faults and asserts that the master
dropped its segment (its resumed puts must not bring older values back).
Inside a private network namespace it serves them over the Transfer Engine,
and the other workers' reads of its keys go over TE.
test_random_faults_ha runs it with elected masters (a real etcd): the master
fault there kills the leader and a standby takes over.

What must hold (each is one "invariant" name in the failure message):
  older_value       no read (a worker's own read-your-write check during the
                    run, or the final read of every key) returns a value older
                    than the key's last acknowledged write (tests/faults/fault_workers.py
                    states the model); a miss is always allowed (eviction)
  unknown_value     ... nor a value never written to that key
  torn_or_foreign   no read returns torn bytes or another key's / object's bytes
  view_changed      a live BufferHandle's bytes never change (refusing access
                    with an exception is allowed)
  master_crash      the master never dies by itself and always recovers
  worker_died       a worker never dies unless killed (SIGBUS, abort, exception)
  no_progress_after_faults / worker_hung   after the faults every worker can
                    write again and exits
  space             with no client attached (after the workers exit, and again
                    after a clean restart), the master's allocated bytes equal
                    the sum of the live objects' extents (layout.h ExtentBytes),
                    and its key count equals /get_all_keys; with the SSD tier
                    a disk-resident object counts its stub extent (ObjectHeader
                    + key + DiskStub, kFlagDiskStub in its header) and the stubs
                    found equal mooncake_cxl_tier_objects
  false_corrupt     no entry called corrupt, no tier record failing its checksum
  announce_foreign  each worker produces on and follows its own announcement
                    channel and listens on a second (two names per life, the same
                    names in every tenant): it never reads a record of another
                    tenant, name or slot, and no other tenant's producer holds its name
  announce_exhausted  the master runs with 16 channels, fewer than the names the
                    lives use: those of killed and reclaimed lives are freed, so an
                    open never finds none free

test_random_faults_with_ssd_tier runs the same driver with the master on an
SSD tier (--enable_offload --offload_on_evict --promotion_on_hit, pre-demotion
--offload_ahead_ratio=0.5 (clean copies written ahead of eviction), an 8 MiB tier:
its LRU drops and compaction run too); MCXL_FAULT_SECONDS defaults to 20 there.
Its tier directory is a 16 MiB tmpfs mounted by the test (root only), which
the driver fills to the last byte now and then ("fsfull": another program
takes the disk for 0.5-2.5 s, then frees it); after the final check, one
bit of some tombstone blocks is flipped ("tomb_damage"), a master starts
with --format, and the checker reads again what the rebuild made of them.

test_random_faults_on_simulated_hosts runs it on a --coherence=noncoherent pool
with the master on simulated host 0 and the workers spread over hosts 1..N-1
(MC_CXL_SIM_HOST, coherence_sim.h; the simulator's random write-back and drop
of lines on), master kills only unless MCXL_FAULT_KINDS says more, and one
more invariant:
  sim_checker       the simulator's checker counts no lost update or false
                    sharing on the pool (sim_counters)

test_random_faults_with_a_remote_worker runs it with the pool also served over
the Transfer Engine and the last worker a remote client (needs the private
network namespace of the conformance suite; skipped elsewhere).

Environment (all optional):
  MCXL_FAULT_SEED     seed of the driver's schedule and of each worker's choices
                      (worker seed = f(seed, slot, life)); default random. It is
                      printed at start and in every failure message: rerun with
                      MCXL_FAULT_SEED=<seed> pytest -s tests/faults/test_fault_random.py
  MCXL_FAULT_SECONDS  length of the fault phase (default 30)
  MCXL_FAULT_KINDS    faults to inject, of master,kill,stop,fsfull,tomb_damage (default all; empty =
                      load and eviction only): tells which fault a violation needs
  MCXL_FAULT_WORKERS  worker processes (default 4: the last on TCP, the others on rings)
  MCXL_FAULT_TENANTS  tenants the workers are spread over (default 2: slots of
                      different tenants write the same key names; tenant_leak)
  MCXL_FAULT_RPC      force every worker onto ring or tcp
  MCXL_FAULT_LEASE_MS --default_kv_lease_ttl (default Mooncake's 10000)
  MCXL_FAULT_SIM_HOSTS N >= 2: test_random_faults (or the tier test) on N simulated hosts as above
                      (test_random_faults_on_simulated_hosts: default 4)
Timing differs from run to run, so a seed reproduces the schedule and the
operations, not the interleaving. Logs (one per master incarnation and per
worker life), journals and violations stay in pytest's tmp_path, printed at the
end; each violation names the driver's actions just before it.
"""
import collections
import glob
import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
import urllib.request

import pytest

import oracle
from conftest import fill_fs, http_get as http, metrics, poll, sim_counters
from mooncake_cxl.launch import MasterError, MasterProcess, PoolTEProcess
from mooncake_cxl.launch_ha import HaMasterProcess

POOL = 32 << 20
SLOTS = int(os.environ.get("MCXL_FAULT_WORKERS", "4"))
TENANTS = int(os.environ.get("MCXL_FAULT_TENANTS", "2"))
KEYS_PER_SLOT = 80   # 320 keys of 4-256 KiB (~42 MiB on average): eviction all the time
# And 2000 tiny keys per slot (40-160 B, put in batches): 8000 objects for an
# index of 8192 entries (one per 4 KiB of pool), so eviction for index slots
# (the index's watermark, full probe windows) runs under the faults too.
TINY_PER_SLOT = 2000
CLIENT_TTL = 3
# Short client TTL and put timeouts: a worker stopped for CLIENT_TTL + 2..4 s is
# reclaimed, and its unfinished put revoked and its extent freed, while stopped.
# Mooncake's default lease: readers lease nearly every object, so the objects
# eviction can take are mostly fresh, never-read ones (read-your-writes' case).
MASTER_FLAGS = [f"--client_ttl={CLIENT_TTL}", "--put_start_discard_timeout_sec=2",
                "--put_start_release_timeout_sec=1", "--announce_channels=16",
                "--default_kv_lease_ttl=" + os.environ.get("MCXL_FAULT_LEASE_MS", "10000")]
WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_workers.py")
# The worker whose puts may go to its DRAM segment (-1: none).
SEGMENT_SLOT = 1 if os.environ.get("MCXL_FAULT_SEGMENT", "1") != "0" else -1
# Inside a loopback-only network namespace it serves its segment over the
# Transfer Engine, so the other workers' reads of its keys go over TE (and
# meet its deaths); elsewhere no engine may start: only it reads its segment.
SEGMENT_TE = "1" if oracle.reference_skip_reason() is None else "0"
HEADER_BYTES = 80  # sizeof(ObjectHeader), layout.h
DISK_STUB_BYTES = 56  # sizeof(DiskStub), layout.h: the "value" of a kOnDisk object's stub extent
FLAG_DISK_STUB = 1 << 3  # layout.h kFlagDiskStub (ObjectHeader::flags of a stub)
# Well below the ~20 MiB the workers keep live: the tier's LRU drops and its
# segments (capacity / 8 each, tier_manager.h) get compacted.
TIER_CAPACITY = 8 << 20
TIER_FS = 16 << 20  # the tmpfs the tier lives on: the capacity fits, a filler fills the rest
RECORD_MAGIC = b"MCXR"  # disk_tier_internal.h: a record header's magic, kind (u16) at byte 6
KIND_TOMBSTONE = 2


def extent_bytes(key_len, value_size):
    """layout.h ExtentBytes: what the master allocates for one object."""
    up = lambda v: (v + 63) // 64 * 64
    return up(HEADER_BYTES + key_len) + up(value_size)


class Run:
    """The processes of one run and what went wrong with them."""

    def __init__(self, seed, tmp, pool_path, kinds, extra_flags=(), tier_fs=None, etcd=None, remote=False,
                 sim_hosts=0):
        self.seed = seed
        # sim_hosts >= 2: the master on simulated host 0 of a non-coherent
        # pool, worker slot s on host 1 + s % (sim_hosts - 1).
        self.sim_hosts = sim_hosts
        self.tier_fs = tier_fs  # the tier's own small filesystem (fsfull), or None
        self.fs_full_until = None
        self.etcd = etcd  # set: elected masters (a leader and a standby), clients on etcd://
        self.standby = None
        self.extra_flags = list(extra_flags)
        # remote: the pool is also served over the Transfer Engine and the
        # last worker is a remote client (locate, engine copies, Publish).
        self.remote = remote
        self.te = None
        self.secret = os.path.join(str(tmp), "secret")
        if remote:
            self.extra_flags += ["--pool_te_protocol=tcp", f"--pool_te_session_file={pool_path}.te",
                                 f"--auth_token_file={self.secret}"]
        self.kinds = kinds
        self.tmp = str(tmp)
        self.pool_path = pool_path
        self.rnd = random.Random(f"{seed}/driver")
        self.master = None
        self.port = None
        self.masters = 0
        self.lives = [0] * SLOTS
        self.procs = [None] * SLOTS
        self.logs = [None] * SLOTS
        self.stopped = {}  # slot -> time of its SIGCONT
        # When the DRAM segment's owner is SIGSTOPped past --client_ttl (set
        # by drive where it has a segment): every seed reaches its reclaim.
        self.segment_stop_due = None
        self.long_stops = {}  # slot -> start of its current stop, if it outlasts --client_ttl
        self.problems = []  # (invariant, text)
        self.events = collections.Counter()
        self.schedule = []  # the driver's actions, for the failure message
        self.timeline = []  # (wall time, what, slot or None): to explain violations

    # -- master -----------------------------------------------------------
    def start_master(self, fmt=False):
        if self.etcd is not None:
            return self.start_leader()
        flags = list(MASTER_FLAGS) + self.extra_flags + ([f"--rpc_port={self.port}"] if self.port else [])
        for attempt in range(3):
            m = MasterProcess(self.pool_path, POOL, format=fmt, extra_flags=flags,
                              log_path=os.path.join(self.tmp, f"master{self.masters}.log"))
            self.masters += 1
            try:
                saved = dict(os.environ)
                os.environ.update(self.sim_env(0) or {})  # the master inherits its simulated host
                try:
                    self.master = m.start()
                finally:
                    os.environ.clear()
                    os.environ.update(saved)
                self.port = self.port or m.port
                if self.remote and self.te is None:  # it maps the pool file: outlives masters
                    self.te = PoolTEProcess(self.pool_path, self.pool_path + ".te",
                                            log_path=os.path.join(self.tmp, "pool_te.log")).start()
                return True
            except MasterError as e:
                self.problems.append(("master_crash", f"master start #{self.masters - 1} "
                                      f"(attempt {attempt}) failed: {str(e)[-1500:]}"))
                time.sleep(0.5)
        self.master = None
        return False

    def sim_env(self, host, base=None):
        """The environment of a process on simulated host `host` (None: not a simulated run)."""
        if self.sim_hosts < 2:
            return base
        return dict(base or os.environ, MC_CXL_SIM_HOST=str(host),
                    MC_CXL_SIM_SEED=str(random.Random(f"{self.seed}/sim/{host}/{self.masters}").randrange(1 << 31)))

    def worker_host(self, slot):
        return 1 + slot % (self.sim_hosts - 1) if self.sim_hosts >= 2 else None

    def start_leader(self):
        """HA: the standby (one is started if there is none) becomes the leader
        once elected, and a new standby campaigns behind it."""
        def campaigner():
            m = HaMasterProcess(self.etcd.endpoint, self.pool_path, POOL, extra_flags=MASTER_FLAGS + self.extra_flags,
                                log_path=os.path.join(self.tmp, f"master{self.masters}.log"))
            self.masters += 1
            return m.start()
        try:
            if self.standby is None:
                self.standby = campaigner()
            if not self.standby.wait_ready(60):
                self.problems.append(("master_crash", f"the standby did not take over: "
                                      f"{self.standby.log_tail(1500)}"))
                self.master = None
                return False
            self.master, self.standby = self.standby, None
            self.standby = campaigner()
            return True
        except MasterError as e:
            self.problems.append(("master_crash", f"an elected master did not start: {str(e)[-1500:]}"))
            self.master = None
            return False

    def check_master(self, when):
        if self.standby is not None and self.standby.proc.poll() is not None:
            self.problems.append(("master_crash", f"{when}: the standby exited by itself with "
                                  f"{self.standby.proc.returncode}:\n{self.standby.log_tail(1500)}"))
            self.standby.kill()
            self.standby = None
        if self.master is not None and self.master.proc.poll() is not None:
            self.problems.append(("master_crash", f"{when}: master exited by itself with "
                                  f"{self.master.proc.returncode}; log {self.master.log_path}:\n"
                                  f"{self.master.log_tail(1500)}"))
            self.master.kill()  # reaped: closes its log
            return self.start_master()
        return self.master is not None

    # -- workers ----------------------------------------------------------
    def start_worker(self, slot):
        self.lives[slot] += 1
        life = self.lives[slot]
        args = {"slot": slot, "life": life, "nkeys": KEYS_PER_SLOT, "ntiny": TINY_PER_SLOT, "nslots": SLOTS,
                "ntenants": TENANTS,
                "seed": self.seed,
                "dir": self.tmp, "address": self.etcd.client_address if self.etcd else
                self.master.address if self.master else f"127.0.0.1:{self.port}"}
        rpc = os.environ.get("MCXL_FAULT_RPC") or ("tcp" if slot == SLOTS - 1 else "ring")
        env = dict(os.environ, MC_CXL_RPC=rpc, MC_CXL_RPC_TIMEOUT_MS="2000",
                   MC_CXL_CONNECT_TIMEOUT_MS="1000", MC_CXL_PUT_WAIT_MS="500")
        if self.remote and slot == SLOTS - 1:
            env.update(MC_CXL_REMOTE="1", MC_CXL_AUTH_TOKEN_FILE=self.secret)
        elif slot == SEGMENT_SLOT and self.sim_hosts < 2:  # a non-coherent pool has no segments
            env.update(MC_CXL_DRAM_SEGMENT="1")  # with global_segment_size 16 MiB (fault_workers.py)
        env.update(MC_CXL_SEGMENT_TE=SEGMENT_TE)
        env = self.sim_env(self.worker_host(slot), env)
        log = open(os.path.join(self.tmp, f"worker{slot}.{life}.log"), "ab")
        self.logs[slot] = log
        self.procs[slot] = subprocess.Popen([sys.executable, WORKERS, "worker", json.dumps(args)],
                                            stdout=log, stderr=subprocess.STDOUT, env=env)

    def worker_log(self, slot, life=None, n=1500):
        path = os.path.join(self.tmp, f"worker{slot}.{life or self.lives[slot]}.log")
        try:
            with open(path, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def kill_worker(self, slot):
        p = self.procs[slot]
        if p is not None and p.poll() is None:
            p.kill()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                self.problems.append(("worker_hung", f"worker {slot} did not die within 30 s of SIGKILL"))
        self.stopped.pop(slot, None)
        if self.logs[slot]:
            self.logs[slot].close()
            self.logs[slot] = None

    def check_workers(self, when):
        for slot, p in enumerate(self.procs):
            if p is not None and p.poll() is not None:
                self.problems.append(("worker_died", f"{when}: worker {slot} life {self.lives[slot]} "
                                      f"exited by itself with {p.returncode}:\n{self.worker_log(slot)}"))
                self.kill_worker(slot)
                self.start_worker(slot)

    # -- the tier's filesystem ----------------------------------------------
    def fill_tier_fs(self, now):
        """Another program takes every free byte of the tier's filesystem."""
        fill_fs(os.path.join(self.tier_fs, "filler"))
        dur = self.rnd.uniform(0.5, 2.5)
        self.fs_full_until = now + dur
        self.schedule.append(f"{now:.1f} tier filesystem full for {dur:.1f} s")
        self.timeline.append((time.time(), "tier fs full", None))
        self.events["tier_fs_full"] += 1

    def free_tier_fs(self):
        if self.fs_full_until is not None:
            os.unlink(os.path.join(self.tier_fs, "filler"))
            self.fs_full_until = None
            self.timeline.append((time.time(), "tier fs freed", None))

    def damage_tombstones(self):
        """Flips one bit in up to 8 tombstone blocks of the segment files (the
        master is stopped): the rebuild must not bring back what they hid."""
        blocks = []
        for path in sorted(glob.glob(os.path.join(self.tier_fs, "seg-*.mcxl"))):
            with open(path, "rb") as f:
                data = f.read()
            blocks += [(path, off) for off in range(4096, len(data) - 64, 4096)
                       if data[off:off + 4] == RECORD_MAGIC and struct.unpack_from("<H", data, off + 6)[0] == KIND_TOMBSTONE]
        for path, off in self.rnd.sample(blocks, min(8, len(blocks))):
            at = off + self.rnd.choice([1, 6, 32, 40, 61, 64])  # magic, kind, generation, seq, crc, key
            with open(path, "r+b") as f:
                f.seek(at)
                b = f.read(1)[0]
                f.seek(at)
                f.write(bytes([b ^ (1 << self.rnd.randrange(8))]))
            self.events["tomb_damaged"] += 1
        self.schedule.append(f"damaged {min(8, len(blocks))} of {len(blocks)} tombstone blocks, restart with --format")

    # -- the fault phase ----------------------------------------------------
    def act(self, now):
        if self.fs_full_until is not None and now >= self.fs_full_until:
            self.free_tier_fs()
        elif self.tier_fs and self.fs_full_until is None and "fsfull" in self.kinds and self.rnd.random() < 0.1:
            self.fill_tier_fs(now)
        for slot, t in list(self.stopped.items()):
            if t <= now:
                os.kill(self.procs[slot].pid, signal.SIGCONT)
                self.timeline.append((time.time(), "SIGCONT", slot))
                del self.stopped[slot]
                self.events["sigcont"] += 1
        if (self.segment_stop_due is not None and now >= self.segment_stop_due
                and SEGMENT_SLOT not in self.stopped and len(self.stopped) < 2):
            # The segment owner frozen until the master reclaims it: its
            # objects become misses (DropSegment) while its own puts are in
            # flight; resumed, it re-attaches and must not bring older values back.
            self.segment_stop_due = None
            self.stop_worker(SEGMENT_SLOT, now, self.rnd.uniform(CLIENT_TTL + 2, CLIENT_TTL + 4))
            self.events["segment_owner_sigstop"] += 1
            return
        r = self.rnd.random()
        slot = self.rnd.randrange(SLOTS)
        kind = "master" if r < 0.12 else "kill" if r < 0.32 else "stop" if r < 0.55 else "poll"
        if kind != "poll" and kind not in self.kinds:
            pass  # that kind of fault is switched off (MCXL_FAULT_KINDS)
        elif kind == "master" and any(now - self.long_stops.get(s, -1e9) < CLIENT_TTL + 1.5
                                      for s in self.stopped):
            # A restart clears every client slot, which would spare a stopped
            # worker its reclaim by --client_ttl: keep this master running
            # until the reclaim is due.
            self.events["master_kill_deferred"] += 1
        elif kind == "master" and self.etcd is not None:
            # Kill the leader: the standby takes over, the workers follow it through etcd.
            self.schedule.append(f"{now:.1f} leader SIGKILL")
            self.timeline.append((time.time(), "leader SIGKILL", None))
            self.master.kill()
            self.events["leader_kill"] += 1
            self.start_master()
        elif kind == "master":
            down = self.rnd.uniform(0, 1.5)
            self.schedule.append(f"{now:.1f} master SIGKILL, down {down:.1f} s")
            self.timeline.append((time.time(), "master SIGKILL", None))
            self.master.kill()
            self.events["master_kill"] += 1
            time.sleep(down)
            self.start_master()
        elif kind == "kill":
            self.schedule.append(f"{now:.1f} worker {slot} SIGKILL")
            self.timeline.append((time.time(), "SIGKILL", slot))
            self.kill_worker(slot)
            self.start_worker(slot)
            self.events["worker_kill"] += 1
        elif kind == "stop" and slot not in self.stopped and len(self.stopped) < 2:
            # Short stops, and stops long enough for the master to reclaim the
            # client (--client_ttl) and its unfinished put's extent.
            long = self.rnd.random() < 0.5
            self.stop_worker(slot, now, self.rnd.uniform(CLIENT_TTL + 2, CLIENT_TTL + 4) if long
                             else self.rnd.uniform(0.2, 1.5))
        elif r < 0.65:
            # The monitoring pages walk the index: a crash there would show.
            try:
                http(self.master, "/get_all_keys")
                metrics(self.master)
                self.events["http_poll"] += 1
            except OSError as e:
                self.problems.append(("master_crash", f"{now:.1f}: monitoring request failed: {e!r}"))
        time.sleep(self.rnd.uniform(0.2, 1.0))

    def stop_worker(self, slot, now, dur):
        self.long_stops[slot] = now if dur > CLIENT_TTL else -1e9
        self.schedule.append(f"{now:.1f} worker {slot} SIGSTOP for {dur:.1f} s")
        os.kill(self.procs[slot].pid, signal.SIGSTOP)
        self.timeline.append((time.time(), f"SIGSTOP {dur:.1f} s", slot))
        self.stopped[slot] = now + dur
        self.events["sigstop"] += 1

    def explain(self, v):
        """The driver's actions around a violation (every one: a stalled or
        killed writer of another slot may be the cause): between the view's
        get_buffer and its check, else in the 3 s before it."""
        t1 = v["t"]
        t0 = v["since"] - 3 if "since" in v else t1 - 3
        seen = [f"{what}{'' if s is None else f' w{s}'} at -{t1 - t:.1f}s" for t, what, s in self.timeline
                if t0 <= t <= t1]
        where = (f"held {t1 - v['since']:.1f} s; driver from 3 s before get_buffer to the check" if "since" in v
                 else "driver in the 3 s before")
        return f"({where}: {', '.join(seen) or 'nothing'})"

    def cleanup(self):
        if self.tier_fs:
            self.free_tier_fs()
        for slot, p in enumerate(self.procs):
            if p is not None and p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except OSError:
                    pass
            self.kill_worker(slot)
        for m in (self.master, self.standby):
            if m is not None:
                m.kill()
        if self.te is not None:
            self.te.stop()  # a clean stop removes its session file


def collect_violations(tmp):
    out = []
    for path in sorted(glob.glob(os.path.join(tmp, "violations.*"))):
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line cut by a SIGKILL
    return out


def test_random_faults(pool_path, tmp_path):
    drive(pool_path, tmp_path, default_seconds=30)


def test_random_faults_with_ssd_tier(pool_path, tmp_path):
    """The same driver over the SSD tier: eviction demotes, reads
    of disk-resident keys read records or promote them, removes write
    tombstones, restarts recover kOnDisk entries; the tier's capacity is
    small so its own LRU drops and compaction run too. The invariants are
    the same (a disk read must not return older, torn or foreign bytes
    either); the space check counts a disk-resident object's stub extent."""
    tier = os.path.join(str(tmp_path), "tier")
    os.mkdir(tier, 0o700)  # the master refuses a tier directory other users may enter
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TIER_FS},mode=0700", "tmpfs", tier],
                             capture_output=True).returncode == 0
    if not mounted:
        print("no tmpfs for the tier (needs root): the fsfull phase is off")
    try:
        drive(pool_path, tmp_path, default_seconds=20, tier_dir=tier, tier_fs=mounted, extra_flags=[
            "--enable_offload", "--offload_on_evict", "--promotion_on_hit", f"--root_fs_dir={tier}",
            f"--offload_capacity_bytes={TIER_CAPACITY}", "--offload_ahead_ratio=0.5"])
    finally:
        if mounted:
            subprocess.run(["umount", "-l", tier])


@pytest.mark.skipif(oracle.reference_skip_reason() is not None, reason=str(oracle.reference_skip_reason()))
def test_random_faults_with_a_remote_worker(pool_path, tmp_path):
    """The same driver with the pool also served over the Transfer Engine and
    one worker a remote client: its puts are published by the master
    (kPublish), its reads are located by the master or from its cache and
    re-checked over the engine, it holds and reads an announcement channel
    over the engine (its holds reclaimed with it); the invariants are the same."""
    drive(pool_path, tmp_path, default_seconds=20, remote=True)


# Master kills only, by default: a worker stopped or killed on a simulated
# host leaves dirty lines in its host's copy that reach the pool after the
# master reset or reused what they belong to (docs/architecture.md section 7,
# "Open"); MCXL_FAULT_KINDS=master,kill,stop shows it.
SIM_KINDS = "master"


def test_random_faults_on_simulated_hosts(pool_path, tmp_path):
    """The same driver on a non-coherent pool, the master on simulated host 0
    and the workers on hosts 1-3 with the simulator's random write-back and
    drop of lines: master kills, recovery, re-attach and eviction follow the
    non-coherent discipline (docs/architecture.md section 7), and the
    simulator's checker counts no line written by two hosts."""
    drive(pool_path, tmp_path, default_seconds=15, sim_hosts=int(os.environ.get("MCXL_FAULT_SIM_HOSTS") or 4),
          default_kinds=SIM_KINDS)


def test_random_faults_ha(pool_path, tmp_path, etcd):
    """The same driver with two elected masters (--enable_ha, a real etcd):
    the master fault kills the leader, the standby takes over, a new standby
    campaigns, and the workers follow the leader through their etcd://
    address. The final clean restart is a SIGTERM of the leader (it resigns)."""
    drive(pool_path, tmp_path, default_seconds=20, etcd=etcd)


def drive(pool_path, tmp_path, default_seconds, extra_flags=(), tier_dir=None, tier_fs=False, etcd=None,
          remote=False, sim_hosts=None, default_kinds="master,kill,stop,fsfull,tomb_damage"):
    seed = int(os.environ.get("MCXL_FAULT_SEED") or random.SystemRandom().randrange(1 << 32))
    seconds = float(os.environ.get("MCXL_FAULT_SECONDS", str(default_seconds)))
    kinds = set(filter(None, os.environ.get("MCXL_FAULT_KINDS", default_kinds).split(",")))
    if sim_hosts is None:
        sim_hosts = int(os.environ.get("MCXL_FAULT_SIM_HOSTS") or 0)
    if sim_hosts >= 2:
        extra_flags = ["--coherence=noncoherent", *extra_flags]
    print(f"\nrandomized fault test: MCXL_FAULT_SEED={seed} MCXL_FAULT_SIM_HOSTS={sim_hosts} MCXL_FAULT_SECONDS={seconds:g} "
          f"MCXL_FAULT_KINDS={','.join(sorted(kinds))} flags {list(extra_flags)}; logs in {tmp_path}")
    run = Run(seed, tmp_path, pool_path, kinds, extra_flags, tier_fs=tier_dir if tier_fs else None, etcd=etcd,
              remote=remote, sim_hosts=sim_hosts)
    final = {}
    # Every seed with a segment owner and stops SIGSTOPs it once past --client_ttl.
    segment_stop = 0 <= SEGMENT_SLOT < SLOTS and sim_hosts < 2 and "stop" in kinds and seconds >= 10
    try:
        assert run.start_master(fmt=True), f"seed {seed}: the first master did not start: {run.problems}"
        if segment_stop:
            run.segment_stop_due = seconds / 3
        for slot in range(SLOTS):
            run.start_worker(slot)
        t0 = time.monotonic()
        while (now := time.monotonic() - t0) < seconds:
            run.check_workers(f"{now:.1f}")
            if not run.check_master(f"{now:.1f}"):
                break
            run.act(now)

        # Faults over: everyone runs again, workers finish and exit.
        if run.tier_fs:
            run.free_tier_fs()
        for slot in list(run.stopped):
            os.kill(run.procs[slot].pid, signal.SIGCONT)
        run.stopped.clear()
        run.check_master("end of faults")
        run.check_workers("end of faults")
        open(os.path.join(run.tmp, "stop"), "w").close()
        deadline = time.monotonic() + 60
        for slot, p in enumerate(run.procs):
            try:
                p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                run.problems.append(("worker_hung", f"worker {slot} life {run.lives[slot]} did not exit "
                                     f"within 60 s of the stop:\n{run.worker_log(slot)}"))
                run.kill_worker(slot)
                continue
            if p.returncode != 0:
                run.problems.append(("worker_died", f"worker {slot} life {run.lives[slot]} exited with "
                                     f"{p.returncode} after the stop:\n{run.worker_log(slot)}"))
        run.check_master("after the workers exited")
        if run.master is not None:
            check_space(run, "before the final restart (live accounting)")

        # One more restart, clean (SIGTERM), then the checker reads every key.
        if run.master is not None:
            run.master.stop()
        if run.start_master():
            final = run_checker(run)
            check_space(run, "after the final clean restart (recovered accounting)")
        # With the SSD tier: some tombstone blocks damaged, then the pool
        # formatted, so that every value read comes from the rebuild; the same
        # checker again (a miss is allowed: the rebuild may drop everything).
        if tier_dir is not None and "tomb_damage" in kinds and run.master is not None:
            run.master.stop()
            run.tier_fs = tier_dir
            run.damage_tombstones()
            if run.start_master(fmt=True):
                rebuilt = run_checker(run)
                print(f"after damaged tombstones and --format: {rebuilt.get('hits')} hits, "
                      f"{rebuilt.get('misses')} misses")
                check_space(run, "after damaged tombstones and --format (rebuilt accounting)")
    finally:
        run.cleanup()

    # Nothing in this test writes into the pool behind the store's back: an
    # entry the master calls corrupt is a master bug (it drops good values).
    for name in sorted(os.listdir(run.tmp)):
        if name.startswith("master") and name.endswith(".log"):
            with open(os.path.join(run.tmp, name), errors="replace") as f:
                corrupt = [line for line in f if "is corrupt" in line or "failed its checksum" in line]
            if corrupt:
                run.problems.append(("false_corrupt", f"{name}: {len(corrupt)} entries called corrupt, "
                                     f"first: {corrupt[0].strip()}"))
    if sim_hosts >= 2 and sim_counters(pool_path) != (0, 0, 0):
        conflicts, lost, false_sharing = sim_counters(pool_path)
        run.problems.append(("sim_checker", f"the simulator's checker counted {lost} lost updates and "
                             f"{false_sharing} false sharings ({conflicts} conflicts; the first lines named in "
                             f"the processes' logs, 'checker: host')"))
    violations = collect_violations(run.tmp)
    by_inv = collections.defaultdict(list)
    for v in violations:
        by_inv[v["invariant"]].append(f"[{v['who']}] {v['key']}: {v['why']} {run.explain(v)}")
    for inv, text in run.problems:
        by_inv[inv].append(text)
    results = []
    for path in sorted(glob.glob(os.path.join(run.tmp, "result.*.*"))):
        with open(path) as f:
            results.append((os.path.basename(path), json.load(f)))
    seen = collections.Counter()  # what the masters did, to show the faults took effect
    for path in glob.glob(os.path.join(run.tmp, "master*.log")):
        with open(path, errors="replace") as f:
            for line in f:
                for what in ("heartbeat expired", "revoked unfinished put", "[evict] round", "recovery:",
                             "compacting segment", "tier full", "SSD tier degraded", "damaged blocks: dropped",
                             "index high watermark", "drives eviction", "dropped for index slots"):
                    seen[what] += what in line
                seen["segment dropped"] += "DRAM segment of client slot" in line and "dropped" in line
    summary = (f"seed {seed} ({seconds:g} s of faults): events {dict(run.events)}; master logs {dict(seen)}; "
               f"worker lives {run.lives}; "
               f"final read: {final.get('hits')} hits, {final.get('misses')} misses; logs in {run.tmp}")
    print(summary)
    for name, r in results:
        print(f"  {name}: {r['stats']} failed rcs {r['rcs']}")
    for inv, items in sorted(by_inv.items()):
        final_reads = sum(1 for v in violations if v["invariant"] == inv and v["who"] == "checker")
        print(f"  {inv}: {len(items)} ({final_reads} in the final read)")
        for it in items[:3]:
            print("     ", it[:600])
    assert not by_inv, (
        f"MCXL_FAULT_SEED={seed}: invariants violated: "
        + "; ".join(f"{inv} x{len(items)}" for inv, items in sorted(by_inv.items()))
        + "\n" + "\n".join(f"{inv}: " + "\n    ".join(x[:800] for x in items[:4])
                           for inv, items in sorted(by_inv.items()))
        + f"\n{summary}\ndriver schedule (last 30): {run.schedule[-30:]}")
    assert sum(r["stats"]["ok"] for _, r in results) > 0, f"seed {seed}: no worker op succeeded"
    if segment_stop:  # the forced stop of the segment owner ran and its segment was dropped
        assert run.events["segment_owner_sigstop"] >= 1 and seen["segment dropped"] >= 1, \
            f"seed {seed}: the DRAM segment owner's stop and reclaim were not reached: {summary}"
    assert final.get("hits", 0) > 0, f"seed {seed}: the final read found no key at all: {final}"


def run_checker(run):
    """The checker process reads every key through the current master; its
    result (hits, misses), or {} with the failure in run.problems."""
    args = {"nkeys": KEYS_PER_SLOT, "ntiny": TINY_PER_SLOT, "nslots": SLOTS, "ntenants": TENANTS,
            "dir": run.tmp, "address": run.etcd.client_address if run.etcd else run.master.address}
    with open(os.path.join(run.tmp, "checker.log"), "ab") as log:
        try:
            checker = subprocess.run([sys.executable, WORKERS, "check", json.dumps(args)],
                                     stdout=log, stderr=subprocess.STDOUT, timeout=120,
                                     env=run.sim_env(run.worker_host(SLOTS - 1)))
        except subprocess.TimeoutExpired:
            checker = None
    if checker is None:
        run.problems.append(("worker_hung", "the checker did not finish within 120 s"))
    elif checker.returncode != 0:
        with open(os.path.join(run.tmp, "checker.log"), "rb") as f:
            run.problems.append(("worker_died", "checker failed:\n" + f.read()[-2000:].decode(errors="replace")))
    else:
        with open(os.path.join(run.tmp, "result.check")) as f:
            return json.load(f)
    return {}


def check_space(run, when):
    """With no client attached: allocated bytes == the sum of the live extents."""
    try:
        _check_space(run, when)
    except OSError as e:  # the master hung or died: its monitoring port does not answer
        run.problems.append(("master_crash", f"{when}: monitoring request failed: {e!r}; master log "
                             f"{run.master.log_path}:\n{run.master.log_tail(1500)}"))


def _check_space(run, when):
    m = run.master

    def unsettled():
        """The metrics, and what must reach 0 before space adds up: clients,
        writing, removed_but_viewed and revoked_quarantined objects (revoked
        puts' extents stay quarantined until their writer is known dead; the
        master checks every 0.5 s)."""
        mt = metrics(m)
        objects = lambda state: mt.get(("master_objects", (("state", state),)), 0)
        return mt, (mt["master_client_count"], objects("writing"), objects("removed_but_viewed"),
                    objects("revoked_quarantined"))

    # What is still unsettled past the hang guard is reported below.
    mt, (_, writing, viewed, quarantined) = poll(unsettled, interval=0.5, done=lambda r: not any(r[1]))
    keys = [k for k in http(m, "/get_all_keys?tenant=*").split("\n") if k]  # tenant<TAB>key
    live = stubs = 0
    for line in keys:
        tenant, k = line.split("\t", 1)
        info = json.loads(http(m, "/query_key?key=" + urllib.request.quote(k, safe="") + "&tenant=" +
                               urllib.request.quote(tenant, safe="")))
        # Stored keys carry the tenant's prefix (tenant.h) except the default's.
        stored = len(k.encode()) + (0 if tenant == "default" else len(tenant.encode()) + 2)
        d = info["data"][0]
        if on_disk(run.pool_path, d["offset_"], stored):
            # kOnDisk: the pool holds only its stub (ObjectHeader + key + DiskStub)
            stubs += 1
            live += extent_bytes(stored, DISK_STUB_BYTES)
        else:
            live += extent_bytes(stored, d["size_"])
    alloc = mt["master_allocated_bytes"]
    state = (f"clients {mt['master_client_count']:g}, writing {writing:g}, removed_but_viewed {viewed:g}, "
             f"revoked_quarantined {quarantined:g}, "
             f"master_key_count {mt['master_key_count']:g}, /get_all_keys {len(keys)}")
    if alloc != live:
        run.problems.append(("space", f"{when}: allocated bytes {alloc:.0f} != sum of live extents {live} "
                             f"(difference {alloc - live:+.0f}); {state}"))
    if "mooncake_cxl_tier_objects" in mt and mt["mooncake_cxl_tier_objects"] != stubs:
        run.problems.append(("space", f"{when}: mooncake_cxl_tier_objects {mt['mooncake_cxl_tier_objects']:g} != "
                             f"{stubs} stub extents found; {state}"))
    if mt.get("mooncake_cxl_tier_checksum_failures_total", 0):
        run.problems.append(("false_corrupt", f"{when}: mooncake_cxl_tier_checksum_failures_total "
                             f"{mt['mooncake_cxl_tier_checksum_failures_total']:g} (nothing corrupts the tier)"))
    if mt["master_key_count"] != len(keys):
        run.problems.append(("space", f"{when}: master_key_count {mt['master_key_count']:g} != {len(keys)} keys "
                             f"listed; {state}"))
    print(f"space {when}: allocated {alloc:.0f}, live extents {live} ({stubs} disk stubs); {state}")
    tier = {k[len("mooncake_cxl_tier_"):]: v for k, v in mt.items() if isinstance(k, str)
            and k.startswith("mooncake_cxl_tier_") and k.endswith("_total")}
    if tier:
        # Disk-resident objects the index's pressure dropped (entry and record).
        tier["index_evicted_disk_keys_total"] = mt.get("mooncake_cxl_index_evicted_disk_keys_total", 0)
        print(f"  tier counters of this master: {tier}")


def on_disk(pool_path, offset, stored_key_len):
    """Whether the extent at `offset` (as /query_key reports it) is a stub: its
    ObjectHeader (layout.h: key_len at 64, flags at 68) carries kFlagDiskStub."""
    with open(pool_path, "rb") as f:
        f.seek(offset)
        head = f.read(HEADER_BYTES)
    key_len, flags = struct.unpack_from("<II", head, 64)
    assert key_len == stored_key_len, f"header at {offset}: key_len {key_len} != {stored_key_len}"
    return bool(flags & FLAG_DISK_STUB)
