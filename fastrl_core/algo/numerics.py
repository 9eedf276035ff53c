"""Numerical thresholds the algorithm and the store share. No imports, so the store (NumPy only) reads them without
torch."""

# A group's reward std below this counts as exactly 0: its rewards are equal up to float rounding, so every advantage
# in it is 0 and the group carries no policy gradient (a "zero-variance" group, a decided visit for the budgets).
ZERO_STD = 1e-9
