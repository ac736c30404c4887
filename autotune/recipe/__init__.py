"""The recipe: the ``autotune.json`` file and its profiles, the factory that turns a profile into a
DataLoader, the process settings (allocator, threads) and their validation by a real run.
See docs/architecture.md.
"""
