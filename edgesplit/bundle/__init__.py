"""The bundle format: the manifest and its artifacts, checks, safe reading, signatures, and the
verification verdict it carries."""
