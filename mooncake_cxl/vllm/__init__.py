"""Reserved for the vLLM connector (the PD-disaggregation issue).

What will live here: a KV connector for vLLM's disaggregated prefill/decode,
so that a prefill instance saves a request's KV blocks into the CXL pool and a
decode instance loads them from it, with vLLM's scheduler-side (which blocks
to load or save) and worker-side (the copies) halves. It builds on
mooncake_cxl.kv (blocks and their keys) and never on vLLM internals beyond the
connector interface; importing mooncake_cxl must not require vLLM. Empty
until that issue lands.
"""
