"""Clients on hosts outside the CXL pod: the master's control path over TCP,
values over Mooncake's Transfer Engine from the process that maps the pool
(mooncake_cxl.pool_te). `MooncakeDistributedStore.setup` switches to it when
the pool cannot be opened here, or with MC_CXL_REMOTE=1."""
