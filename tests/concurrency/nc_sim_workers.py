"""A client on a simulated host (MC_CXL_SIM_HOST in its environment), run as a
script by test_noncoherent_discipline.py: `python nc_sim_workers.py ADDRESS
OP PREFIX N SIZE TAG`. OP: put (N keys PREFIX0.. with values of TAG), upsert,
get (checks every value is TAG's), batch (get_batch of all), view
(get_buffer of each, bytes checked), exists. Prints one JSON line:
{"ok": n keys right, "bad": [first wrong keys], "rc": [...]}."""
import json
import random
import sys

from mooncake_cxl import MooncakeDistributedStore


def value_for(key, tag, size):
    return random.Random(f"{key}/{tag}").randbytes(size)


def main(address, op, prefix, n, size, tag):
    n, size = int(n), int(size)
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1:0", "P2PHANDSHAKE", 0, 0, "cxl", "", address)
    if rc != 0:
        print(json.dumps({"ok": 0, "bad": [], "rc": [rc], "stage": "setup"}), flush=True)
        return
    keys = [f"{prefix}{i}" for i in range(n)]
    want = [value_for(k, tag, size) for k in keys]
    rcs, good = [], []
    if op in ("put", "upsert"):
        call = s.put if op == "put" else s.upsert
        rcs = [call(k, v) for k, v in zip(keys, want)]
        good = [r == 0 for r in rcs]
    elif op == "get":
        good = [s.get(k) == v for k, v in zip(keys, want)]
    elif op == "batch":
        good = [g == v for g, v in zip(s.get_batch(keys), want)]
    elif op == "view":
        for k, v in zip(keys, want):
            h = s.get_buffer(k)
            good.append(h is not None and bytes(h) == v)
            del h
    else:
        rcs = [s.is_exist(k) for k in keys]
        good = [r == 1 for r in rcs]
    s.close()
    bad = [k for k, g in zip(keys, good) if not g][:5]
    print(json.dumps({"ok": sum(good), "bad": bad, "rc": rcs[:5]}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
