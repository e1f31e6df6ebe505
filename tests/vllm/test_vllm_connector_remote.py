"""Our vLLM connector across pods: the producer (prefill) maps the pool, the
consumer (decode) is a remote client (MC_CXL_REMOTE=1 with the secret) of
the pool served over the Transfer Engine. It follows the producer's
announcements over the engine and loads blocks as they are written. Needs the
private network namespace every engine needs (see tests/remote/test_remote.py)
and vLLM (conftest's vllm_python)."""
import oracle
import pytest

from mooncake_cxl.launch import RemoteServedMaster
from test_vllm_connector import consumer_waits_for_announcements, engine_pair

pytestmark = pytest.mark.skipif(oracle.reference_skip_reason() is not None,
                                reason=str(oracle.reference_skip_reason()))


@pytest.fixture(scope="module")
def pd_remote(vllm_python, tmp_path_factory):
    cons_env = {"MC_CXL_REMOTE": "1"}  # and the secret, once the master made it

    def start_master(pool, work):
        cons_env["MC_CXL_AUTH_TOKEN_FILE"] = str(work / "secret")
        return RemoteServedMaster(pool, cons_env["MC_CXL_AUTH_TOKEN_FILE"], pool_size=512 << 20, format=True,
                                  log_path=str(work / "master.log")).start()
    with engine_pair(vllm_python, tmp_path_factory, "vllm_remote", start_master,
                     prod_env={"MC_CXL_REMOTE": "0"}, cons_env=cons_env) as pair:
        yield pair


def test_remote_consumer_loads_blocks_as_a_local_producer_announces_them(pd_remote):
    assert ", remote) attached" in pd_remote["master"].log_tail(1 << 20)  # the consumer
    consumer_waits_for_announcements(pd_remote, True, 3)
