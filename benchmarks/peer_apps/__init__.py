"""Whole-process synth apps of the peer CDK libraries (docs/performance.md, "Synth"): each is run
by ``benchmarks/synth.py --peers-python`` with an interpreter that has the peer installed."""
