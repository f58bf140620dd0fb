"""conveyor: a data loader for training loops, with torch.utils.data's API."""
