"""What a worker does with a task: its config and the one load function
(serving.py), where it loads and what that changes (places.py: process,
thread or inline), how user code ends it (ending.py), the dataset's fetcher
(fetch.py) and how a map-style batch's samples are read (reads.py), and where
collate puts them (rows.py)."""
