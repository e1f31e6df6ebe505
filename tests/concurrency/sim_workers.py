"""A client on a simulated host (MC_CXL_SIM_HOST in its environment), run as a
script by test_noncoherent_sim.py so that its stderr (the simulator's log
lines) can be read: `python sim_workers.py ADDRESS OP KEY [SIZE]`, OP put,
get or exists. Prints one JSON line: {"rc": ..., "ok": ...}."""
import json
import random
import sys

from mooncake_cxl import MooncakeDistributedStore


def value_for(key, size):
    return random.Random(key).randbytes(size)


def main(address, op, key, size="4096"):
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", address)
    if rc != 0:
        print(json.dumps({"rc": rc, "ok": False, "stage": "setup"}), flush=True)
        return
    size = int(size)
    if op == "put":
        rc = s.put(key, value_for(key, size))
        out = {"rc": rc, "ok": rc == 0}
    elif op == "get":
        got = s.get(key)
        out = {"rc": len(got), "ok": got == value_for(key, size)}
    else:
        rc = s.is_exist(key)
        out = {"rc": rc, "ok": rc == 1}
    s.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
