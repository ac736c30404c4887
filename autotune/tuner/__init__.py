"""The search: the space of candidates, what is prepared before the first trial, the Optuna study loop,
the trial runner (one process per trial), the measurement inside a trial and the prediction of the
whole run from it.  See docs/architecture.md.
"""
