"""The offload server: OIP v2 over HTTP (aiohttp behind a hardened front door), its limits and its
compute."""
