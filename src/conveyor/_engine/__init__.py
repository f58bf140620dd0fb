"""Private machinery: fetching, worker processes, transport and errors.

Nothing here is public API; the DataLoader in ``conveyor.loader`` drives it.
"""
