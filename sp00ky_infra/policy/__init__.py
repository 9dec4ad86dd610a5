"""Pure decisions: sizing, drain selection, breaker, leases, placement, guardian verdicts.

Nothing here does I/O or reads the clock: every function takes ``now`` as an argument.
"""
