"""Benchmarks: python -m mooncake_cxl.bench [--quick] [--only ...] [--json FILE] [--compare mooncake]

One module per section, each depending only on `common` (and the product
modules), never on each other; `__main__` is the command line over them:

    common    sizes, values, one client's setup, percentiles, machine line, temp pool
    data      put/get/zero-copy latency beside an interleaved memcpy baseline
    control   master requests over CXL RPC rings against TCP; idle master CPU
    eviction  put throughput at the high watermark; master memory per object
    compare   the same workloads on Mooncake's own store (--compare mooncake)
"""
