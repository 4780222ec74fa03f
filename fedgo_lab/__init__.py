"""The experiment harness over the library (fedgo_flwr): benchmark plans of real runs (bench),
the round-1 budget sweep (sweep), the central-training reference (central), the performance
benchmark (perf), tables and plots from run records (report), the toy example (toy), a local
deployment (deploy, `python -m fedgo_lab.deploy`) and an in-process grid (inprocess).

Not part of the Flower app: the FAB leaves it out and a run never imports it. Run its commands
from the repository root, `python -m fedgo_lab.bench ...`; those that need the repository
find it there, or where `--repo DIR` says.
"""
