"""Fault tolerance that needs no checkpoint: hang verdicts (watchdog.py), the NaN/inf guard
(nan_guard.py), the straggler report (straggler.py), the node layout (nodes.py), their flags
(args.py) and the test-only fault hook (inject.py). `session.FaultTolerance` is what the training
loop holds. This package imports nothing at the top: hybrid.comm imports its op trail.
"""
