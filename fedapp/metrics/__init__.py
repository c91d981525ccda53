"""Metrics computed from what may cross the wire: contingency tables, label-free sums, topic coherence."""
