"""The cost bench's reference days (make.py writes them; cost.py replays them)."""
