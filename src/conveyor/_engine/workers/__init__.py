"""Reaching the workers: the ``Workers`` protocol (protocol.py) and its
implementations, inline (inline.py), threads (threads.py) and processes
(pool.py, started by launch.py, running process.py, watched through
poller.py, their stacks in stacks.py)."""
