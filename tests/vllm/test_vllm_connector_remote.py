"""Our vLLM connector across pods: the producer (prefill) maps the pool, the
consumer (decode) is a remote client (MC_CXL_REMOTE=1 with the secret) of
the pool served over the Transfer Engine. It finds the stored prefix, follows
the producer's announcements over the engine and loads blocks as they are
written. Needs the private network namespace every engine needs (see
tests/remote/test_remote.py) and vLLM (conftest's vllm_python)."""
import os
import time

import oracle
import pytest

from conftest import open_store
from mooncake_cxl.kv import Listener
from mooncake_cxl.launch import RemoteServedMaster
from test_vllm_connector import BS, CHANNEL, RUN, Engine, build_tiny_model, first_blocks_announced, prompt

pytestmark = pytest.mark.skipif(oracle.reference_skip_reason() is not None,
                                reason=str(oracle.reference_skip_reason()))


@pytest.fixture(scope="module")
def pd_remote(vllm_python, tmp_path_factory):
    work = tmp_path_factory.mktemp("vllm_conn_remote")
    model = str(work / "model")
    build_tiny_model(vllm_python, model)
    pool = f"/dev/shm/mcxl_vllm_remote_{os.getpid()}.pool"
    secret = str(work / "secret")
    master = RemoteServedMaster(pool, secret, pool_size=512 << 20, format=True,
                                log_path=str(work / "master.log")).start()
    pause = str(work / "pause")
    engines, store = [], None
    try:
        prod = Engine(vllm_python, "producer", model, "kv_producer", master.address, str(work),
                      {"MCXL_VLLM_TEST_PAUSE_FILE": pause, "MC_CXL_REMOTE": "0"}, max_batched=128)
        engines.append(prod)
        cons = Engine(vllm_python, "consumer", model, "kv_consumer", master.address, str(work),
                      {"MC_CXL_REMOTE": "1", "MC_CXL_AUTH_TOKEN_FILE": secret})
        engines.append(cons)
        prod.ready()
        cons.ready()
        store = open_store(master.address)
        yield dict(prod=prod, cons=cons, master=master, store=store, pause=pause)
    finally:
        for e in engines:
            e.stop()
        if store is not None:
            store.close()
        master.stop()
        if os.path.exists(pool):
            os.unlink(pool)


def test_remote_consumer_loads_blocks_as_a_local_producer_announces_them(pd_remote):
    prod, cons = pd_remote["prod"], pd_remote["cons"]
    assert ", remote) attached" in pd_remote["master"].log_tail(1 << 20)
    lis = Listener(pd_remote["store"], CHANNEL, from_start=False)
    x = prompt(3, RUN * BS)
    need = RUN - 1
    open(pd_remote["pause"], "w").close()  # the producer stops after its first chunk (4 blocks)
    try:
        prod.send(x, 16)
        first = first_blocks_announced(lis)
        assert first.end < need
        before = len(cons.log())
        cons.send(x, 16, params={"mcxl_async": True})
        time.sleep(2.0)  # the stimulus: the producer stays paused for a while
        assert not cons.has_result(), "the consumer did not wait for the producer"
    finally:
        os.unlink(pd_remote["pause"])
    ref = prod.result()
    got = cons.result()
    assert got["cached"] == need * BS, got  # loaded every block over the engine: nothing recomputed
    assert got["tokens"] == ref["tokens"]
    log = cons.log()[before:]
    assert f"loaded blocks 0..{need} as the producer wrote them" in log, log
    assert "recomput" not in log.lower()
    lis.close()
