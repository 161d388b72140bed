"""Workflows on top of the stages: resolving inputs into a plan (``resolve``), deploying and
verifying against the baselines (``deploy``, ``verify``) and refitting a profile from measured runs
(``calibrate``). The CLI and the public API call these; no stage imports them."""
