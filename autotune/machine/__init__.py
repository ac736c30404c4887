"""The machine a recipe is tuned on: hardware facts and fingerprint, the CPUs this process may use,
memory and its budget, /dev/shm, and page-cache eviction for cold reads.  See docs/architecture.md.
"""
