"""The user's dataset: the file that declares it, and what is learnt of it before any candidate runs.

``_userfile`` imports ``PATH[:NAME]`` and its hooks; ``_probe`` reads a few samples (cost, size);
``_determinism`` and ``_statefulness`` decide which caches and which persistent workers are safe;
``_fingerprint`` is the dataset's identity.  See docs/architecture.md.
"""
