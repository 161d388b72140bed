"""Apache TVM as a backend: profiling, the tuning database and RPC, building and tuning libraries,
and the executor."""
