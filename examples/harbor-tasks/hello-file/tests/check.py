from pathlib import Path
assert Path("/app/hello.txt").read_text() == "Hello, rollgym!\n"
