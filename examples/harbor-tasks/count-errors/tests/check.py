from pathlib import Path
lines = Path("/app/server.log").read_text().splitlines()
want = sum(1 for line in lines if line.split()[1] == "ERROR")
assert want == 21, want
assert Path("/app/answer.txt").read_text().strip() == str(want)
