"""Reaching the workers: the ``Workers`` protocol (protocol.py) and its
implementations, inline (inline.py), threads (threads.py), processes
(pool.py, started by launch.py, running process.py, watched through
poller.py, their stacks in stacks.py) and Ray actors (ray_actors.py);
which one a pass uses is chosen once (choice.py)."""
