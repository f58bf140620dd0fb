"""The books: the executor (core.py) that dispatches each planned batch to a
worker, collects what comes back, reorders and delivers it; its records
(records.py), the dataset kinds it serves (kinds.py), what it makes of an
answer (results.py), its one failure path's errors (failing.py), the stall
watchdog (watchdog.py) and the pin thread (pin.py)."""
