"""Reserved for the block KV layer (the PD-disaggregation issue).

What will live here: KV-cache blocks as the unit of storage on top of
MooncakeDistributedStore: block keys derived from a token prefix (a chain of
hashes, so that a shared prefix maps to the same blocks), layouts of a block's
per-layer K/V tensors in one object, and batched save/load of a request's
blocks through the zero-copy calls (batch_put_from_multi_buffers,
batch_get_into_multi_buffers, get_buffer views). It depends on the top-level
product modules only (store, errors, sizes); nothing outside this package
depends on it except mooncake_cxl.vllm. Empty until that issue lands.
"""
