"""How a batch crosses between processes: the messages (messages.py) and
their framing on pipes (wire.py), what pickles and how (pickling.py), the
shared-memory slots arrays travel in (slots.py) and how a batch's leaves
are written into them (encoding.py)."""
