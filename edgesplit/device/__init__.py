"""The device: its spec (processors, links, core groups), the spec's schema, what this host is,
how a spec is drafted from a probe, and how a spec's CPU processors are emulated on this host
(thread affinity, duty-cycle throttling)."""
