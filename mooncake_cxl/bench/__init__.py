"""Benchmarks: python -m mooncake_cxl.bench [--quick] [--only ...] [--json FILE] [--report [PATH]]
[--compare mooncake]

One module per section, each depending only on the shared modules below (and
the product modules), never on another section; `__main__` is the command
line over them:

    common      sizes, values, one client's setup, percentiles, machine line, CPU placement, temp pool
    reference   Mooncake's master and the loopback-only network namespace its client needs
    report      the performance document (--report): sections rewritten per run, with their provenance
    summary     the headline figures of data, control and eviction beside their same-run baselines

    data        put/get/zero-copy latency beside an interleaved memcpy baseline
    control     master requests over CXL RPC rings against TCP; idle master CPU (with paced)
    eviction    put throughput at the high watermark; master memory per object
    index_fill  small values: put batches from empty to 3x the index (--only index); probe lengths
    tiering     the SSD tier (with tiering_ref: Mooncake's offload in the same run)
    pd_handoff  prefill/decode: the KV hand-off; pd_ttft: TTFT in vLLM
    compare     the same workloads on Mooncake's own store (--compare mooncake)

Probes, each `python -m mooncake_cxl.bench.<name>`, for one question at a time:

    put_probe            4 KiB put and ring ping, client and master pinned apart (A/B of builds)
    put_gap_probe        put latency against the idle gap before it
    tier_remove_latency  remove of disk-resident keys against pool-only keys
"""
