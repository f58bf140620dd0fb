"""Private machinery: fetching, worker processes and threads, transport and errors.

Nothing here is public API; the DataLoader in ``conveyor.loader`` drives it.
"""
