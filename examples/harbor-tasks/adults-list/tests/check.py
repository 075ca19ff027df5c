from pathlib import Path
assert Path("/app/adults.txt").read_text().split("\n") in (["Ann", "Dana", "Zoe", ""], ["Ann", "Dana", "Zoe"])
